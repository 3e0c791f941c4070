"""`doppler-gen tune NAME`: sweep a variant's knobs, validate each candidate, time the valid ones.

The knobs are (a) every integer ``override`` constant of the variant's WGSL, over the powers of two
from 16 up to its default plus the default (never above: the template sizes workgroup arrays from
the default), and (b) every template parameter variants.toml lists under
``[templates.NAME.tunable]`` (the variant is re-rendered with the value). Constraints between
knobs are the family's (``Family.constraints``): a candidate that breaks one is reported
"invalid" with the reason and neither validated nor timed. Constraints a family does not declare
are not guessed: every other combination is enumerated, and one that fails quick validation is
reported "invalid" with the reason instead of being timed. Candidates are
ordered by how far they are from the current configuration (template parameters before
override constants, as the template's author declared those tunable), so that ``--max-candidates``
cuts the most exotic ones first (and only the parameter sets it can reach are rendered:
``nearest_candidates``), and the report says when it cut. ``--time-limit`` cuts the same
way by the clock: no candidate starts once the limit has passed (the current configuration always
runs), so a sweep packed into a bounded GPU session still ends with its table, its winner among
the candidates it ran and, with ``--write``, their winner recorded.

``--write`` records the winner in variants.toml by editing the text of the variant's entry (its
``params = { ... }`` and ``overrides = { ... }`` inline tables), so comments and layout survive;
the result is re-loaded to prove it parses and means what was intended, then generated/ is
regenerated so ``doppler-gen check`` stays clean. All of it runs under the generate lock, with
Ctrl-C held over the two writes, and only the kernel that was validated is written
(``_refuse_unvalidated``). A winner must pass the full matrix; one that fails it gives way to the
next fastest (``_settle_winner``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from doppler_gen.config import (
    CONFIG_NAME,
    ParamValue,
    Project,
    Variant,
    parse_project,
    read_config,
    universal_newlines,
)
from doppler_gen.config_edit import edit_variant_entry
from doppler_gen.errors import ConfigError, DopplerGenError
from doppler_gen.families import get_family
from doppler_gen.families.base import Shape
from doppler_gen.interrupts import deferred_signals
from doppler_gen.manifest import (
    check_metadata,
    override_problem,
    parse_kernel,
    sizing_names,
    variant_entry,
)
from doppler_gen.render import SOURCE_HASH_LINE, RenderedKernel, Renderer
from doppler_gen.runtime.measure import (
    BenchRow,
    Settings,
    cpu_warning,
    measure_on_fresh_device,
)
from doppler_gen.runtime.runner import KernelRunner
from doppler_gen.runtime.session import Progress, choose_adapter, open_device
from doppler_gen.runtime.verify import validate_variant
from doppler_gen.shapes import parse_shape
from doppler_gen.shipped import load_committed
from doppler_gen.state import generate_lock
from doppler_gen.text_table import format_table

MIN_SWEEP_VALUE = 16
INTEGER_TYPES = ("u32", "i32")

# -- candidates (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One configuration: the tunable template parameters and every integer override constant."""

    params: Mapping[str, ParamValue]  # full assignment of the tunable template parameters
    constants: Mapping[str, int]  # full assignment of the swept override constants
    defaults: Mapping[str, int]  # the override defaults of this candidate's rendering
    error: str = ""  # why the template refused these parameters (then constants are empty)
    kernel: str = ""  # kernel_digest of its rendering (parameters left out); "" when unknown

    @property
    def key(self) -> tuple[tuple[tuple[str, Any], ...], tuple[tuple[str, int], ...]]:
        return tuple(sorted(self.params.items())), tuple(sorted(self.constants.items()))

    def overrides_to_record(self) -> dict[str, int]:
        """The pipeline constants a variant needs to reproduce this candidate (non-defaults)."""
        return {k: v for k, v in sorted(self.constants.items()) if v != self.defaults.get(k)}

    def changes(self, current: Candidate) -> dict[str, Any]:
        """Knobs set differently from ``current``: parameters, then constants vs what this
        rendering holds over from ``current`` (``held_constants``)."""
        changed: dict[str, Any] = {
            k: v for k, v in self.params.items() if current.params.get(k) != v
        }
        baseline = held_constants(self.defaults, current)
        changed.update({k: v for k, v in sorted(self.constants.items()) if baseline.get(k) != v})
        return changed

    def label(self, current: Candidate) -> str:
        changes = self.changes(current)
        return " ".join(f"{k}={v}" for k, v in changes.items()) if changes else "current"


def held_constants(defaults: Mapping[str, int], current: Candidate) -> dict[str, int]:
    """The override constants a rendering with these ``defaults`` keeps from ``current``.

    A constant whose default the parameters leave as it is keeps the current configuration's
    value (a variant's recorded override included), so that "one parameter changed" measures
    that parameter alone and not also a recorded override quietly dropped (a tiered split
    kernel's 128-invocation reduce fell back to 1024 in every parameter candidate, which
    added 1.5-2 µs to each). A constant whose default the parameters move (a workgroup size
    that follows ``block_size``, a reduce width capped by ``reduce_workgroup_size``) takes the
    new default.
    """
    return {
        name: current.constants[name]
        if name in current.constants and current.defaults.get(name) == default
        else default
        for name, default in defaults.items()
    }


def override_sweep(entry: Mapping[str, Any]) -> dict[str, list[int]]:
    """Per integer override constant of ``entry``: powers of two 16..default, plus the default."""
    sweep: dict[str, list[int]] = {}
    for override in all_overrides(entry):
        default = override["default"]
        if (
            override["type"] not in INTEGER_TYPES
            or isinstance(default, bool)
            or not isinstance(default, int)
        ):
            continue
        powers = {
            1 << k for k in range(MIN_SWEEP_VALUE.bit_length() - 1, 32) if (1 << k) <= default
        }
        sweep[override["name"]] = sorted(powers | {default})
    return sweep


