"""generated/manifest.json: what a host (and the validation runtime) needs to drive each kernel.

Built from the generated WGSL itself (parsed by ``wgsl``), plus the host metadata variants.toml
declares. Before a manifest is written, the metadata is cross-checked against the WGSL, so a
variant that says "output f16" but binds ``array<f32>``, or requires ``shader-f16`` without
``enable f16;``, is an error at generate time instead of a silent host bug.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from doppler_gen.config import CONFIG_NAME, PassSpec, Variant
from doppler_gen.errors import ConfigError, InterfaceError
from doppler_gen.families import get_family
from doppler_gen.families.roles import AUXILIARY, INPUT, OUTPUT, SCRATCH, UNIFORM
from doppler_gen.render import RenderedKernel, RenderedPass
from doppler_gen.wgsl import Binding, Module, parse_module

MANIFEST_PATH = "generated/manifest.json"
MANIFEST_FORMAT = 1

# Per-pass keys a single-pass entry also carries at its top level (the short form).
_SHORT_FORM_KEYS = (
    "file",
    "sha256",
    "entry_point",
    "workgroup_size",
    "workgroup_size_default",
    "bindings",
    "uniforms",
    "overrides",
    "constants",
)


def parse_kernel(kernel: RenderedKernel) -> tuple[Module, ...]:
    """Parse every pass of a rendered kernel; a parse failure names the file and variant."""
    return tuple(parse_pass(kernel, rendered) for rendered in kernel.passes)


def parse_pass(kernel: RenderedKernel, rendered: RenderedPass) -> Module:
    """The pass's module; a parse failure is named at its template line when the render
    carries a source map (else at the generated file, which may not be written yet)."""
    try:
        return parse_module(rendered.text)
    except InterfaceError as exc:
        origin = rendered.origin(exc.line) if exc.line else None
        where = f"{rendered.output}:{exc.line}" if exc.line else rendered.output
        error = InterfaceError(
            f"cannot read the interface of the generated WGSL: {exc.message}",
            location=f"{origin[0]}:{origin[1]} ({where}, variant {kernel.variant.name})"
            if origin
            else f"{where} (variant {kernel.variant.name})",
        )
        error.line = exc.line
        raise error from None


def entry_point(rendered: RenderedPass, module: Module) -> str | None:
    """The pass's entry point: the one variants.toml names, else the module's only one."""
    return rendered.spec.entry or module.entry_point


# what a family's ``roles`` may give a binding (the WGSL and the template say the rest)
FAMILY_ROLES = (INPUT, OUTPUT, AUXILIARY)


def _own_role(variant: Variant, binding: Binding) -> str | None:
    """uniform (the address space says so) or scratch (the template declares it); None: the
    family's ``roles`` decide."""
    if binding.address_space == "uniform":
        return UNIFORM
    if binding.name in variant.template.scratch:
        return SCRATCH
    return None


def role_of(variant: Variant, binding: Binding) -> str | None:
    """uniform, scratch (declared by the template), else what the family says (None: unknown)."""
    own = _own_role(variant, binding)
    return own or get_family(variant.template.family).roles.get(binding.name)


def _binding_dict(variant: Variant, b: Binding) -> dict[str, Any]:
    return {
        "group": b.group,
        "binding": b.binding,
        "name": b.name,
        "address_space": b.address_space,
        "access": b.access,
        "type": str(b.type),
        "element_type": b.element_type,
        "role": role_of(variant, b),
    }


