"""generated/manifest.json: what a host (and the validation harness) needs to drive each kernel.

Built from the generated WGSL itself (parsed by ``wgsl``), plus the host metadata variants.toml
declares. Before a manifest is written, the metadata is cross-checked against the WGSL, so a
variant that says "output f16" but binds ``array<f32>``, or requires ``shader-f16`` without
``enable f16;``, is an error at generate time instead of a silent host bug.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from doppler_gen.config import Variant
from doppler_gen.errors import InterfaceError
from doppler_gen.families import get_family
from doppler_gen.families.base import SCRATCH, UNIFORM
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
    try:
        return parse_module(rendered.text)
    except InterfaceError as exc:
        raise InterfaceError(
            f"cannot read the interface of the generated WGSL: {exc.message}",
            location=f"{rendered.output} (variant {kernel.variant.name})",
        ) from None


def entry_point(rendered: RenderedPass, module: Module) -> str | None:
    """The pass's entry point: the one variants.toml names, else the module's only one."""
    return rendered.spec.entry or module.entry_point


def role_of(variant: Variant, binding: Binding) -> str | None:
    """uniform, scratch (declared by the template), else what the family says (None: unknown)."""
    if binding.address_space == "uniform":
        return UNIFORM
    if binding.name in variant.template.scratch:
        return SCRATCH
    return get_family(variant.template.family).roles.get(binding.name)


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
        # the largest of any pass: what a device's limit must hold
        "workgroup_storage_bytes": max(p["workgroup_storage_bytes"] for p in passes),
        # host metadata: what variants.toml declares (checked against the WGSL by
        # check_metadata) plus the workgroup size the WGSL declares with its override defaults
        "metadata": {**variant.metadata, "workgroup_size": passes[-1]["workgroup_size_default"]},
        "passes": passes,
        "scratch": scratch_entries(variant, modules),
    }
    if len(passes) == 1:
        entry.update({key: passes[0][key] for key in _SHORT_FORM_KEYS})
    return entry


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
    """Raise InterfaceError where variants.toml's host metadata disagrees with the WGSL."""
    if isinstance(modules, Module):
        modules = (modules,)
    where = f"variants.toml:{variant.line}" if variant.line else "variants.toml"
    problems = list(_metadata_problems(variant, tuple(modules)))
    if problems:
        raise InterfaceError(f"variant {variant.name}: {problems[0]}", location=where)


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
    has_f16 = any("f16" in m.enables for m in modules)
    if has_f16 and "shader-f16" not in variant.requires:
        yield 'the WGSL enables f16 but the variant does not list requires = ["shader-f16"]'
    if not has_f16 and "shader-f16" in variant.requires:
        yield "the variant requires shader-f16 but the WGSL has no `enable f16;`"
    has_subgroups = any("subgroups" in m.enables for m in modules)
    if has_subgroups and "subgroups" not in variant.requires:
        yield 'the WGSL enables subgroups but the variant does not list requires = ["subgroups"]'
    if not has_subgroups and "subgroups" in variant.requires:
        yield "the variant requires subgroups but the WGSL has no `enable subgroups;`"
    yield from _role_problems(variant, modules, entries)
    meta = variant.metadata
    yield from get_family(variant.template.family).interface_problems(
        variant, meta, list(zip(specs, modules, strict=True))
    )
    for name in variant.overrides:
        if not any(name in m.overrides for m in modules):
            yield f"overrides sets {name}, which the WGSL does not declare as `override`"
    known: set[str] = set()
    for spec, module, entry in zip(specs, modules, entries, strict=True):
        uniform = next((b for b in module.bindings_of(entry) if b.address_space == "uniform"), None)
        if uniform is None or uniform.type.name not in module.structs:
            yield "the WGSL has no uniform struct binding"
            return
        names = {f.name for f in module.structs[uniform.type.name].fields}
        names |= set(module.overrides) | set(module.constants)
        known |= names
        unknown = sorted(_names_in(spec.dispatch) - names - {"ceil"})
        if unknown:
            yield f"dispatch rule {spec.dispatch!r} uses unknown names {', '.join(unknown)}"
    yield from _scratch_problems(variant, modules, known)


def _role_problems(
    variant: Variant, modules: tuple[Module, ...], entries: list[str]
) -> Iterator[str]:
    """Every binding a pass uses has a role; the same name binds the same type in every pass."""
    family = variant.template.family
    seen: dict[str, Binding] = {}
    for module, entry in zip(modules, entries, strict=True):
        for binding in module.bindings_of(entry):
            if role_of(variant, binding) is None:
                yield (
                    f"binding {binding.name} has no role in family {family!r} (nor is it a "
                    "scratch buffer of the template)"
                )
            first = seen.setdefault(binding.name, binding)
            if str(first.type) != str(binding.type):
                yield (
                    f"binding {binding.name} is {first.type} in one pass and {binding.type} "
                    "in another"
                )


def _scratch_problems(
    variant: Variant, modules: tuple[Module, ...], known: set[str]
) -> Iterator[str]:
    for name, size in variant.template.scratch.items():
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
        unknown = sorted(_names_in(size) - known - {"ceil"})
        if unknown:
            yield f"scratch size {name} = {size!r} uses unknown names {', '.join(unknown)}"


def _names_in(expression: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", expression))


def build_manifest(entries: dict[str, dict[str, Any]]) -> str:
    """The manifest file's text: sorted keys, two-space indent, one trailing newline."""
    document = {
        "generator": "doppler-gen",
        "format": MANIFEST_FORMAT,
        "note": "AUTO-GENERATED by doppler-gen from variants.toml and templates/ - do not edit; "
        "run `doppler-gen generate`.",
        "variants": entries,
    }
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
