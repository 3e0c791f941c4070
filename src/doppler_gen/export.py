"""generated/doppler/: the kernel registry fragment and content digests Doppler's host loads.

Doppler's JS host never reads generated/manifest.json. It reads a kernel registry
(``operations.<op>.variants.<id>``: file, entry point, workgroup size, bindings, uniform layout,
metadata) and a table of content digests. Typed by hand, those drift from the WGSL (uniform sizes,
shifted field names, workgroup sizes, binding counts). Here they are written from the manifest
entries, which are parsed from the generated WGSL, so they cannot drift; `check` keeps them
current like every other generated file, and ``differences`` finds drift in a Doppler checkout.

Everything here is a pure function of manifest entries (plus the kernel texts, for digests).
Each variant is exported as a list of passes. Today every manifest entry is one pass, named
``main``, built from its flat fields (``passes_of``). An entry that carries ``passes`` (and
``scratch``) is exported pass by pass, in order, with its scratch buffers.

Which operation and host id a variant has, and the host tier it serves, come from variants.toml
(``doppler_operation``, ``doppler_id``, ``doppler_tier``); nothing is guessed from names.
"""

from __future__ import annotations

import hashlib
import json
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from doppler_gen import observed
from doppler_gen.errors import DopplerGenError, InterfaceError
from doppler_gen.expressions import parse as parse_expression
from doppler_gen.families import get_family
from doppler_gen.wgsl import evaluate

EXPORT_DIR = "generated/doppler"
REGISTRY_NAME = "registry.json"
DIGESTS_NAME = "digests.json"
REGISTRY_PATH = f"{EXPORT_DIR}/{REGISTRY_NAME}"
DIGESTS_PATH = f"{EXPORT_DIR}/{DIGESTS_NAME}"
GENERATOR = "doppler-gen"
ENTRY_MARK = "\n@@entry:"
MAIN_PASS = "main"
PASS_ENCODING = "one-compute-pass"  # a multi-pass variant's passes: dispatches of one compute pass

# WebGPU buffer binding types, as Doppler's registry names them
_BINDING_TYPES = {("uniform", "read"): "uniform", ("storage", "read"): "read-only-storage"}
_BINDING_TYPES[("storage", "read_write")] = "storage"
_ELEMENT_BYTES = {"f32": 4, "u32": 4, "i32": 4, "f16": 2}
# the query block of a dispatch rule such as `ceil(query_len / BLOCK_SIZE) * num_heads`
_QUERY_BLOCK = re.compile(r"ceil\(\s*query_len\s*/\s*([A-Za-z_]\w*|\d+)\s*\)")
# keys of a registry variant that describe a kernel (what `differences` compares); description
# and Doppler-side keys (reachability, ...) are informational
_COMPARED_KEYS = (
    "wgsl",
    "entryPoint",
    "workgroup",
    "requires",
    "outputDtype",
    "inputDtype",
    "kvDtype",
    "wgslOverrides",
    "constants",
    "dispatch",
    "passEncoding",
)


# keys the exporter writes only for some kernels (see _Vocabulary)
_VARIANT_KEYS = frozenset(
    {
        "wgsl",
        "entryPoint",
        "workgroup",
        "wgslOverrides",
        "passes",
        "scratch",
        "passEncoding",
        "constants",
        "dispatch",
    }
)
# compared otherwise: the layout as Doppler resolves it, and free text
_NOT_VOCABULARY = frozenset({"description", "bindingsOverride", "uniformsOverride"})
_METADATA_KEYS = frozenset({"maxKVLen", "tier", "queryBlockSize", "dispatchFold"})
_PASS_KEYS = frozenset({"dispatch", "dispatchFold"})


class ExportInputError(DopplerGenError):
    """A Doppler registry or digest file that cannot be read or has the wrong structure."""


# -- digests ---------------------------------------------------------------------------------------


def content_digest(source: str, entry_point: str) -> str:
    """Doppler's content digest: sha256 of the source with CRLF -> LF, then "\\n@@entry:" + entry."""
    text = source.replace("\r\n", "\n") + ENTRY_MARK + entry_point
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def digest_key(file: str, entry_point: str) -> str:
    """``"file.wgsl#entry"``: Doppler keys digests by kernel file name and entry point."""
    return f"{PurePosixPath(file).name}#{entry_point}"


# -- manifest entry -> passes ----------------------------------------------------------------------