def pass_entry(variant: Variant, rendered: RenderedPass, module: Module) -> dict[str, Any]:
    """The manifest record of one pass: what a host needs to create and dispatch it."""
    entry = entry_point(rendered, module)
    assert entry is not None  # check_metadata ran first
    bindings = sorted(module.bindings_of(entry), key=lambda b: (b.group, b.binding))
    uniform = next((b for b in bindings if b.address_space == "uniform"), None)
    return {
        "name": rendered.spec.name,
        "file": rendered.output,
        "sha256": hashlib.sha256(rendered.text.encode()).hexdigest(),
        "template": rendered.spec.source_path,
        "entry_point": entry,
        "workgroup_size": list(module.entry_points[entry].workgroup_size),
        "workgroup_size_default": list(module.entry_workgroup_size(entry)),
        "workgroup_storage_bytes": module.entry_storage_bytes(entry),
        "dispatch": rendered.spec.dispatch,
        **({"dispatch_fold": True} if rendered.spec.fold else {}),
        "bindings": [_binding_dict(variant, b) for b in bindings],
        "uniforms": _uniform_layout(module, uniform.type.name) if uniform else None,
        "overrides": [
            {"name": o.name, "type": o.type, "default": o.default}
            for o in sorted(module.overrides.values(), key=lambda o: o.name)
        ],
        "constants": dict(sorted(module.constants.items())),
        "pipeline_constants": {k: v for k, v in variant.overrides.items() if k in module.overrides},
    }


def variant_entry(kernel: RenderedKernel, modules: Sequence[Module]) -> dict[str, Any]:
    """The manifest entry of one variant: its passes, scratch buffers and host metadata.

    A single-pass variant also carries its pass's keys at the top level (the short form
    readers of the first manifest format expect).
    """
    variant = kernel.variant
    passes = [
        pass_entry(variant, rendered, module)
        for rendered, module in zip(kernel.passes, modules, strict=True)
    ]
    entry: dict[str, Any] = {
        "template": variant.template.source_path,
        "template_name": variant.template.name,
        "family": variant.template.family,
        "description": variant.description,
        "params": dict(sorted(variant.params.items())),
        # values the host passes as pipeline constants (override defaults otherwise apply)
        "pipeline_constants": dict(variant.overrides),
        "requires": list(variant.requires),
        # the narrowest subgroup every pass works with (its MIN_SUBGROUP_SIZE constant; None:
        # any width): a host must not select the variant where the adapter's subgroupMinSize
        # is smaller
        "min_subgroup_size": _min_subgroup_size(modules),
        # the largest of any pass: what a device's limit must hold
        "workgroup_storage_bytes": max(p["workgroup_storage_bytes"] for p in passes),
        # host metadata: what variants.toml declares (checked against the WGSL by
        # check_metadata) plus the workgroup size the WGSL declares with its override defaults
        "metadata": {**variant.metadata, "workgroup_size": passes[-1]["workgroup_size_default"]},
        "passes": passes,
        "scratch": scratch_entries(variant, modules),
        # place in Doppler's kernel registry, as variants.toml declares it (read by export.py)
        "doppler": variant.doppler.as_json() if variant.doppler else None,
    }
    if len(passes) == 1:
        entry.update({key: passes[0][key] for key in _SHORT_FORM_KEYS})
    return entry