EntryFor = Callable[[dict[str, ParamValue]], Mapping[str, Any]]


Space = Mapping[str, tuple[ParamValue, ...]]


def enumerate_candidates(
    current_params: Mapping[str, ParamValue],
    current_overrides: Mapping[str, float],
    tunable: Mapping[str, tuple[ParamValue, ...]],
    entry_for: EntryFor,
    space: Space | None = None,
) -> list[Candidate]:
    """All candidates, the current configuration first, then by distance from it; a candidate
    whose kernel and constants a closer one already has is left out (``_distinct_kernels``).

    ``entry_for(params)`` is the manifest entry of the variant rendered with ``params`` (raising
    DopplerGenError when the template refuses them); it is the only link to rendering, so the
    enumeration is testable with synthetic entries. ``space`` (``--space``) narrows the sweep to
    the knobs it names, over the values it gives; every other knob keeps its current value
    (an override constant whose default the parameters move takes the new default:
    ``held_constants``).
    """
    return nearest_candidates(
        current_params, current_overrides, tunable, entry_for, space
    ).candidates


@dataclass(frozen=True)
class Enumeration:
    """The nearest candidates, and how much of the parameter grid was rendered to find them."""

    candidates: list[Candidate]  # current first, then by distance (enumerate_candidates)
    parameter_sets: int  # in the whole grid
    rendered: int  # parameter sets rendered: all of them when ``complete``
    depth: int  # every parameter set changing at most this many parameters was rendered

    @property
    def complete(self) -> bool:
        return self.rendered == self.parameter_sets


def nearest_candidates(
    current_params: Mapping[str, ParamValue],
    current_overrides: Mapping[str, float],
    tunable: Mapping[str, tuple[ParamValue, ...]],
    entry_for: EntryFor,
    space: Space | None = None,
    limit: int | None = None,
) -> Enumeration:
    """The first ``limit`` candidates of ``enumerate_candidates`` (all without a limit),
    rendering only the parameter sets they can come from.

    A candidate's distance counts its changed parameters, so one from a parameter set that
    changes k parameters is never nearer than k: after every set within k changes is rendered,
    the candidates within distance k are final, in their final order. A template with tens of
    thousands of parameter sets (the prefill's) is therefore rendered only as deep as
    ``--max-candidates`` needs, not whole before the first candidate runs.
    """
    if space is not None:
        tunable = {name: tuple(space.get(name, ())) for name in tunable}
    layers = param_layers(tunable, current_params)
    total = param_grid_size(tunable, current_params)
    first = next(layers)
    current = _current(first[0][1], current_overrides, entry_for)
    found: dict[Any, tuple[int, int, Candidate]] = {current.key: (0, 0, current)}
    rendered, depth, ranked = 0, 0, [current]
    for depth, layer in enumerate(itertools.chain([first], layers)):
        for position, params in layer:
            rendered += 1
            made = _candidates_for(params, entry_for, space, current)
            for order, candidate in enumerate(made):
                found.setdefault(candidate.key, (position, order, candidate))
        ordered = sorted(found.values(), key=lambda f: (_rank(f[2], current), f[0], f[1]))
        ranked = _distinct_kernels([candidate for _, _, candidate in ordered])
        final = [c for c in ranked if _rank(c, current)[1] <= depth]
        if limit is not None and len(final) >= limit and rendered < total:
            return Enumeration(final, total, rendered, depth)
    return Enumeration(ranked, total, rendered, depth)


def _choice_lists(
    tunable: Mapping[str, tuple[ParamValue, ...]], current: Mapping[str, ParamValue]
) -> tuple[list[str], list[list[ParamValue]]]:
    """The tunable parameters (sorted) and each one's values, its current value first, without
    repeats: the grid is their product, the current combination first."""
    names = sorted(tunable)
    return names, [list(dict.fromkeys([current[n], *tunable[n]])) for n in names]


def param_grid_size(
    tunable: Mapping[str, tuple[ParamValue, ...]], current: Mapping[str, ParamValue]
) -> int:
    """How many parameter sets the grid holds (without building it)."""
    return math.prod(len(values) for values in _choice_lists(tunable, current)[1])


def param_layers(
    tunable: Mapping[str, tuple[ParamValue, ...]], current: Mapping[str, ParamValue]
) -> Iterator[list[tuple[int, dict[str, ParamValue]]]]:
    """The grid's parameter sets by how many parameters they change (0, 1, 2, ...), each with
    its position in the grid's product order, in that order within a layer."""
    names, choices = _choice_lists(tunable, current)
    sizes = [len(c) for c in choices]
    for changed in range(len(names) + 1):
        layer = []
        for positions in itertools.combinations(range(len(names)), changed):
            for picks in itertools.product(*(range(1, sizes[p]) for p in positions)):
                index = [0] * len(names)
                for position, pick in zip(positions, picks, strict=True):
                    index[position] = pick
                place = 0
                for size, pick in zip(sizes, index, strict=True):  # the product's order
                    place = place * size + pick
                params = {n: choices[i][index[i]] for i, n in enumerate(names)}
                layer.append((place, params))
        if not layer:
            return
        yield sorted(layer, key=lambda item: item[0])


