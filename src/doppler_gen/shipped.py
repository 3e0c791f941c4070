"""The kernels that ship: the committed ``generated/*.wgsl`` and manifest, once proven fresh.

``validate``, ``bench`` and ``tune`` run what a host would load, not a private re-render: a
committed kernel hand-edited to write zeros must fail validation, not pass because the validator
rendered the templates again. Before anything runs, the committed files are compared byte for
byte with a fresh render (what ``check`` does); a stale, missing or orphaned file stops the run
with ``check``'s verdict (exit 1). The bytes compared are the bytes run, so a file edited after
the comparison cannot slip in. ``--from-templates`` validates a fresh render of the working
tree instead (while editing templates, before ``generate``).

The source map (template line of each generated line, for compile errors) comes from a render
with origins; it applies because the committed text equals that render.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from doppler_gen.config import Project
from doppler_gen.errors import DopplerGenError
from doppler_gen.manifest import MANIFEST_PATH, parse_kernel, variant_entry
from doppler_gen.outputs import Status, compare, plan, select
from doppler_gen.render import RenderedKernel, Renderer

FIX = "doppler-gen generate"


class StaleTree(DopplerGenError):
    """generated/ differs from a fresh render: the committed kernels are not what ships."""

    exit_code = 1


def out_of_date(problems: int) -> str:
    """The verdict line ``check`` prints for a stale tree (shared, so the two never differ)."""
    return f"generated/ is out of date ({problems} file(s)); fix with: {FIX}"


def stale_message(status: Status) -> str:
    """``check``'s verdict on a stale tree, in one line, naming the files."""
    problems = [f"stale {p}" for p in sorted(status.stale)]
    problems += [f"missing {p}" for p in status.missing]
    problems += [f"orphaned {p}" for p in status.orphaned]
    return (
        f"{out_of_date(len(problems))} ({', '.join(problems)}; `doppler-gen check` shows the "
        "diff; --from-templates validates a fresh render instead)"
    )


def _committed_bytes(project: Project, relative: str) -> bytes | None:
    try:
        return (project.root / relative).read_bytes()
    except OSError:
        return None


def load_committed(
    project: Project, patterns: tuple[str, ...] = ()
) -> tuple[list[RenderedKernel], list[dict[str, Any]]]:
    """The selected variants as committed (kernel text and manifest entry), after proving the
    whole of generated/ equals a fresh render; raises StaleTree (exit 1) otherwise."""
    renderer = Renderer(project)
    fresh = plan(project, (), renderer)
    status = compare(fresh)
    if not status.clean:
        raise StaleTree(stale_message(status))
    manifest_bytes = _committed_bytes(project, MANIFEST_PATH)
    if manifest_bytes is None or manifest_bytes.decode("utf-8") != fresh.files[MANIFEST_PATH]:
        raise StaleTree(stale_message(Status(stale={MANIFEST_PATH: ""})))
    manifest = json.loads(manifest_bytes)["variants"]
    kernels, entries = [], []
    for variant in select(project, patterns):
        mapped = renderer.render(variant, with_origins=True)
        passes = []
        for rendered in mapped.passes:  # one committed file per pass
            committed = _committed_bytes(project, rendered.output)
            if committed is None or committed.decode("utf-8") != rendered.text:
                raise StaleTree(stale_message(Status(stale={rendered.output: ""})))
            passes.append(replace(rendered, text=committed.decode("utf-8")))
        kernels.append(replace(mapped, passes=tuple(passes)))
        entries.append(manifest[variant.name])
    return kernels, entries


def load_rendered(
    project: Project, patterns: tuple[str, ...] = ()
) -> tuple[list[RenderedKernel], list[dict[str, Any]]]:
    """``--from-templates``: the selected variants rendered fresh (with source maps) and their
    manifest entries, whatever generated/ holds."""
    renderer = Renderer(project)
    kernels = [renderer.render(v, with_origins=True) for v in select(project, patterns)]
    return kernels, [variant_entry(k, parse_kernel(k)) for k in kernels]


def load_kernels(
    project: Project, patterns: tuple[str, ...] = (), *, from_templates: bool = False
) -> tuple[list[RenderedKernel], list[dict[str, Any]]]:
    """What validate, bench and tune run: the committed kernels, or a fresh render on request."""
    if from_templates:
        return load_rendered(project, patterns)
    return load_committed(project, patterns)