class _Optional:
    """A key of an entry shape that may be absent (readers use ``.get``)."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape


# What readers of a recorded entry rely on (outputs: sha256 and file of each pass; export: the
# rest): the types variant_entry writes. A tuple lists alternatives; a one-item list is a list
# of such items; a dict is an object with at least these keys.
_BINDING_SHAPE = {
    "name": str,
    "binding": int,
    "type": str,
    "group": _Optional(int),
    "address_space": _Optional((str, None)),
    "access": _Optional((str, None)),
    "element_type": _Optional((str, None)),
}
_UNIFORMS_SHAPE = {"buffer_size": int, "fields": [{"name": str, "type": str, "offset": int}]}
_PASS_SHAPE = {
    "file": str,
    "sha256": str,
    "entry_point": str,
    "workgroup_size": [(int, str)],
    "bindings": [_BINDING_SHAPE],
    "uniforms": _Optional((_UNIFORMS_SHAPE, None)),
    "overrides": _Optional([{"name": str}]),
    "constants": _Optional(dict),
    "pipeline_constants": _Optional(dict),
    "workgroup_storage_bytes": _Optional(int),
    "dispatch": _Optional((str, None)),
}
_ENTRY_SHAPE = {
    "family": str,
    "metadata": _Optional(dict),
    "requires": _Optional([str]),
    "pipeline_constants": _Optional(dict),
    "scratch": _Optional([{"name": str}]),
    "doppler": _Optional(({"operation": str, "ids": [str], "tier": _Optional((str, None))}, None)),
}


def well_formed_entry(entry: Any) -> bool:
    """Whether a manifest entry read from disk has the shape variant_entry writes, as far as
    anything reads it. A hand-edited or damaged entry (``"passes": 5``) is then treated as
    absent instead of crashing the partial `generate` that keeps it."""
    if not _fits(entry, _ENTRY_SHAPE):
        return False
    passes = entry.get("passes")
    if passes:  # else the entry is its only pass (the short form)
        return isinstance(passes, list) and all(_fits(p, _PASS_SHAPE) for p in passes)
    return _fits(entry, _PASS_SHAPE)


def _fits(value: Any, shape: Any) -> bool:
    """``value`` (decoded JSON) has ``shape`` (see _ENTRY_SHAPE)."""
    if isinstance(shape, tuple):
        return any(_fits(value, option) for option in shape)
    if shape is None:
        return value is None
    if shape is int:
        return type(value) is int  # not bool
    if isinstance(shape, type):
        return isinstance(value, shape)
    if isinstance(shape, list):
        return isinstance(value, list) and all(_fits(item, shape[0]) for item in value)
    if not isinstance(value, dict):
        return False
    for key, item in shape.items():
        if isinstance(item, _Optional):
            if key in value and not _fits(value[key], item.shape):
                return False
        elif key not in value or not _fits(value[key], item):
            return False
    return True


def _min_subgroup_size(modules: Sequence[Module]) -> int | None:
    found = [
        int(m.constants["MIN_SUBGROUP_SIZE"]) for m in modules if "MIN_SUBGROUP_SIZE" in m.constants
    ]
    return max(found) if found else None


def scratch_entries(variant: Variant, modules: Sequence[Module]) -> list[dict[str, Any]]:
    """Each scratch buffer: its size expression (elements) and the element type its WGSL binds."""
    found = []
    for name, size in variant.template.scratch.items():
        binding = next((m.binding(name) for m in modules if m.binding(name)), None)
        element = binding.element_type if binding else None
        found.append({"name": name, "size": size, "element_type": element})
    return found


def _uniform_layout(module: Module, struct_name: str) -> dict[str, Any]:
    struct = module.structs[struct_name]
    return {
        "struct": struct.name,
        "size": struct.size,
        "align": struct.align,
        # uniform buffers are bound in 16-byte units; hosts allocate this much
        "buffer_size": -(-struct.size // 16) * 16,
        "fields": [
            {"name": f.name, "type": str(f.type), "offset": f.offset, "size": f.size}
            for f in struct.fields
        ],
    }


def check_metadata(variant: Variant, modules: Module | Sequence[Module]) -> None:
    """Raise InterfaceError where variants.toml's host metadata disagrees with the WGSL.

    Then the dispatch rules' and scratch sizes' names and the override values (ConfigError at
    their own variants.toml line): they can only be judged against the rendered WGSL.
    """
    if isinstance(modules, Module):
        modules = (modules,)
    modules = tuple(modules)
    where = f"variants.toml:{variant.line}" if variant.line else "variants.toml"
    problems = list(_metadata_problems(variant, modules))
    if problems:
        raise InterfaceError(f"variant {variant.name}: {problems[0]}", location=where)
    for name in variant.overrides:  # at the override's own line, as its value's errors are
        if not any(name in m.overrides for m in modules):
            raise InterfaceError(
                f"variant {variant.name}: overrides sets {name}, which the WGSL does not "
                "declare as `override`",
                location=_config_line(variant.override_lines.get(name, variant.line)),
            )
    known: set[str] = set()
    for spec, module in zip(variant.template.passes, modules, strict=True):
        known |= check_dispatch_names(variant, module, spec)
    check_scratch_names(variant, known)
    for module in modules:
        check_overrides(variant, module)


def _metadata_problems(variant: Variant, modules: tuple[Module, ...]) -> Iterator[str]:
    specs = variant.template.passes
    multi = variant.template.multi_pass
    entries: list[str] = []
    for spec, module in zip(specs, modules, strict=True):
        of = f" of pass {spec.name}" if multi else ""
        if spec.entry is not None and spec.entry not in module.entry_points:
            yield f"entry = {spec.entry!r} but the generated WGSL{of} has no @compute fn {spec.entry}"
            return
        if spec.entry is None and module.entry_point is None:
            found = ", ".join(module.entry_points)
            yield (
                f"the generated WGSL{of} has no @compute entry point"
                if not found
                else f"the generated WGSL{of} has several @compute entry points ({found}); "
                "name one with entry = ..."
            )
            return
        entries.append(spec.entry or str(module.entry_point))
        if spec.fold and "num_workgroups" not in module.entry_points[entries[-1]].uses:
            # the grid's width is the host's choice: a folding kernel must read it
            yield (
                f"dispatch_fold = true but the entry point{of} never reads "
                "@builtin(num_workgroups), so it cannot find its place in a folded grid"
            )
    has_f16 = any("f16" in m.enables for m in modules)
    if has_f16 and "shader-f16" not in variant.requires:
        yield 'the WGSL enables f16 but the variant does not list requires = ["shader-f16"]'
    if not has_f16 and "shader-f16" in variant.requires:
        yield "the variant requires shader-f16 but the WGSL has no `enable f16;`"
    for spec, module in zip(specs, modules, strict=True):
        if module.subgroup_builtins and "subgroups" not in module.enables:
            # naga runs it on a device with the capability; Tint (every browser) rejects it
            of = f" of pass {spec.name}" if multi else ""
            yield (
                f"the WGSL{of} uses {min(module.subgroup_builtins)} but has no "
                "`enable subgroups;` (browsers' Tint rejects it; wgpu's naga does not check)"
            )
    has_subgroups = any("subgroups" in m.enables for m in modules)
    if has_subgroups and "subgroups" not in variant.requires:
        yield 'the WGSL enables subgroups but the variant does not list requires = ["subgroups"]'
    if not has_subgroups and "subgroups" in variant.requires:
        yield "the variant requires subgroups but the WGSL has no `enable subgroups;`"
    yield from _shared_override_problems(specs, modules)
    yield from _role_problems(variant, modules, entries)
    meta = variant.metadata
    yield from get_family(variant.template.family).interface_problems(
        variant, meta, list(zip(specs, modules, strict=True))
    )
    for module, entry in zip(modules, entries, strict=True):
        uniform = next((b for b in module.bindings_of(entry) if b.address_space == "uniform"), None)
        if uniform is None or uniform.type.name not in module.structs:
            yield "the WGSL has no uniform struct binding"
            return
    yield from _scratch_problems(variant, modules)


def _shared_override_problems(
    specs: Sequence[PassSpec], modules: tuple[Module, ...]
) -> Iterator[str]:
    """An override several passes declare is one value (KV_SPLITS sizes the partials and tells
    the reduce pass how many to merge): the same type and default in each, since a variant's
    ``overrides`` and the export's ``constants`` give it once for all passes."""
    first: dict[str, tuple[str, Any]] = {}
    for spec, module in zip(specs, modules, strict=True):
        for name, override in module.overrides.items():
            declared = (override.type, override.default)
            if name not in first:
                first[name] = (spec.name, declared)
            elif first[name][1] != declared:
                other, (kind, default) = first[name]
                yield (
                    f"override {name} is {kind} = {default} in pass {other} but "
                    f"{override.type} = {override.default} in pass {spec.name}: a name the "
                    "passes share is one value"
                )
                return