def _distinct_kernels(ranked: list[Candidate]) -> list[Candidate]:
    """``ranked`` without the candidates whose WGSL and constants a closer candidate already has.

    A knob the variant's rendering ignores (``unrolled_shuffles`` in a kernel without subgroup
    shuffles) would otherwise time the same kernel again and crowd ``--max-candidates`` with
    copies of the current configuration.
    """
    seen: set[tuple[str, tuple[tuple[str, int], ...]]] = set()
    distinct = []
    for candidate in ranked:
        if candidate.kernel:
            same = (candidate.kernel, tuple(sorted(candidate.constants.items())))
            if same in seen:
                continue
            seen.add(same)
        distinct.append(candidate)
    return distinct


def _entry_digest(entry: Mapping[str, Any]) -> str:
    """The digest of the WGSL a candidate's entry describes (CandidateRenderer.entry adds it);
    "" when there is none, and then the candidate is never merged with another."""
    return str(entry.get("kernel_digest") or "")


def kernel_digest(kernel: RenderedKernel) -> str:
    """sha256 of every pass's WGSL without its `source-hash` header line, which hashes the
    parameters too: two parameter sets that render the same code get the same digest."""
    digest = hashlib.sha256()
    for rendered in kernel.passes:
        lines = rendered.text.splitlines(keepends=True)
        digest.update("".join(ln for ln in lines if not ln.startswith(SOURCE_HASH_LINE)).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _current(
    params: dict[str, ParamValue], overrides: Mapping[str, float], entry_for: EntryFor
) -> Candidate:
    entry = entry_for(params)
    defaults = _defaults(entry)
    constants = {k: int(overrides.get(k, v)) for k, v in defaults.items()}
    return Candidate(params, constants, defaults, kernel=_entry_digest(entry))


def _candidates_for(
    params: dict[str, ParamValue],
    entry_for: EntryFor,
    space: Space | None = None,
    current: Candidate | None = None,
) -> list[Candidate]:
    try:
        entry = entry_for(params)
    except DopplerGenError as error:
        return [Candidate(params, {}, {}, error=str(error))]
    sweep, defaults = override_sweep(entry), _defaults(entry)
    held = held_constants(defaults, current) if current is not None else defaults
    if space is not None:  # named constants over their values, the others as they are
        sweep = {
            name: [int(v) for v in space[name]] if name in space else [held[name]] for name in sweep
        }
    else:  # a held value off the powers of two (a recorded 100) is a candidate too
        sweep = {name: sorted({*values, held[name]}) for name, values in sweep.items()}
    names = sorted(sweep)
    kernel = _entry_digest(entry)
    return [
        Candidate(params, dict(zip(names, values, strict=True)), defaults, kernel=kernel)
        for values in itertools.product(*(sweep[n] for n in names))
    ]


def _defaults(entry: Mapping[str, Any]) -> dict[str, int]:
    """The default of every swept override constant of ``entry``."""
    sweep = override_sweep(entry)
    return {o["name"]: int(o["default"]) for o in all_overrides(entry) if o["name"] in sweep}


def all_overrides(entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The override declarations of every pass (a name declared twice counted once)."""
    passes = entry.get("passes") or [entry]
    found: dict[str, Mapping[str, Any]] = {}
    for record in passes:
        for override in record["overrides"]:
            found.setdefault(override["name"], override)
    return [found[name] for name in sorted(found)]


def _rank(candidate: Candidate, current: Candidate) -> tuple[int, int, int]:
    """(not current, knobs changed, constants changed): parameter-only changes come first."""
    if candidate.key == current.key:
        return (0, 0, 0)
    changed_params = sum(current.params.get(k) != v for k, v in candidate.params.items())
    baseline = held_constants(candidate.defaults, current)
    changed_constants = sum(baseline.get(k) != v for k, v in candidate.constants.items())
    return (1, changed_params + changed_constants, changed_constants)


# -- the run ------------------------------------------------------------------------------------


@dataclass
class CandidateResult:
    """One candidate's fate: invalid (template or validation), skipped, n/a, failed, or timed."""

    candidate: Candidate
    label: str
    validation: str  # PASS | FAIL | SKIP | invalid
    reason: str = ""
    row: BenchRow | None = None
    contract: str = ""  # host metadata this candidate changes (max_head_dim 256->64, ...)

    @property
    def timed(self) -> bool:
        return self.row is not None and self.row.timing is not None

    @property
    def median_ns(self) -> float | None:
        return self.row.timing.median_ns if self.row and self.row.timing else None

    def outcome(self) -> str:
        """One line: the median and p10-p90 when timed, else the validation and its reason."""
        timing = self.row.timing if self.row else None
        if timing is not None:
            return f"{self.validation}, {timing.median_ns / 1e3:.1f} µs ({timing.spread_text()})"
        return f"{self.validation}: {self.reason}" if self.reason else self.validation

    def as_dict(self, current_ns: float | None) -> dict[str, Any]:
        median = self.median_ns
        return {
            "candidate": self.label,
            "params": dict(self.candidate.params),
            "constants": dict(self.candidate.constants),
            "overrides_to_record": self.candidate.overrides_to_record(),
            "validation": self.validation,
            "reason": self.reason,
            "contract_changes": self.contract,
            "timing": self.row.timing.as_dict() if self.row and self.row.timing else None,
            "vs_current": round(median / current_ns, 4) if median and current_ns else None,
        }


@dataclass
class TuneRun:
    """A tune run: the candidates in order, which won, and what --write changed."""

    variant: str
    shape: str
    adapter: str
    is_cpu: bool
    settings: Settings
    results: list[CandidateResult]
    total: int  # candidates enumerated before the cap (at least this many when not complete)
    max_candidates: int
    written: dict[str, Any] | None = None
    winner_full_validation: str = ""  # PASS when a winner other than the current one passed it
    time_limit: float | None = None  # --time-limit, seconds
    elapsed: float = 0.0  # seconds from the first candidate's start to the last one's end
    parameter_sets: int = 1  # template parameter sets in the grid
    rendered_sets: int = 1  # of them rendered to find the candidates (nearest_candidates)
    depth: int = 0  # every parameter set changing at most this many parameters was rendered
    # without --shape: the family's default shapes the current configuration cannot run, each
    # with its reason (the tune shape is the first one after them it can)
    passed_over: tuple[str, ...] = ()

    @property
    def planned(self) -> int:
        """Candidates kept after --max-candidates: what the run meant to measure."""
        return min(self.total, self.max_candidates)

    @property
    def complete(self) -> bool:
        """Whether every parameter set was rendered, so that ``total`` is exact."""
        return self.rendered_sets >= self.parameter_sets

    @property
    def capped(self) -> bool:
        return self.total > self.max_candidates or not self.complete

    @property
    def time_cut(self) -> bool:
        """True when --time-limit stopped the run before every kept candidate ran."""
        return self.time_limit is not None and len(self.results) < self.planned

    @property
    def current(self) -> CandidateResult:
        return self.results[0]

    @property
    def winner(self) -> CandidateResult | None:
        """The fastest validated candidate, if it beats the current configuration beyond noise.

        A candidate whose median is not below the current configuration's p10 is within the
        current one's run-to-run spread and is left out; among the rest, the simplest within
        the fastest one's spread wins (the current configuration when none is left).
        """
        timed = [r for r in self.results if r.timed and r.validation == "PASS"]
        if not timed:
            return None
        current = self.current
        if current in timed and current.row is not None and current.row.timing is not None:
            # only a candidate below the current p10 beats it; the others are its noise (held
            # to the p10 before the simplest is picked, so a simpler candidate inside the
            # current spread cannot hide a faster one beyond it)
            floor = current.row.timing.percentile_ns(10)
            timed = [r for r in timed if r is current or (r.median_ns or 0.0) < floor]
        fastest = min(timed, key=lambda r: r.median_ns or 0.0)
        # candidates run in order of fewest changes: among those within the fastest one's
        # spread (median <= its p90), the simplest wins, so a no-op knob never rides along
        spread = fastest.row.timing.percentile_ns(90) if fastest.row and fastest.row.timing else 0.0
        return next(
            r for r in timed if (r.median_ns or 0.0) <= max(spread, fastest.median_ns or 0.0)
        )

    def as_dict(self) -> dict[str, Any]:
        current_ns = self.current.median_ns
        winner = self.winner
        return {
            "tool": "doppler-gen tune",
            "variant": self.variant,
            "shape": self.shape,
            "default_shapes_passed_over": list(self.passed_over),
            "adapter": self.adapter,
            "cpu_adapter": self.is_cpu,
            "warning": cpu_warning(self.adapter) if self.is_cpu else None,
            "settings": {
                "repeats": self.settings.repeats,
                "warmup": self.settings.warmup,
                "warmup_ms": self.settings.warmup_ms,
                "seed": self.settings.seed,
            },
            "candidates_total": self.total,
            "candidates_total_exact": self.complete,
            "parameter_sets": self.parameter_sets,
            "parameter_sets_rendered": self.rendered_sets,
            "candidates_run": len(self.results),
            "capped": self.capped,
            "max_candidates": self.max_candidates,
            "time_limit_s": self.time_limit,
            "time_cut": self.time_cut,
            "elapsed_s": round(self.elapsed, 1),
            "candidates": [r.as_dict(current_ns) for r in self.results],
            "winner": winner.as_dict(current_ns) if winner else None,
            "winner_full_validation": self.winner_full_validation or None,
            "written": self.written,
        }


@dataclass(frozen=True)
class TuneRequest:
    """The CLI's tune options (minus output formatting)."""

    name: str
    shape: Shape | None = None
    backend: str = "wgpu"
    adapter: str | None = None
    limits: str = "adapter"
    allow_cpu: bool = False
    max_candidates: int = 32
    time_limit: float | None = None  # seconds after which no further candidate starts
    settings: Settings = field(default_factory=Settings)
    space: tuple[str, ...] = ()  # --space NAME=V1,V2,...: sweep only these knobs
    from_templates: bool = False  # the current configuration from a fresh render, not generated/


class CandidateRenderer:
    """Renders a variant with candidate template parameters, once per parameter set."""

    def __init__(
        self,
        project: Project,
        variant: Variant,
        committed: tuple[RenderedKernel, dict[str, Any]] | None = None,
    ) -> None:
        self.variant = variant
        self.renderer = Renderer(project)
        self._cache: dict[Any, tuple[RenderedKernel, dict[str, Any]]] = {}
        if committed is not None:  # the current parameters run the committed kernel (shipped)
            own = {k: v for k, v in variant.params.items() if k in variant.template.tunable}
            self._cache[tuple(sorted(own.items()))] = committed

    def render(self, params: Mapping[str, ParamValue]) -> tuple[RenderedKernel, dict[str, Any]]:
        """The kernel and manifest entry; the variant's own overrides are dropped (the candidate
        sets every constant itself)."""
        key = tuple(sorted(params.items()))
        if key not in self._cache:
            candidate = replace(
                self.variant, params={**self.variant.params, **params}, overrides={}
            )
            kernel = self.renderer.render(candidate, with_origins=True)
            module = parse_kernel(kernel)
            check_metadata(candidate, module)
            self._cache[key] = (kernel, variant_entry(kernel, module))
        return self._cache[key]

    def entry(self, params: dict[str, ParamValue]) -> Mapping[str, Any]:
        """The manifest entry, plus ``kernel_digest`` (see ``kernel_digest``) for the
        enumeration to merge parameter sets that render the same kernel."""
        kernel, entry = self.render(params)
        return {**entry, "kernel_digest": kernel_digest(kernel)}


def parse_space(texts: tuple[str, ...], variant: Variant, renderer: CandidateRenderer) -> Space:
    """``--space NAME=V1,V2,...`` options as {knob: values}, typed like the knob.

    NAME is a tunable template parameter (values read as its declared values' type: true/false,
    integers or words) or an integer override constant of the variant's kernel.
    """
    tunable = variant.template.tunable
    current = {k: v for k, v in variant.params.items() if k in tunable}
    entry = renderer.entry(current)
    declared = {o["name"]: o for o in all_overrides(entry)}
    overrides = set(declared)
    space: dict[str, tuple[ParamValue, ...]] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        name = name.strip()
        if not sep or not values.strip():
            raise DopplerGenError(f"--space {text!r}: expected NAME=V1,V2,...")
        if name not in tunable and name not in overrides:
            known = ", ".join(sorted({*tunable, *overrides})) or "none"
            raise DopplerGenError(
                f"--space {text!r}: {name} is neither a tunable parameter of template "
                f"{variant.template.name} nor an override constant of {variant.name} "
                f"(knobs: {known})"
            )
        kind = type(tunable[name][0]) if tunable.get(name) else int
        space[name] = tuple(_space_value(text, item.strip(), kind) for item in values.split(","))
        _check_space_values(text, name, space[name], variant)
        if name in declared and name not in tunable:
            _check_override_values(text, declared[name], space[name], _sizing_names(entry))
    return space


def _sizing_names(entry: Mapping[str, Any]) -> set[str]:
    """``sizing_names`` of every pass of a manifest entry."""
    records = entry.get("passes") or [entry]
    return sizing_names(
        (str(record.get("dispatch") or "") for record in records),
        (str(size) for record in records for size in record.get("workgroup_size", ())),
    )


def _check_override_values(
    text: str, override: Mapping[str, Any], values: tuple[ParamValue, ...], sizing: set[str]
) -> None:
    """An override's --space values must be what variants.toml's `overrides` would accept (in
    its WGSL type's range; at least 1 where it sizes a workgroup or dispatch): 0 or 2**32 went
    on to compile and run. A value the family's constraints refuse (WORKGROUP_SIZE 7 for 8-lane
    key groups) is still a candidate, listed as invalid."""
    name = override["name"]
    for value in values:
        problem = override_problem(override["type"], value, size=name in sizing)
        if problem:
            raise DopplerGenError(f"--space {text!r}: {name} = {value!r}: {problem}")


def _check_space_values(
    text: str, name: str, values: tuple[ParamValue, ...], variant: Variant
) -> None:
    """A template parameter's --space values must be what variants.toml would accept for it
    (among its declared ``choices``; an integer parameter positive): else one is validated and
    timed, then refused by --write at the end, or, where the template does not check it,
    recorded."""
    if name not in variant.template.params:
        return  # an override constant: the family's constraints judge it per candidate
    allowed = variant.template.choices.get(name)
    for value in values:
        if allowed is not None and value not in allowed:
            raise DopplerGenError(
                f"--space {text!r}: {value!r} is not one of the choices of {name} in template "
                f"{variant.template.name} ({', '.join(repr(a) for a in allowed)})"
            )
        if type(value) is int and value <= 0:
            raise DopplerGenError(f"--space {text!r}: {name} must be a positive integer")


def _space_value(text: str, item: str, kind: type) -> ParamValue:
    if kind is bool:
        if item.lower() not in ("true", "false"):
            raise DopplerGenError(f"--space {text!r}: {item!r} is not true or false")
        return item.lower() == "true"
    if kind in (int, float):
        try:
            return kind(item)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise DopplerGenError(f"--space {text!r}: {item!r} is not {what}") from None
    return item


def default_shape(family: str, runner: KernelRunner, seed: int) -> tuple[Shape, tuple[str, ...]]:
    """The first of the family's default bench shapes that ``runner`` (the current
    configuration on the tune device) can run, and why each one before it was passed over.

    The tiled family's first default is the 2048-query prefill; a decode kernel's split-KV
    reduce would need query_len * num_heads = 65,536 workgroups there, past the device's
    limit, so every candidate would be refused and none timed. Where no default can run, the
    first is kept and each candidate says why."""
    defaults = get_family(family).default_shapes
    if not defaults:
        raise DopplerGenError(f"family {family} has no bench shape; tune needs one (--shape)")
    passed_over: list[str] = []
    for text in defaults:
        shape = parse_shape(text)
        reason = runner.unrunnable(shape.case_spec(seed))
        if reason is None:
            return shape, tuple(passed_over)
        passed_over.append(f"{shape.label} ({reason})")
    return parse_shape(defaults[0]), tuple(passed_over)


def run_tune(project: Project, request: TuneRequest, progress: Progress | None = None) -> TuneRun:
    """Enumerate, cap, then validate and time each candidate on one device."""
    from doppler_gen.backends import get_backend

    variant = project.variant(request.name)
    shape = request.shape
    if shape is not None and shape.family != variant.template.family:
        raise DopplerGenError(
            f"--shape {shape.label!r} is for {shape.family} kernels; {variant.name} is "
            f"{variant.template.family}"
        )
    committed = None
    if not request.from_templates:  # stale generated/ exits 1 before anything runs
        kernels, entries = load_committed(project, (variant.name,))
        committed = (kernels[0], entries[0])
    renderer = CandidateRenderer(project, variant, committed)
    space = parse_space(request.space, variant, renderer) if request.space else None
    enumeration = nearest_candidates(
        variant.params,
        variant.overrides,
        variant.template.tunable,
        renderer.entry,
        space,
        limit=request.max_candidates,
    )
    kept = enumeration.candidates[: request.max_candidates]
    backend = get_backend(request.backend)
    adapter = choose_adapter(backend, request.adapter, request.allow_cpu, "tune")
    current_kernel, current_entry = renderer.render(kept[0].params)
    baseline = current_entry["metadata"]
    device = open_device(
        backend, adapter, current_kernel.variant.requires, request.limits, timing=True
    )
    results: list[CandidateResult] = []

    def opener() -> Any:  # each timing on its own device: see measure_on_fresh_device
        return open_device(
            backend, adapter, current_kernel.variant.requires, request.limits, timing=True
        )

    passed_over: tuple[str, ...] = ()
    started = time.monotonic()
    try:
        if shape is None:
            runner = KernelRunner(device, current_kernel, current_entry)
            shape, passed_over = default_shape(
                variant.template.family, runner, request.settings.seed
            )
            if progress:
                for line in passed_over:
                    progress(f"default shape {line}: not used", 0)
        for index, candidate in enumerate(kept, start=1):
            if index > 1 and _out_of_time(started, request.time_limit):
                break
            label = candidate.label(kept[0])
            if progress:
                progress(f"[{index}/{len(kept)}] {label}", 0)
            result = evaluate(
                device, renderer, candidate, label, shape, request.settings, baseline, opener
            )
            results.append(result)
            if progress:  # each result as it comes, so a run cut short still reports it
                progress(f"[{index}/{len(kept)}] {label}: {result.outcome()}", 0)
        run = TuneRun(
            variant.name,
            shape.label,
            adapter.describe(),
            adapter.is_cpu,
            request.settings,
            results,
            len(enumeration.candidates),
            request.max_candidates,
            time_limit=request.time_limit,
            elapsed=time.monotonic() - started,
            parameter_sets=enumeration.parameter_sets,
            rendered_sets=enumeration.rendered,
            depth=enumeration.depth,
            passed_over=passed_over,
        )
        run.winner_full_validation = _settle_winner(device, renderer, run, request.settings)
    finally:
        device.close()
    return run


def _out_of_time(started: float, limit: float | None) -> bool:
    """Whether ``limit`` seconds have passed since ``started`` (never, without a limit)."""
    return limit is not None and time.monotonic() - started >= limit


def _settle_winner(
    device: Any, renderer: CandidateRenderer, run: TuneRun, settings: Settings
) -> str:
    """Candidates were screened with the quick matrix; the winner must pass the full one. One
    that fails it is marked FAIL with the failing case, and the next fastest takes its place
    (again on the full matrix), so a wrong kernel is never reported, or recorded, as the winner.
    Returns "PASS" for a winner other than the current configuration, else ""."""
    while (winner := run.winner) is not None and winner is not run.current:
        verdict = _full_validation(device, renderer, winner.candidate, settings)
        if verdict == "PASS":
            return verdict
        winner.validation = "FAIL"
        winner.reason = f"full validation matrix: {verdict}"
    return ""


def _full_validation(
    device: Any, renderer: CandidateRenderer, candidate: Candidate, settings: Settings
) -> str:
    """PASS, or the status and the first line of why the full matrix failed."""
    kernel, entry = renderer.render(candidate.params)
    report = validate_variant(
        device,
        kernel,
        entry,
        quick=False,
        seed=settings.seed,
        storage_overrun=settings.storage_overrun,
        constants={k: float(v) for k, v in candidate.constants.items()},
    )
    return (
        "PASS" if report.status == "PASS" else f"{report.status}: {report.reason.splitlines()[0]}"
    )


def evaluate(
    device: Any,
    renderer: CandidateRenderer,
    candidate: Candidate,
    label: str,
    shape: Shape,
    settings: Settings,
    baseline: Mapping[str, Any],
    opener: Callable[[], Any],
) -> CandidateResult:
    """Quick-validate the candidate on ``device``; time it on ``shape`` only if it passed, on a
    device of its own from ``opener``, so that no candidate's time depends on its place in the
    order.

    ``baseline`` is the current configuration's host metadata: a candidate that changes it (a
    smaller max_head_dim, say) is still a candidate, but the report must say so.
    """
    if candidate.error:
        return CandidateResult(candidate, label, "invalid", f"template: {candidate.error}")
    kernel, entry = renderer.render(candidate.params)
    contract = contract_changes(baseline, entry["metadata"])
    unmet = get_family(entry["family"]).constraints(entry, candidate.constants)
    if unmet:
        return CandidateResult(candidate, label, "invalid", f"constraint: {unmet}", None, contract)
    constants = {k: float(v) for k, v in candidate.constants.items()}
    report = validate_variant(
        device,
        kernel,
        entry,
        quick=True,
        seed=settings.seed,
        storage_overrun=settings.storage_overrun,
        constants=constants,
    )
    if report.status != "PASS":
        status = "SKIP" if report.status == "SKIP" else "invalid"
        reason = report.reason.splitlines()[0] if report.reason else ""
        return CandidateResult(candidate, label, status, reason, contract=contract)
    row = measure_on_fresh_device(opener, kernel, entry, shape, settings, constants=constants)
    if row.status == "FAIL":  # wrong at the tune shape (sampled rows vs float64): never timed
        reason = f"at {shape.label}: {row.reason}"
        return CandidateResult(candidate, label, "invalid", reason, row, contract)
    reason = row.reason if row.status != "ok" else ""
    return CandidateResult(candidate, label, "PASS", reason, row, contract)


def contract_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The host metadata (max_head_dim, dtypes, ...) that differs, as ``key old→new``."""
    keys = sorted(set(before) | set(after))
    return ", ".join(
        f"{k} {before.get(k)}→{after.get(k)}" for k in keys if before.get(k) != after.get(k)
    )


# -- report -------------------------------------------------------------------------------------


def format_report(run: TuneRun) -> str:
    current_ns = run.current.median_ns
    rows = [_row(i, r, current_ns, r is run.winner) for i, r in enumerate(run.results, start=1)]
    headers = ["#", "candidate", "validation", "median µs", "p10–p90 µs", "vs current", "note"]
    if run.is_cpu:
        headers.insert(0, "adapter")
        rows = [["CPU", *row] for row in rows]
    banner = [f"*** {cpu_warning(run.adapter)} ***"] if run.is_cpu else []
    lines = [
        *banner,
        f"tune {run.variant} on {run.shape} — {run.adapter}",
        *(f"default shape passed over: {line}" for line in run.passed_over),
        f"timing: median and p10–p90 of {run.settings.repeats} GPU-timestamped dispatches after "
        f"{run.settings.warmup} warm-up and a {run.settings.warmup_ms:g} ms GPU-time ramp; every "
        "candidate quick-validated first",
        "",
    ]
    lines.append(format_table(headers, rows))
    if run.capped:
        lines.append(
            f"\ncapped: kept {run.planned} of {run.total} candidates (raise --max-candidates)"
            if run.complete
            else f"\ncapped: kept {run.planned} of the {run.total} candidates found within "
            f"{run.depth} parameter change(s) of the current configuration; "
            f"{run.parameter_sets - run.rendered_sets:,} of {run.parameter_sets:,} parameter sets "
            "lie farther and were not rendered (raise --max-candidates)"
        )
    if run.time_cut:
        lines.append(
            f"\ntime limit: ran {len(run.results)} of {run.planned} candidates in "
            f"{run.elapsed:.0f} s (--time-limit {run.time_limit:g}); the winner is among those run"
        )
    lines.append("\n" + winner_line(run))
    if run.written is not None:
        lines.append(written_line(run.written))
    return "\n".join(lines + banner)


def _row(index: int, result: CandidateResult, current_ns: float | None, winner: bool) -> list[str]:
    timing = result.row.timing if result.row else None
    median = result.median_ns
    versus = f"{median / current_ns:.3f}" if median and current_ns else "-"
    notes = ["winner"] if winner else []
    notes += [f"changes {result.contract}"] if result.contract else []
    notes += [f"({result.reason})"] if result.reason else []
    return [
        str(index),
        result.label,
        result.validation,
        f"{median / 1e3:.1f}" if median else "-",
        timing.spread_text() if timing else "-",
        versus,
        "; ".join(notes),
    ]


def winner_line(run: TuneRun) -> str:
    winner, current = run.winner, run.current
    if winner is None:
        return "winner: none (no candidate passed validation and was timed)"
    if winner is current:
        return f"winner: the current configuration ({(winner.median_ns or 0) / 1e3:.1f} µs)"
    speed = ""
    if current.median_ns and winner.median_ns and winner.median_ns > 0:
        speed = f", {current.median_ns / winner.median_ns:.2f}× the current speed"
    contract = f"; it changes the variant's {winner.contract}" if winner.contract else ""
    full = run.winner_full_validation or "not run"
    return (
        f"winner: {winner.label} ({(winner.median_ns or 0) / 1e3:.1f} µs{speed}){contract}; "
        f"full validation matrix: {full}"
    )


def written_line(written: dict[str, Any]) -> str:
    if written.get("refused"):
        return f"--write refused (nothing written): {written['message']}"
    if not written.get("changed"):
        return f"--write: {written.get('message', 'nothing to write')}"
    files = ", ".join(written["files"]) or "no generated file changed"
    variant, summary = written["variant"], written["summary"]
    return f"--write: {CONFIG_NAME} variant {variant} now has {summary}; regenerated: {files}"


# -- --write ------------------------------------------------------------------------------------


def write_winner(
    project: Project, run: TuneRun, *, accept_contract_change: bool = False
) -> dict[str, Any]:
    """Record the winner in variants.toml (params and overrides), verify, regenerate.

    Refuses a winner that narrows the variant's host contract (unless accepted) or that did not
    pass the full validation matrix, and refuses if variants.toml changed since it was read.
    """
    from doppler_gen.outputs import plan, write

    winner = run.winner
    variant = project.variant(run.variant)
    if winner is None:
        return {"changed": False, "variant": variant.name, "message": "no winner; nothing written"}
    if winner.contract and not accept_contract_change:
        raise DopplerGenError(
            f"--write: the winner {winner.label} changes {variant.name}'s {winner.contract}; "
            "hosts relying on the old contract would break. Pass --accept-contract-change to "
            "record it anyway"
        )
    if winner is not run.current and run.winner_full_validation != "PASS":
        raise DopplerGenError(
            f"--write: the winner {winner.label} did not pass the full validation matrix "
            f"({run.winner_full_validation or 'not run'}); nothing written"
        )
    params = {k: v for k, v in winner.candidate.params.items() if variant.params[k] != v}
    unswept = {k: v for k, v in variant.overrides.items() if k not in winner.candidate.constants}
    overrides = dict(sorted({**unswept, **winner.candidate.overrides_to_record()}.items()))
    if winner is run.current or (not params and _same_constants(winner.candidate, variant)):
        return {
            "changed": False,
            "variant": variant.name,
            "message": "the winner is the current configuration; nothing written",
        }
    # under the generate lock from the read of variants.toml to the last file written: a second
    # `tune --write` or `generate` waits, then finds variants.toml changed and refuses
    with generate_lock(project.root):
        path = project.config_path
        original = read_config(project.root, newline="")  # CRLF stays CRLF, byte for byte
        if project.config_text and universal_newlines(original) != project.config_text:
            raise DopplerGenError(
                f"--write: {CONFIG_NAME} changed while tune ran; nothing written (run tune again)"
            )
        edited = edit_variant_entry(original, variant.name, params, overrides)
        try:  # the edited file is checked and rendered in memory: an error leaves it untouched
            reloaded = _verify(parse_project(project.root, edited), variant.name, params, overrides)
            outcome = plan(reloaded)
        except DopplerGenError as error:
            raise _edit_error(error, variant) from None
        _refuse_unvalidated(outcome, variant, winner.candidate)
        # Ctrl-C is held until variants.toml and generated/ both hold the winner, or neither
        with deferred_signals():
            edited_written = False
            try:
                _write_config(path, edited, "nothing written")
                edited_written = True
                result = write(outcome)
            except DopplerGenError as error:
                if edited_written:  # else the edit itself failed, and nothing was written
                    why = f"it holds the winner, but generated/ does not ({error})"
                    _write_config(path, original, why)
                raise
            except BaseException:  # not a signal (held): variants.toml must not keep the
                # winner alone, whether or not the edit had landed
                _write_config(path, original, "it holds the winner, but generated/ does not")
                raise
    summary = " ".join(f"{k}={v}" for k, v in {**params, **overrides}.items())
    if not overrides and variant.overrides:
        summary += " (overrides removed)"
    return {
        "changed": True,
        "variant": variant.name,
        "params": params,
        "overrides": overrides,
        "summary": summary,
        "files": result.written + result.removed,
    }


def _write_config(path: Path, text: str, if_it_fails: str) -> None:
    """Replace variants.toml's text, or refuse in one line saying what state it is left in
    (an unwritable file or directory, a full disk: the report is still printed)."""
    try:
        _atomic(path, text)
    except OSError as error:
        reason = error.strerror or str(error)
        raise DopplerGenError(f"--write: cannot write {path}: {reason}; {if_it_fails}") from None


def _atomic(path: Path, text: str) -> None:
    """Replace the file's text atomically, through a symlink (the link stays a link) and keeping
    the file's permission bits."""
    from doppler_gen.outputs import atomic_write

    target = path.resolve()
    mode = stat.S_IMODE(target.stat().st_mode)
    atomic_write(target, text)
    with contextlib.suppress(OSError):  # the text is written; a filesystem without modes
        os.chmod(target, mode)  # (vfat, some network mounts) refuses this, and it changes nothing


def _edit_error(error: DopplerGenError, variant: Variant) -> DopplerGenError:
    """An error in the edited variants.toml, which exists only in memory: its line numbers are
    the edit's, so the error points at the variant's entry in the file on disk instead."""
    location = error.location or ""
    if location != CONFIG_NAME and not location.startswith(f"{CONFIG_NAME}:"):
        return error  # a template error: its file and line are real
    edited_line = location.partition(":")[2].partition(":")[0]
    where = f" (line {edited_line} of the edited text)" if edited_line else ""
    return ConfigError(
        f"--write: recording the winner in variant {variant.name} would make {CONFIG_NAME} "
        f"invalid{where}: {error.message}; nothing written",
        location=f"{CONFIG_NAME}:{variant.line}" if variant.line else CONFIG_NAME,
    )


def _verify(
    project: Project, name: str, params: dict[str, ParamValue], overrides: dict[str, int]
) -> Project:
    """The edited project must hold exactly the values written."""
    variant = project.variant(name)
    wrong = {k: variant.params.get(k) for k, v in params.items() if variant.params.get(k) != v}
    if wrong or dict(variant.overrides) != overrides:
        raise ConfigError(
            f"--write: the edited entry of {name} reads back as {wrong or dict(variant.overrides)}",
            location=CONFIG_NAME,
        )
    return project


def _same_constants(candidate: Candidate, variant: Variant) -> bool:
    """Whether the candidate's constants are those the variant runs with now: its overrides,
    else the defaults (an override that only restates its default counts as the default)."""
    running = {**candidate.defaults, **variant.overrides}
    return all(running.get(name) == value for name, value in candidate.constants.items())


def _refuse_unvalidated(outcome: Any, variant: Variant, candidate: Candidate) -> None:
    """Refuse to write a kernel tune did not validate: the winner rendered from the templates on
    disk now must be the kernel validated and timed (a template or macro edited while tune ran
    changes it), and no other variant's kernel may change with it (a tree that was stale, or a
    shared macro edited meanwhile)."""
    fresh = kernel_digest(outcome.kernels[variant.name])
    if candidate.kernel and fresh != candidate.kernel:
        raise DopplerGenError(
            f"--write: {variant.name} renders differently now from the kernel tune validated "
            "(its template or a macro changed while tune ran); nothing written (run tune again)"
        )
    from doppler_gen.outputs import compare

    others = {
        rendered.output
        for name, kernel in outcome.kernels.items()
        if name != variant.name
        for rendered in kernel.passes
    }
    status = compare(outcome)
    changed = sorted(others.intersection([*status.stale, *status.missing]))
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        raise DopplerGenError(
            f"--write: recording {variant.name} would also rewrite {changed[0]}{more}, which tune "
            "did not validate (generated/ was stale, or a template changed while tune ran); "
            "nothing written (run `doppler-gen generate` and `validate` first)"
        )
