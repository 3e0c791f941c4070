"""`doppler-gen list`: one row per variant, from a fresh in-memory render."""

from __future__ import annotations

from typing import Any

from doppler_gen.config import Project
from doppler_gen.manifest import parse_kernel
from doppler_gen.render import Renderer

# WebGPU's default maxComputeWorkgroupStorageSize and maxComputeInvocationsPerWorkgroup
WEBGPU_DEFAULT_WORKGROUP_STORAGE = 16384
WEBGPU_DEFAULT_INVOCATIONS = 256


def listing_rows(project: Project) -> list[dict[str, Any]]:
    renderer = Renderer(project)
    rows = []
    for variant in project.variants:
        module = parse_kernel(renderer.render(variant))
        storage = module.workgroup_storage_bytes
        invocations = 1
        for size in module.workgroup_size_values():
            invocations *= size
        meta = variant.metadata
        rows.append(
            {
                "name": variant.name,
                "template": variant.template.source_path,
                "family": variant.template.family,
                "output": variant.output,
                "q_dtype": meta["q_dtype"],
                "kv_dtype": meta["kv_dtype"],
                "out_dtype": meta["out_dtype"],
                "requires": list(variant.requires),
                "workgroup_storage_bytes": storage,
                "workgroup_invocations": invocations,
                "fits_webgpu_defaults": storage <= WEBGPU_DEFAULT_WORKGROUP_STORAGE
                and invocations <= WEBGPU_DEFAULT_INVOCATIONS,
                "max_head_dim": meta["max_head_dim"],
                "max_kv_len": meta["max_kv_len"],
            }
        )
    return rows


def format_listing(rows: list[dict[str, Any]]) -> str:
    headers = [
        "variant",
        "template",
        "output",
        "Q/KV/out",
        "requires",
        "wg storage",
        "WebGPU defaults",
    ]
    table = [
        [
            row["name"],
            row["template"],
            row["output"],
            f"{row['q_dtype']}/{row['kv_dtype']}/{row['out_dtype']}",
            ",".join(row["requires"]) or "-",
            f"{row['workgroup_storage_bytes']} B",
            "fits" if row["fits_webgpu_defaults"] else "exceeds",
        ]
        for row in rows
    ]
    return format_table(headers, table)


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain left-aligned text table."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
    return "\n".join(lines)