def _role_problems(
    variant: Variant, modules: tuple[Module, ...], entries: list[str]
) -> Iterator[str]:
    """Every binding a pass uses has a role the runtime knows; exactly one is the output (the
    one buffer validate reads back and judges); no input is bound read_write (nothing reads an
    input back, so a kernel that overwrote one, a KV cache say, would still pass); the same
    name binds the same type in every pass."""
    family = variant.template.family
    roles = get_family(family).roles
    seen: dict[str, Binding] = {}
    outputs: list[str] = []
    for module, entry in zip(modules, entries, strict=True):
        for binding in module.bindings_of(entry):
            role = None if _own_role(variant, binding) else roles.get(binding.name, "")
            if role == "":
                yield (
                    f"binding {binding.name} has no role in family {family!r} (nor is it a "
                    "scratch buffer of the template)"
                )
            elif role is not None and role not in FAMILY_ROLES:
                yield (
                    f"family {family!r} gives binding {binding.name} the role {role!r}; a "
                    f"family's roles are {', '.join(FAMILY_ROLES)}"
                )
            elif role == OUTPUT:
                if binding.name not in outputs:
                    outputs.append(binding.name)
            elif role is not None and binding.access == "read_write":
                yield (
                    f"binding {binding.name} is an {role} of family {family!r} but is bound "
                    "read_write: nothing checks what a kernel writes there (bind it read)"
                )
            first = seen.setdefault(binding.name, binding)
            if str(first.type) != str(binding.type):
                yield (
                    f"binding {binding.name} is {first.type} in one pass and {binding.type} "
                    "in another"
                )
    if not outputs:
        named = ", ".join(name for name, role in roles.items() if role == OUTPUT) or "none"
        yield (
            f"no entry point binds an output (family {family!r} names: {named}); validate "
            "reads back and judges exactly one"
        )
    elif len(outputs) > 1:
        yield (
            f"the entry points bind {len(outputs)} outputs ({', '.join(outputs)}); validate "
            "reads back and judges exactly one"
        )


