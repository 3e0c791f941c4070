"""generated/manifest.json: what a host (and the validation harness) needs to drive each kernel.

Built from the generated WGSL itself (parsed by ``wgsl``), plus the host metadata variants.toml
declares. Before a manifest is written, the metadata is cross-checked against the WGSL, so a
variant that says "output f16" but binds ``array<f32>``, or requires ``shader-f16`` without
``enable f16;``, is an error at generate time instead of a silent host bug.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from doppler_gen.config import Variant
from doppler_gen.errors import InterfaceError
from doppler_gen.render import RenderedKernel
from doppler_gen.wgsl import Module, parse_module

MANIFEST_PATH = "generated/manifest.json"
MANIFEST_FORMAT = 1

# Which binding carries which tensor, per family: the harness and the metadata check use this.
ROLE_BINDINGS = {
    "tiled": {"q": "Q", "kv": "K", "out": "output"},
    "tiered": {"q": "Q", "kv": "K_hot", "out": "output"},
}


def parse_kernel(kernel: RenderedKernel) -> Module:
    """Parse a rendered kernel; a parse failure names the variant."""
    try:
        return parse_module(kernel.text)
    except InterfaceError as exc:
        raise InterfaceError(
            f"cannot read the interface of the generated WGSL: {exc.message}",
            location=f"{kernel.variant.output} (variant {kernel.variant.name})",
        ) from None


def variant_entry(kernel: RenderedKernel, module: Module) -> dict[str, Any]:
    """The manifest entry of one variant."""
    variant = kernel.variant
    uniform = next((b for b in module.bindings if b.address_space == "uniform"), None)
    return {
        "file": variant.output,
        "sha256": hashlib.sha256(kernel.text.encode()).hexdigest(),
        "template": variant.template.source_path,
        "template_name": variant.template.name,
        "family": variant.template.family,
        "description": variant.description,
        "params": dict(sorted(variant.params.items())),
        "entry_point": module.entry_point,
        "workgroup_size": list(module.workgroup_size),
        "workgroup_size_default": list(module.workgroup_size_values()),
        "bindings": [
            {
                "group": b.group,
                "binding": b.binding,
                "name": b.name,
                "address_space": b.address_space,
                "access": b.access,
                "type": str(b.type),
                "element_type": b.element_type,
            }
            for b in sorted(module.bindings, key=lambda b: (b.group, b.binding))
        ],
        "uniforms": _uniform_layout(module, uniform.type.name) if uniform else None,
        "overrides": [
            {"name": o.name, "type": o.type, "default": o.default}
            for o in sorted(module.overrides.values(), key=lambda o: o.name)
        ],
        "constants": dict(sorted(module.constants.items())),
        # values the host passes as pipeline constants (override defaults otherwise apply)
        "pipeline_constants": dict(variant.overrides),
        "requires": list(variant.requires),
        "workgroup_storage_bytes": module.workgroup_storage_bytes,
        # host metadata: what variants.toml declares (checked against the WGSL by
        # check_metadata) plus the workgroup size the WGSL declares with its override defaults
        "metadata": {**variant.metadata, "workgroup_size": list(module.workgroup_size_values())},
    }


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


def check_metadata(variant: Variant, module: Module) -> None:
    """Raise InterfaceError where variants.toml's host metadata disagrees with the WGSL."""
    where = f"variants.toml:{variant.line}" if variant.line else "variants.toml"
    problems = list(_metadata_problems(variant, module))
    if problems:
        raise InterfaceError(f"variant {variant.name}: {problems[0]}", location=where)


def _metadata_problems(variant: Variant, module: Module):
    meta = variant.metadata
    if module.entry_point is None:
        yield "the generated WGSL has no @compute entry point"
        return
    has_f16 = "f16" in module.enables
    if has_f16 and "shader-f16" not in variant.requires:
        yield 'the WGSL enables f16 but the variant does not list requires = ["shader-f16"]'
    if not has_f16 and "shader-f16" in variant.requires:
        yield "the variant requires shader-f16 but the WGSL has no `enable f16;`"
    has_subgroups = "subgroups" in module.enables
    if has_subgroups and "subgroups" not in variant.requires:
        yield 'the WGSL enables subgroups but the variant does not list requires = ["subgroups"]'
    if not has_subgroups and "subgroups" in variant.requires:
        yield "the variant requires subgroups but the WGSL has no `enable subgroups;`"
    roles = ROLE_BINDINGS[variant.template.family]
    for role, key in (("q", "q_dtype"), ("kv", "kv_dtype"), ("out", "out_dtype")):
        binding = module.binding(roles[role])
        if binding is None:
            yield f"the WGSL has no binding named {roles[role]}"
        elif binding.element_type != meta[key]:
            yield (f"{key} = {meta[key]!r} but the WGSL binds {binding.name} as {binding.type}")
    for name in variant.overrides:
        if name not in module.overrides:
            yield f"overrides sets {name}, which the WGSL does not declare as `override`"
    max_head_dim = module.constants.get("MAX_HEAD_DIM")
    if max_head_dim is None and "WORKGROUP_SIZE" in module.overrides:
        max_head_dim = module.overrides["WORKGROUP_SIZE"].default
    if max_head_dim != meta["max_head_dim"]:
        yield f"max_head_dim = {meta['max_head_dim']} but the WGSL allows head_dim up to {max_head_dim}"
    if meta["max_kv_len"] is not None and module.constants.get("MAX_KV_LEN") != meta["max_kv_len"]:
        yield (
            f"max_kv_len = {meta['max_kv_len']} but the WGSL's MAX_KV_LEN is "
            f"{module.constants.get('MAX_KV_LEN')}"
        )
    uniform = next((b for b in module.bindings if b.address_space == "uniform"), None)
    if uniform is None or uniform.type.name not in module.structs:
        yield "the WGSL has no uniform struct binding"
        return
    names = {f.name for f in module.structs[uniform.type.name].fields} | set(module.overrides)
    unknown = sorted(_names_in(variant.template.dispatch) - names - {"ceil"})
    if unknown:
        yield f"dispatch rule {variant.template.dispatch!r} uses unknown names {', '.join(unknown)}"


def _names_in(expression: str) -> set[str]:
    import re

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