def passes_of(entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The passes of a manifest entry, in dispatch order.

    A multi-pass entry lists them under ``passes`` (each with the per-kernel keys of a flat entry:
    file, entry_point, workgroup_size, bindings, uniforms, overrides, constants, ...). A flat
    entry is one pass named ``main``.
    """
    if entry.get("passes"):
        return list(entry["passes"])
    return [{**entry, "name": MAIN_PASS}]


def _names(pass_entry: Mapping[str, Any], constants: Mapping[str, Any]) -> dict[str, Any]:
    """Values of the pass's constants and overrides, with the variant's pipeline constants."""
    names: dict[str, Any] = dict(pass_entry.get("constants") or {})
    for override in pass_entry.get("overrides") or []:
        if override.get("default") is not None:
            names[override["name"]] = override["default"]
    names.update(constants)
    return names


def _binding(binding: Mapping[str, Any], where: str) -> dict[str, Any]:
    if binding.get("group", 0) != 0:
        raise InterfaceError(
            f"binding {binding['name']} is in group {binding['group']}; Doppler's registry "
            "describes bind group 0 only",
            location=where,
        )
    kind = _BINDING_TYPES.get((binding.get("address_space"), binding.get("access")))
    if kind is None:
        raise InterfaceError(
            f"binding {binding['name']} ({binding.get('address_space')}, "
            f"{binding.get('access')}) has no Doppler registry type (uniform, read-only-storage, "
            "storage)",
            location=where,
        )
    return {"index": binding["binding"], "name": binding["name"], "type": kind}


def _uniforms(layout: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{size, fields}``: size is what the host allocates (the struct rounded up to 16 bytes)."""
    if layout is None:
        return {"size": 0, "fields": []}
    return {
        "size": layout["buffer_size"],
        "fields": [
            {"name": f["name"], "type": f["type"], "offset": f["offset"]} for f in layout["fields"]
        ],
    }


def export_pass(
    pass_entry: Mapping[str, Any], pipeline_constants: Mapping[str, Any], where: str
) -> dict[str, Any]:
    """One pass in registry vocabulary (what a host needs to build and bind its pipeline).

    ``path``, ``dispatch`` and ``names`` serve the exporter (digests, queryBlockSize) and are not
    written to the registry.
    """
    constants = dict(pass_entry.get("pipeline_constants", pipeline_constants))
    names = _names(pass_entry, constants)
    bindings = sorted(
        (_binding(b, where) for b in pass_entry["bindings"]), key=lambda b: b["index"]
    )
    return {
        "name": pass_entry.get("name", MAIN_PASS),
        "wgsl": PurePosixPath(pass_entry["file"]).name,
        "path": pass_entry["file"],
        "entryPoint": pass_entry["entry_point"],
        "workgroup": [int(evaluate(str(e), names)) for e in pass_entry["workgroup_size"]],
        "wgslOverrides": dict(sorted(constants.items())),
        "bindings": bindings,
        "uniforms": _uniforms(pass_entry.get("uniforms")),
        "requiredShared": pass_entry.get("workgroup_storage_bytes", 0),
        "dispatch": pass_entry.get("dispatch"),
        # past maxComputeWorkgroupsPerDimension the count may be dispatched as a 2-D grid:
        # y = ceil(n / limit), x = ceil(n / y) (the kernel skips the spare workgroups)
        **({"dispatchFold": True} if pass_entry.get("dispatch_fold") else {}),
        "names": names,
    }


def _scratch(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Scratch buffers: name, element count (an expression over uniforms and constants), dtype.

    The manifest may give them as ``{name: expression}``, ``{name: {elements|size: ...}}`` or a
    list of ``{name, elements|size}``; the element type is the WGSL binding's.
    """
    raw = entry.get("scratch") or {}
    items = raw.items() if isinstance(raw, Mapping) else ((s["name"], s) for s in raw)
    element_types = {}
    for pass_entry in passes_of(entry):
        for binding in pass_entry["bindings"]:
            element_types.setdefault(binding["name"], binding.get("element_type"))
    scratch = []
    for name, spec in sorted(items):
        elements = spec if isinstance(spec, str | int) else spec.get("elements", spec.get("size"))
        dtype = element_types.get(name)
        scratch.append(
            {
                "name": name,
                "elements": str(elements),
                "dtype": dtype,
                "bytesPerElement": _ELEMENT_BYTES.get(dtype or ""),
            }
        )
    return scratch


def _query_block_size(dispatch: str | None, names: Mapping[str, Any]) -> int | None:
    """Queries one workgroup covers, read from the dispatch rule (``ceil(query_len / X)``)."""
    match = _QUERY_BLOCK.search(dispatch or "")
    if match is None:
        return None
    try:
        return int(evaluate(match.group(1), dict(names)))
    except InterfaceError:
        return None


def _variant_metadata(
    meta: Mapping[str, Any], tier: str | None, passes: list[dict[str, Any]]
) -> dict[str, Any]:
    result: dict[str, Any] = {"requiredShared": max(p["requiredShared"] for p in passes)}
    if meta.get("max_head_dim") is not None:
        result["maxHeadDim"] = meta["max_head_dim"]
    if meta.get("max_kv_len") is not None:
        result["maxKVLen"] = meta["max_kv_len"]
    if tier is not None:
        result["tier"] = tier
    # a multi-pass variant records one rule per pass (a mapping): read the first pass's
    dispatch = meta.get("dispatch")
    if not isinstance(dispatch, str):
        dispatch = passes[0]["dispatch"]
    block = _query_block_size(dispatch, passes[0]["names"])
    if block is not None:
        result["queryBlockSize"] = block
    if len(passes) == 1 and passes[0].get("dispatchFold"):
        result["dispatchFold"] = True  # a multi-pass variant says it pass by pass
    return result


@dataclass(frozen=True)
class ExportedVariant:
    """One doppler-gen variant placed in the registry (under one or more host ids)."""

    name: str
    operation: str
    ids: tuple[str, ...]
    fields: dict[str, Any]  # dtypes, requires, metadata, description
    passes: list[dict[str, Any]]
    scratch: list[dict[str, Any]]
    host_dispatch: bool = True  # the host counts a one-kernel variant's workgroups itself

    @property
    def single(self) -> bool:
        return len(self.passes) == 1 and not self.scratch


def export_variant(name: str, entry: Mapping[str, Any]) -> ExportedVariant | None:
    """A manifest entry in registry terms; None when variants.toml gives it no doppler_id."""
    doppler = entry.get("doppler")
    if not doppler:
        return None
    where = f"{entry.get('file', name)} (variant {name})"
    pipeline_constants = entry.get("pipeline_constants") or {}
    passes = [export_pass(p, pipeline_constants, where) for p in passes_of(entry)]
    meta = entry.get("metadata") or {}
    fields: dict[str, Any] = {
        "requires": sorted(entry.get("requires") or []),
        "variantMetadata": _variant_metadata(meta, doppler.get("tier"), passes),
        "description": entry.get("description", ""),
    }
    if entry.get("min_subgroup_size"):
        # the host compares it with the adapter's subgroupMinSize before selecting the variant
        fields["variantMetadata"]["minSubgroupSize"] = entry["min_subgroup_size"]
    # what else the family knows the host must check (attention: headDimMultiple)
    family = get_family(entry["family"])
    fields["variantMetadata"].update(family.host_metadata(entry))
    fields.update(family.host_dtypes(entry))
    return ExportedVariant(
        name=name,
        operation=doppler["operation"],
        ids=tuple(doppler["ids"]),
        fields=fields,
        passes=passes,
        scratch=_scratch(entry),
        host_dispatch=family.host_dispatch,
    )


def _public_pass(pass_: Mapping[str, Any]) -> dict[str, Any]:
    """A pass of the passes form, with its workgroup-count rule: no tier formula covers it."""
    keys = ("name", "wgsl", "entryPoint", "workgroup", "wgslOverrides", "bindings", "uniforms")
    optional = {k: pass_[k] for k in ("dispatchFold",) if k in pass_}
    return {
        **{k: pass_[k] for k in keys},
        "requiredShared": pass_["requiredShared"],
        "dispatch": pass_["dispatch"],
        **optional,
    }


def _rule_constants(variant: ExportedVariant) -> dict[str, Any]:
    """The value of every name the passes' dispatch rules and the scratch sizes read that is
    not a uniform field: the override (as the host creates the pipeline, pipeline constants
    included) or WGSL const it names, so that a host can evaluate both without the WGSL."""
    rules = [p["dispatch"] for p in variant.passes] + [s["elements"] for s in variant.scratch]
    used = set().union(*(parse_expression(str(rule)).names for rule in rules if rule))
    fields = {f["name"] for p in variant.passes for f in p["uniforms"]["fields"]}
    values: dict[str, Any] = {}
    for name in sorted(used - fields):
        known = [p["names"][name] for p in variant.passes if name in p["names"]]
        if known:
            values[name] = known[0]
    return values


# -- registry fragment -----------------------------------------------------------------------------


def _most_common(values: list[str]) -> str:
    """The most frequent value; ties go to the first one seen (inputs come in id order)."""
    return max(dict.fromkeys(values), key=values.count)


def _base_bindings(layouts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Bindings every variant has at the same index, each the most common form across variants.

    Doppler merges a variant's ``bindingsOverride`` into the base by index; it can replace or add
    a binding, never remove one, so the base holds only indices that every variant binds.
    """
    common = set.intersection(*({b["index"] for b in layout} for layout in layouts))
    base = []
    for index in sorted(common):
        forms = [
            json.dumps(next(b for b in layout if b["index"] == index), sort_keys=True)
            for layout in layouts
        ]
        base.append(json.loads(_most_common(forms)))
    return base


def merge_bindings(
    base: list[Mapping[str, Any]], override: Iterable[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """Doppler's resolution: the override replaces the base binding of the same index, or adds."""
    merged = {b["index"]: dict(b) for b in base}
    for binding in override or []:
        merged[binding["index"]] = dict(binding)
    return [merged[index] for index in sorted(merged)]


def _operation(variants: list[tuple[str, ExportedVariant]]) -> dict[str, Any]:
    """``operations.<op>``: base layout shared by its single-pass variants, then each variant.

    baseBindings / baseUniforms hold what the single-pass variants share (their common form);
    a variant that differs carries ``bindingsOverride`` (only the indices that differ from the
    base) and ``uniformsOverride`` (its whole layout, which Doppler substitutes for the base).
    A multi-pass variant lists ``passes``, each with its own complete bindings and uniforms,
    and ``passEncoding``: record them as dispatches of one compute pass, in order.
    """
    singles = [(i, v) for i, v in variants if v.single]
    operation: dict[str, Any] = {"variants": {}}
    base_bindings: list[dict[str, Any]] = []
    base_uniforms: dict[str, Any] | None = None
    if singles:
        base_bindings = _base_bindings([v.passes[0]["bindings"] for _, v in singles])
        base_uniforms = json.loads(
            _most_common([json.dumps(v.passes[0]["uniforms"], sort_keys=True) for _, v in singles])
        )
        operation["baseBindings"] = base_bindings
        operation["baseUniforms"] = base_uniforms
    for doppler_id, variant in variants:
        entry: dict[str, Any] = dict(variant.fields)
        if variant.single:
            only = variant.passes[0]
            entry.update({k: only[k] for k in ("wgsl", "entryPoint", "workgroup", "wgslOverrides")})
            override = [b for b in only["bindings"] if b not in base_bindings]
            if override:
                entry["bindingsOverride"] = override
            if only["uniforms"] != base_uniforms:
                entry["uniformsOverride"] = only["uniforms"]
            assert merge_bindings(base_bindings, override) == only["bindings"]
            if not variant.host_dispatch:
                # no host formula counts this family's workgroups: the rule and its constants
                entry["dispatch"] = only["dispatch"]
                entry["constants"] = _rule_constants(variant)
        else:
            entry["passes"] = [_public_pass(p) for p in variant.passes]
            entry["scratch"] = variant.scratch
            entry["constants"] = _rule_constants(variant)
            # validated and timed as consecutive dispatches of one compute pass; a compute pass
            # each cost the H200 ~9 us more per run of a two-pass kernel (README)
            entry["passEncoding"] = PASS_ENCODING
        operation["variants"][doppler_id] = entry
    return operation


def exported_variants(entries: Mapping[str, Mapping[str, Any]]) -> list[ExportedVariant]:
    """Every manifest entry that variants.toml places in the registry, in name order."""
    exported = (export_variant(name, entries[name]) for name in sorted(entries))
    return [v for v in exported if v is not None]


def registry_document(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The registry fragment: ``operations`` in Doppler's vocabulary, plus what is left out."""
    by_operation: dict[str, list[tuple[str, ExportedVariant]]] = {}
    for variant in exported_variants(entries):
        for doppler_id in variant.ids:
            by_operation.setdefault(variant.operation, []).append((doppler_id, variant))
    return {
        "generator": GENERATOR,
        "note": "AUTO-GENERATED by doppler-gen from variants.toml and the generated WGSL - do not "
        "edit; run `doppler-gen generate`. Merge `operations` into Doppler's kernel registry.",
        "operations": {
            op: _operation(sorted(items, key=lambda item: item[0]))
            for op, items in sorted(by_operation.items())
        },
        # doppler-gen variants without a doppler_id: generated, but not in the registry
        "notExported": sorted(name for name, e in entries.items() if not e.get("doppler")),
    }


def digests_document(
    entries: Mapping[str, Mapping[str, Any]], sources: Mapping[str, str]
) -> dict[str, Any]:
    """Content digests of every (file, entry point) the registry fragment references."""
    digests: dict[str, str] = {}
    for variant in exported_variants(entries):
        for pass_ in variant.passes:
            if pass_["path"] not in sources:
                raise InterfaceError(
                    f"no source text for {pass_['path']} (variant {variant.name})",
                    location=DIGESTS_PATH,
                )
            key = digest_key(pass_["path"], pass_["entryPoint"])
            digests[key] = content_digest(sources[pass_["path"]], pass_["entryPoint"])
    return {
        "generator": GENERATOR,
        "note": "AUTO-GENERATED by doppler-gen - do not edit. sha256 of each kernel's source "
        '(CRLF -> LF) followed by "\\n@@entry:" + entry point, keyed "file.wgsl#entry".',
        "digests": dict(sorted(digests.items())),
    }


def dump(document: Mapping[str, Any]) -> str:
    """Sorted keys, two-space indent, LF, one trailing newline: byte-identical on every run."""
    return (
        json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
    )


def export_files(
    entries: Mapping[str, Mapping[str, Any]], sources: Mapping[str, str]
) -> dict[str, str]:
    """generated/doppler/*: relative path -> text, from the manifest entries of every variant."""
    return {
        REGISTRY_PATH: dump(registry_document(entries)),
        DIGESTS_PATH: dump(digests_document(entries, sources)),
    }


def orphaned_exports(root: Path, produced: Iterable[str]) -> list[str]:
    """Files in generated/doppler/ that doppler-gen wrote but no longer produces.

    A file counts as ours only if it is a JSON object whose ``generator`` is doppler-gen, so a
    hand-made file in that directory is never reported or removed.
    """
    directory = root / EXPORT_DIR  # observed.regular_files: [] when there is no directory
    produced = set(produced)
    found = []
    try:
        files = observed.regular_files(directory)
    except OSError as exc:  # an unlistable directory: one line, as for generated/ (outputs)
        raise DopplerGenError(f"cannot list: {exc.strerror or exc}", location=EXPORT_DIR) from None
    for path in files:
        relative = path.relative_to(root).as_posix()
        # an interrupted generate's temporary files are leftovers, reported as such; any other
        # file, hidden or not, that says doppler-gen wrote it is an orphan (a hidden copy of
        # registry.json is flagged just as a hidden copy of a kernel is in generated/)
        leftover = path.name.startswith(".") and path.name.endswith(".tmp")
        if not leftover and relative not in produced and _is_ours(path):
            found.append(relative)
    return found


def _is_ours(path: Path) -> bool:
    try:
        document = json.loads(observed.read_bytes(path).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError: bad UTF-8 or JSON, an int
        return False  # past Python's digit limit; RecursionError: nested too deeply
    return isinstance(document, dict) and document.get("generator") == GENERATOR


# -- comparison with a Doppler checkout ------------------------------------------------------------


class _NotJson(Exception):
    """NaN, Infinity or -Infinity: Python's json module reads them, JSON.parse does not."""


def _not_json(constant: str) -> Any:
    raise _NotJson(constant)


def load_json(path: Path) -> Any:
    """A JSON file, or ExportInputError naming the file (and line) for anything unreadable."""
    try:
        # a FIFO or device would block the read forever (as variants.toml would: config.py)
        if not stat.S_ISREG(path.stat().st_mode):
            raise ExportInputError(
                "not a regular file; doppler-gen refuses to read it", location=str(path)
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ExportInputError("not found", location=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportInputError(f"cannot read: {exc}", location=str(path)) from None
    try:
        return json.loads(text, parse_constant=_not_json)
    except _NotJson as exc:
        raise ExportInputError(
            f"invalid JSON: {exc} is not a JSON value (JavaScript's JSON.parse refuses NaN, "
            "Infinity and -Infinity, so Doppler's host could not load this file)",
            location=str(path),
        ) from None
    except json.JSONDecodeError as exc:
        raise ExportInputError(
            f"invalid JSON: {exc.msg}", location=f"{path}:{exc.lineno}:{exc.colno}"
        ) from None
    except RecursionError:
        raise ExportInputError("invalid JSON: nested too deeply", location=str(path)) from None
    except ValueError as exc:  # an integer past Python's int-to-str digit limit
        reason = str(exc).split(";")[0]
        raise ExportInputError(f"invalid JSON: {reason}", location=str(path)) from None


def load_doppler_dir(directory: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """``DIR/registry.json`` and ``DIR/digests.json``, checked for the structure we compare."""
    if not directory.is_dir():
        raise ExportInputError("not a directory", location=str(directory))
    registry_path, digests_path = directory / REGISTRY_NAME, directory / DIGESTS_NAME
    registry = load_json(registry_path)
    _check_registry(registry, str(registry_path))
    return registry, _digest_table(load_json(digests_path), str(digests_path))


def _fail(where: str, path: str, expected: str) -> ExportInputError:
    return ExportInputError(f"{path}: expected {expected}", location=where)


def _check_registry(registry: Any, where: str) -> None:
    if not isinstance(registry, dict) or not isinstance(registry.get("operations"), dict):
        raise _fail(where, "top level", 'an object with an "operations" object')
    for op, schema in registry["operations"].items():
        path = f"operations.{op}"
        if not isinstance(schema, dict) or not isinstance(schema.get("variants", {}), dict):
            raise _fail(where, path, 'an object with a "variants" object')
        _check_bindings(schema.get("baseBindings", []), f"{path}.baseBindings", where)
        _check_uniforms(schema.get("baseUniforms"), f"{path}.baseUniforms", where)
        for vid, variant in schema.get("variants", {}).items():
            vpath = f"{path}.variants.{vid}"
            if not isinstance(variant, dict):
                raise _fail(where, vpath, "an object")
            if not isinstance(variant.get("variantMetadata", {}), dict):
                raise _fail(where, f"{vpath}.variantMetadata", "an object")
            _check_bindings(variant.get("bindingsOverride", []), f"{vpath}.bindingsOverride", where)
            _check_uniforms(variant.get("uniformsOverride"), f"{vpath}.uniformsOverride", where)
            _check_passes(variant.get("passes"), f"{vpath}.passes", where)


def _check_passes(passes: Any, path: str, where: str) -> None:
    """The bindings and uniforms of a multi-pass variant's passes, compared like a single-pass
    variant's (a ``passes`` that is no list, or a pass that is no object, is a difference)."""
    if not isinstance(passes, list):
        return
    for n, pass_ in enumerate(passes):
        if isinstance(pass_, dict):
            _check_bindings(pass_.get("bindings") or [], f"{path}[{n}].bindings", where)
            _check_uniforms(pass_.get("uniforms"), f"{path}[{n}].uniforms", where)


def _check_bindings(bindings: Any, path: str, where: str) -> None:
    if not isinstance(bindings, list):
        raise _fail(where, path, "a list")
    for n, binding in enumerate(bindings):
        if not isinstance(binding, dict) or type(binding.get("index")) is not int:
            raise _fail(where, f"{path}[{n}]", 'an object with an integer "index"')


def _check_uniforms(uniforms: Any, path: str, where: str) -> None:
    if uniforms is None:
        return
    if not isinstance(uniforms, dict) or not isinstance(uniforms.get("fields", []), list):
        raise _fail(where, path, 'an object with a "fields" list')
    if not all(isinstance(f, dict) for f in uniforms.get("fields", [])):
        raise _fail(where, f"{path}.fields", "a list of objects")


def _digest_table(document: Any, where: str) -> dict[str, str]:
    """Doppler's flat ``{"file.wgsl#entry": hex}`` table, or our ``{"digests": {...}}`` file."""
    table = document.get("digests") if isinstance(document, dict) else None
    table = table if isinstance(table, dict) else document
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in table.items()
    ):
        raise _fail(where, "top level", 'an object of "file.wgsl#entry": "sha256 hex" strings')
    return {k: v.lower().removeprefix("sha256:") for k, v in table.items() if "#" in k}


# a key the registry does not have: shown as "absent", unlike a JSON null it holds
_ABSENT: Any = object()


def _show(value: Any) -> str:
    return "absent" if value is _ABSENT else json.dumps(value, sort_keys=True)


def _as_js(value: Any) -> Any:
    """A JSON value as a JS host compares it: ``true`` is not ``1`` (Python's ``True == 1``
    would hide that), while ``1.0`` is ``1``."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", value)  # 1 == 1.0 as in JS; no float(): a 400-digit int overflows
    if isinstance(value, list):
        return ("array", tuple(_as_js(v) for v in value))
    if isinstance(value, dict):
        return ("object", tuple(sorted((str(k), _as_js(v)) for k, v in value.items())))
    return ("absent", None) if value is _ABSENT else ("other", repr(value))


def _differ(theirs: Any, ours: Any) -> bool:
    return _as_js(theirs) != _as_js(ours)


def _layout_differences(
    label: str, theirs: Mapping[str, Any], ours: Mapping[str, Any]
) -> list[str]:
    """Uniforms and bindings, resolved as Doppler resolves them, compared field by field."""
    lines = []
    their_u, our_u = theirs["uniforms"] or {"fields": []}, ours["uniforms"]
    if _differ(their_u.get("size", _ABSENT), our_u["size"]):
        lines.append(
            f"uniforms size: registry {_show(their_u.get('size', _ABSENT))}, WGSL {our_u['size']}"
        )
    their_f, our_f = their_u.get("fields", []), our_u["fields"]
    for n in range(max(len(their_f), len(our_f))):
        t = their_f[n] if n < len(their_f) else None
        o = our_f[n] if n < len(our_f) else None
        if o is None:
            lines.append(f"uniforms field {n}: registry has {_show(t)}, the WGSL struct ends")
        elif t is None:
            lines.append(f"uniforms field {n}: missing from registry (WGSL {_show(o)})")
        elif _differ(t.get("name", _ABSENT), o["name"]):
            lines.append(
                f"uniforms field {n} (offset {o['offset']}): registry names it "
                f"{_show(t.get('name', _ABSENT))}, WGSL {_show(o['name'])}"
            )
        else:
            for key in ("type", "offset"):
                if _differ(t.get(key, _ABSENT), o[key]):
                    lines.append(
                        f"uniforms field {o['name']}: {key} registry {_show(t.get(key, _ABSENT))}, "
                        f"WGSL {_show(o[key])}"
                    )
    their_b = {b["index"]: b for b in theirs["bindings"]}
    our_b = {b["index"]: b for b in ours["bindings"]}
    for index in sorted(set(their_b) | set(our_b)):
        t, o = their_b.get(index), our_b.get(index)
        if o is None:
            lines.append(f"binding {index}: registry has {_show(t)}, the WGSL has no binding")
        elif t is None:
            lines.append(f"binding {index}: missing from registry (WGSL {_show(o)})")
        else:
            for key in ("name", "type"):
                if _differ(t.get(key, _ABSENT), o[key]):
                    lines.append(
                        f"binding {index} {key}: registry {_show(t.get(key, _ABSENT))}, "
                        f"WGSL {_show(o[key])}"
                    )
    return [f"{label}: layout mismatch: {line}" for line in lines]


@dataclass(frozen=True)
class _Vocabulary:
    """Every key the export writes somewhere: at a variant's top level, in its
    variantMetadata, in a pass. A registry entry that has one of them where the export has
    none (a ``passes`` list on a one-kernel variant, a ``wgsl`` beside ``passes``, a
    ``dispatchFold``) would make a host run the kernel differently, so it is a difference."""

    variant: frozenset[str]
    metadata: frozenset[str]
    passes: frozenset[str]

    @classmethod
    def of(cls, registry: Mapping[str, Any]) -> _Vocabulary:
        """The keys this registry uses, and those the exporter writes where a kernel needs them
        (an export without a folding or a multi-pass kernel still knows their keys)."""
        variants = [v for s in registry["operations"].values() for v in s["variants"].values()]
        passes = [p for v in variants for p in v.get("passes", [])]
        return cls(
            (frozenset(k for v in variants for k in v) | _VARIANT_KEYS) - _NOT_VOCABULARY,
            frozenset(k for v in variants for k in v.get("variantMetadata", {})) | _METADATA_KEYS,
            frozenset(k for p in passes for k in p) | _PASS_KEYS,
        )


def _extra_keys(
    label: str, known: frozenset[str], theirs: Mapping[str, Any], ours: Mapping[str, Any]
) -> list[str]:
    """Keys of the export's vocabulary that the registry has here and the export has not."""
    return [
        f"{label}: {key}: registry {_show(theirs[key])}, WGSL absent"
        for key in sorted(known & set(theirs) - set(ours))
    ]


def _pass_differences(
    label: str, theirs: Mapping[str, Any], ours: Mapping[str, Any], known: frozenset[str]
) -> list[str]:
    """A multi-pass variant: pass count, then each pass's keys in order, then the scratch list."""
    their_passes = theirs.get("passes") if isinstance(theirs.get("passes"), list) else []
    lines = []
    if len(their_passes) != len(ours["passes"]):
        lines.append(
            f"{label}: passes: registry has {len(their_passes)}, WGSL {len(ours['passes'])}"
        )
    for n, (t, o) in enumerate(zip(their_passes, ours["passes"], strict=False)):
        t = t if isinstance(t, dict) else {}
        for key, value in o.items():
            if key in ("bindings", "uniforms"):
                continue
            if _differ(t.get(key, _ABSENT), value):
                lines.append(
                    f"{label}: pass {n} {key}: registry {_show(t.get(key, _ABSENT))}, "
                    f"WGSL {_show(value)}"
                )
        lines += _extra_keys(f"{label}: pass {n}", known, t, o)
        resolved = {"bindings": t.get("bindings") or [], "uniforms": t.get("uniforms")}
        lines += _layout_differences(f"{label}: pass {n} ({o['name']})", resolved, o)
    if _differ(theirs.get("scratch", _ABSENT), ours["scratch"]):
        lines.append(
            f"{label}: scratch: registry {_show(theirs.get('scratch', _ABSENT))}, WGSL "
            f"{_show(ours['scratch'])}"
        )
    return lines


def _resolved(schema: Mapping[str, Any], variant: Mapping[str, Any]) -> dict[str, Any]:
    """A registry variant's bindings and uniforms as Doppler resolves them."""
    return {
        "bindings": merge_bindings(schema.get("baseBindings", []), variant.get("bindingsOverride")),
        "uniforms": variant.get("uniformsOverride", schema.get("baseUniforms")),
    }


def _variant_differences(
    label: str,
    their_schema: Mapping[str, Any],
    theirs: Mapping[str, Any],
    our_schema: Mapping[str, Any],
    ours: Mapping[str, Any],
    known: _Vocabulary,
) -> list[str]:
    lines = _extra_keys(label, known.variant, theirs, ours)
    for key in _COMPARED_KEYS:
        if key not in ours:
            continue
        our_value, their_value = ours[key], theirs.get(key, _ABSENT)
        if key == "requires" and isinstance(their_value, list):
            their_value = sorted(their_value, key=str)
        if key == "wgslOverrides" and (their_value is None or their_value is _ABSENT):
            their_value = {}
        if _differ(their_value, our_value):
            lines.append(f"{label}: {key}: registry {_show(their_value)}, WGSL {_show(our_value)}")
    their_meta = theirs.get("variantMetadata")
    their_meta = their_meta if isinstance(their_meta, dict) else {}
    for key, value in sorted(ours["variantMetadata"].items()):
        if _differ(their_meta.get(key, _ABSENT), value):
            lines.append(
                f"{label}: variantMetadata.{key}: registry {_show(their_meta.get(key, _ABSENT))}, "
                f"WGSL {_show(value)}"
            )
    lines += _extra_keys(
        f"{label}: variantMetadata", known.metadata, their_meta, ours["variantMetadata"]
    )
    if "passes" in ours:
        return lines + _pass_differences(label, theirs, ours, known.passes)
    return lines + _layout_differences(
        label, _resolved(their_schema, theirs), _resolved(our_schema, ours)
    )


def _registry_files(variant: Any) -> list[str]:
    """The kernel files a registry entry points at: its ``wgsl`` and each pass's."""
    if not isinstance(variant, dict):
        return []
    passes = variant.get("passes") if isinstance(variant.get("passes"), list) else []
    entries = [variant, *(p for p in passes if isinstance(p, dict))]
    return [e["wgsl"] for e in entries if isinstance(e.get("wgsl"), str)]


def _digest_keys(variant: Mapping[str, Any]) -> list[str]:
    passes = variant.get("passes") or [variant]
    return [digest_key(p["wgsl"], p["entryPoint"]) for p in passes]


def differences(
    ours: Mapping[str, Any],
    our_digests: Mapping[str, Any],
    theirs: Mapping[str, Any],
    their_digests: Mapping[str, str],
    generated_files: Iterable[str],
) -> list[str]:
    """Every way a Doppler registry and digest table disagree with the export, one per line.

    Per exported variant (in operation, id order): missing from the registry, each mismatched
    field and layout detail, and each missing or stale digest. Then registry entries and digests
    that point at a kernel doppler-gen generates but that no variant declares ("extra").
    Entries for kernels doppler-gen does not generate are not its business and are skipped.
    """
    our_table = our_digests["digests"]
    known = _Vocabulary.of(ours)
    lines: list[str] = []
    for op, our_schema in sorted(ours["operations"].items()):
        their_schema = theirs["operations"].get(op) or {}
        for vid, variant in sorted(our_schema["variants"].items()):
            label = f"{op}.{vid}"
            their_variant = (their_schema.get("variants") or {}).get(vid)
            if their_variant is None:
                lines.append(f"{label}: missing from the registry")
            else:
                lines += _variant_differences(
                    label, their_schema, their_variant, our_schema, variant, known
                )
            for key in _digest_keys(variant):
                if key not in their_digests:
                    lines.append(f"{label}: digest {key}: missing from the digest table")
                elif their_digests[key] != our_table[key]:
                    lines.append(
                        f"{label}: stale digest {key}: table {their_digests[key]}, "
                        f"WGSL {our_table[key]}"
                    )
    files = {PurePosixPath(f).name for f in generated_files}
    for op, schema in sorted(theirs["operations"].items()):
        ours_op = ours["operations"].get(op, {}).get("variants", {})
        for vid, variant in sorted((schema.get("variants") or {}).items()):
            ours_file = [w for w in _registry_files(variant) if PurePosixPath(w).name in files]
            if vid not in ours_op and ours_file:
                lines.append(
                    f"{op}.{vid}: extra: the registry points at {ours_file[0]}, which doppler-gen "
                    f"generates, but no variant declares doppler_id {vid!r} in {op!r}"
                )
    for key in sorted(set(their_digests) - set(our_table)):
        if key.split("#", 1)[0] in files:
            lines.append(f"{key}: extra digest: no exported variant uses this file and entry point")
    return lines