def _scratch_problems(variant: Variant, modules: tuple[Module, ...]) -> Iterator[str]:
    for name in variant.template.scratch:
        bound = [m.binding(name) for m in modules if m.binding(name)]
        if not bound:
            yield f"scratch buffer {name} is bound by no pass"
            continue
        if any(b.element_type is None or b.address_space != "storage" for b in bound):
            yield f"scratch buffer {name} must be a storage array (it is {bound[0].type})"
        if len({b.element_type for b in bound}) > 1:
            yield f"scratch buffer {name} has different element types in different passes"
        if not any(b.access == "read_write" for b in bound):
            yield f"scratch buffer {name} is written by no pass (no read_write binding)"


def _config_line(line: int) -> str:
    return f"{CONFIG_NAME}:{line}" if line else CONFIG_NAME


def check_dispatch_names(variant: Variant, module: Module, spec: PassSpec) -> set[str]:
    """A pass's dispatch rule may read only its Uniforms fields, override and module constants.

    Returns those names (what scratch sizes may read, over every pass).
    """
    template = variant.template
    entry = spec.entry or module.entry_point
    bound = module.bindings_of(entry) if entry in module.entry_points else module.bindings
    uniform = next((b for b in bound if b.address_space == "uniform"), None)
    fields = set()
    if uniform is not None and uniform.type.name in module.structs:
        fields = {f.name for f in module.structs[uniform.type.name].fields}
    known = fields | set(module.overrides) | set(module.constants)
    unknown = sorted(spec.dispatch_expression.names - known)
    if unknown:
        of = f" (pass {spec.name})" if template.multi_pass else ""
        raise ConfigError(
            f"[templates.{template.name}] dispatch{of} {spec.dispatch!r} uses "
            f"{', '.join(unknown)}, which the WGSL of variant {variant.name} declares neither as a "
            "Uniforms field nor as an override or module constant",
            location=_config_line(spec.line),
        )
    return known


