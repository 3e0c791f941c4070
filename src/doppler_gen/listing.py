"""`doppler-gen list`: one row per variant, from a fresh in-memory render."""

from __future__ import annotations

import math
from typing import Any

from doppler_gen.config import Project
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.render import Renderer
from doppler_gen.text_table import format_table

# WebGPU's default maxComputeWorkgroupStorageSize and maxComputeInvocationsPerWorkgroup
WEBGPU_DEFAULT_WORKGROUP_STORAGE = 16384
WEBGPU_DEFAULT_INVOCATIONS = 256
# ... maxComputeWorkgroupSizeX/Y/Z, maxStorageBuffersPerShaderStage, maxUniformBuffersPerShaderStage
WEBGPU_DEFAULT_WORKGROUP_SIZE = (256, 256, 64)
WEBGPU_DEFAULT_STORAGE_BUFFERS = 8
WEBGPU_DEFAULT_UNIFORM_BUFFERS = 12


def over_webgpu_defaults(entry: dict[str, Any]) -> list[str]:
    """What of a variant's manifest entry exceeds WebGPU's default limits (empty: it fits).

    A browser page that requests no limits gets these; a pass binding a ninth storage buffer
    fails to create its pipeline there however little workgroup memory it uses.
    """
    over = []
    storage = entry["workgroup_storage_bytes"]
    if storage > WEBGPU_DEFAULT_WORKGROUP_STORAGE:
        over.append(f"workgroup storage {storage} B > {WEBGPU_DEFAULT_WORKGROUP_STORAGE}")
    for p in entry["passes"]:
        size = p["workgroup_size_default"]
        if math.prod(size) > WEBGPU_DEFAULT_INVOCATIONS:
            over.append(
                f"{p['name']}: {math.prod(size)} invocations > {WEBGPU_DEFAULT_INVOCATIONS}"
            )
        else:  # within the invocations, one axis can still be too long (z: 64)
            for axis, n, cap in zip("xyz", size, WEBGPU_DEFAULT_WORKGROUP_SIZE, strict=False):
                if n > cap:
                    over.append(f"{p['name']}: workgroup size {axis} {n} > {cap}")
        spaces = [b["address_space"] for b in p["bindings"]]
        for space, cap in (
            ("storage", WEBGPU_DEFAULT_STORAGE_BUFFERS),
            ("uniform", WEBGPU_DEFAULT_UNIFORM_BUFFERS),
        ):
            if spaces.count(space) > cap:
                over.append(f"{p['name']}: {spaces.count(space)} {space} buffers > {cap}")
    return over


def listing_rows(project: Project) -> list[dict[str, Any]]:
    """One row per variant; storage and invocations are the largest of any of its passes."""
    renderer = Renderer(project)
    rows = []
    for variant in project.variants:
        kernel = renderer.render(variant)
        entry = variant_entry(kernel, parse_kernel(kernel))
        storage = entry["workgroup_storage_bytes"]
        invocations = max(math.prod(p["workgroup_size_default"]) for p in entry["passes"])
        meta = {k: v for k, v in variant.metadata.items() if k not in ("dispatch", "requires")}
        rows.append(
            {
                "name": variant.name,
                "template": variant.template.source_path,
                "templates": [p.source_path for p in variant.template.passes],
                "family": variant.template.family,
                "output": variant.output,
                "passes": [p["name"] for p in entry["passes"]],
                "files": list(variant.outputs),
                "requires": list(variant.requires),
                "workgroup_storage_bytes": storage,
                "workgroup_invocations": invocations,
                "fits_webgpu_defaults": not over_webgpu_defaults(entry),
                "over_webgpu_defaults": over_webgpu_defaults(entry),
                **meta,
                "metadata": meta,
            }
        )
    return rows


def format_listing(rows: list[dict[str, Any]]) -> str:
    headers = [
        "variant",
        "template",
        "output",
        "family",
        "passes",
        "requires",
        "wg storage",
        "WebGPU defaults",
    ]
    # a multi-pass variant's files are NAME.PASS.wgsl, one template each: its declared output
    # (generated/NAME.wgsl) is no file, and its first pass's template is not all it renders
    table = [
        [
            row["name"],
            ", ".join(dict.fromkeys(row["templates"])),
            ", ".join(row["files"]),
            row["family"],
            str(len(row["passes"])),
            ",".join(row["requires"]) or "-",
            f"{row['workgroup_storage_bytes']} B",
            "fits" if row["fits_webgpu_defaults"] else "exceeds",
        ]
        for row in rows
    ]
    return format_table(headers, table)