def check_scratch_names(variant: Variant, known: set[str]) -> None:
    """A scratch size may read the Uniforms fields and constants of any pass."""
    template = variant.template
    for name, expression in template.scratch_exprs.items():
        unknown = sorted(expression.names - known)
        if unknown:
            raise ConfigError(
                f"[templates.{template.name}.scratch] {name} = {template.scratch[name]!r} uses "
                f"{', '.join(unknown)}, which no pass of variant {variant.name} declares as a "
                "Uniforms field or constant",
                location=_config_line(template.scratch_lines.get(name, template.line)),
            )


# (lowest, highest) value a pipeline constant of each WGSL scalar type can take
_OVERRIDE_RANGES: dict[str, tuple[float, float]] = {
    "u32": (0, 2**32 - 1),
    "i32": (-(2**31), 2**31 - 1),
    "f32": (-3.4028234663852886e38, 3.4028234663852886e38),
    "f16": (-65504.0, 65504.0),
    "bool": (0, 1),
}


def sizing_names(dispatches: Iterable[str], workgroup_sizes: Iterable[str]) -> set[str]:
    """The names in dispatch and workgroup-size expressions: an override constant among them
    sizes a dispatch or a workgroup, so its value must be at least 1 (``override_problem``).
    Shared by ``check_overrides`` (variants.toml) and tune's ``--space``."""
    names: set[str] = set()
    for expression in (*dispatches, *workgroup_sizes):
        names |= set(re.findall(r"[A-Za-z_]\w*", expression))
    return names


def check_overrides(variant: Variant, module: Module) -> None:
    """Each override value fits its WGSL type; one that sizes the dispatch or workgroup is >= 1."""
    sizes = sizing_names(
        (spec.dispatch for spec in variant.template.passes),
        (size for entry in module.entry_points.values() for size in entry.workgroup_size),
    )
    for name, value in variant.overrides.items():
        declared = module.overrides.get(name)
        if declared is None:
            continue  # reported by check_metadata as "not declared as `override`"
        problem = override_problem(declared.type, value, size=name in sizes)
        if problem:
            raise ConfigError(
                f"variant {variant.name!r}: override {name} = {value!r}: {problem}",
                location=_config_line(variant.override_lines.get(name, variant.line)),
            )


def _bound(value: int | float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def override_problem(wgsl_type: str, value: int | float, *, size: bool) -> str | None:
    """Why ``value`` cannot be the pipeline constant of a WGSL ``wgsl_type`` override, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number"
    if wgsl_type in ("u32", "i32", "bool") and not isinstance(value, int):
        return f"{wgsl_type} needs an integer"
    low, high = _OVERRIDE_RANGES.get(wgsl_type, (-math.inf, math.inf))
    if not low <= value <= high:
        # integer bounds exactly (4294967295, not 4.29497e+09); float bounds are approximate anyway
        return f"out of range for {wgsl_type} ({_bound(low)} to {_bound(high)})"
    if size and value < 1:
        return "it sizes the dispatch or the workgroup, so it must be at least 1"
    return None


def build_manifest(entries: dict[str, dict[str, Any]]) -> str:
    """The manifest file's text: sorted keys, two-space indent, one trailing newline."""
    document = {
        "generator": "doppler-gen",
        "format": MANIFEST_FORMAT,
        "note": "AUTO-GENERATED by doppler-gen from variants.toml and templates/ - do not edit; "
        "run `doppler-gen generate`.",
        "variants": entries,
    }
    return (
        json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
    )
