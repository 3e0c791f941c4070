"""The source map (generated line -> template line) and `doppler-gen show`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_cli

from doppler_gen.config import load_project
from doppler_gen.render import HEADER_LINES, RenderedKernel, Renderer

MAIN = "templates/attention.wgsl.j2"
LIB = "templates/lib/attention_common.wgsl.j2"


@pytest.fixture(scope="module")
def kernels(pristine_project: Path) -> dict[str, RenderedKernel]:
    project = load_project(pristine_project)
    renderer = Renderer(project)
    return {v.name: renderer.render(v, with_origins=True) for v in project.variants}


def template_line(root: Path, origin: tuple[str, int]) -> str:
    return (root / origin[0]).read_text(encoding="utf-8").split("\n")[origin[1] - 1]


def line_containing(root: Path, path: str, needle: str, exact: bool = False) -> int:
    """The one line of a template holding ``needle`` (``exact``: that is ``needle``, stripped)."""
    lines = (root / path).read_text(encoding="utf-8").split("\n")
    hits = [
        n
        for n, line in enumerate(lines, 1)
        if (line.strip() == needle if exact else needle in line)
    ]
    assert len(hits) == 1, f"{needle!r} occurs {len(hits)} times in {path}"
    return hits[0]


def generated_line(kernel: RenderedKernel, needle: str) -> int:
    lines = kernel.text.split("\n")
    hits = [number for number, line in enumerate(lines, 1) if needle in line]
    assert hits, f"{needle!r} not generated"
    return hits[0]


def test_enable_f16_maps_to_the_lib_macro(
    pristine_project: Path, kernels: dict[str, RenderedKernel]
) -> None:
    kernel = kernels["attention_f16"]
    number = generated_line(kernel, "enable f16;")
    assert kernel.origin(number) == (
        LIB,
        line_containing(pristine_project, LIB, "enable f16;", exact=True),
    )


def test_is_masked_maps_to_the_main_template(
    pristine_project: Path, kernels: dict[str, RenderedKernel]
) -> None:
    for name in ("attention", "attention_f16", "attention_small_f16kv"):
        kernel = kernels[name]
        number = generated_line(kernel, "fn is_masked(")
        assert kernel.origin(number) == (
            MAIN,
            line_containing(pristine_project, MAIN, "fn is_masked("),
        )


def test_lines_from_a_loop_map_to_the_loop_body(
    pristine_project: Path, kernels: dict[str, RenderedKernel]
) -> None:
    kernel = kernels["attention"]
    k_row, v_row = (
        generated_line(kernel, "fn load_k_row("),
        generated_line(kernel, "fn load_v_row("),
    )
    assert k_row != v_row
    assert kernel.origin(k_row) == kernel.origin(v_row)
    assert kernel.origin(k_row)[0] == MAIN
    assert "fn load_" in template_line(pristine_project, kernel.origin(k_row))


def test_macro_lines_map_to_the_macro(
    pristine_project: Path, kernels: dict[str, RenderedKernel]
) -> None:
    kernel = kernels["attention"]
    number = generated_line(kernel, "fn get_kv_head_idx(")
    assert kernel.origin(number) == (
        LIB,
        line_containing(pristine_project, LIB, "fn get_kv_head_idx("),
    )


def test_every_line_is_mapped_consistently(
    pristine_project: Path, kernels: dict[str, RenderedKernel]
) -> None:
    """Each non-blank body line has an origin, and the template line it names produces it: the
    line's literal text around any {{ }} / {% %} / {# #} matches the generated line (which may
    sit deeper by whole 4-space steps: a macro's output put through `| indent(4)`)."""
    for variant, kernel in kernels.items():
        for rendered in kernel.passes:  # every pass of a multi-pass variant
            name = rendered.output if len(kernel.passes) > 1 else variant
            lines = rendered.text.split("\n")[:-1]
            assert rendered.origins is not None, name
            assert len(rendered.origins) == len(lines), name
            assert all(rendered.origin(n) is None for n in range(1, HEADER_LINES + 2)), name
            for number, line in enumerate(lines, 1):
                origin = rendered.origin(number)
                if number <= HEADER_LINES + 1 or not line.strip():
                    continue
                assert origin is not None, f"{name}:{number}: {line!r} has no origin"
                source = template_line(pristine_project, origin).rstrip()
                parts = re.split(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", source)
                pattern = "(?:    )*" + ".*".join(re.escape(part) for part in parts)
                assert re.fullmatch(pattern, line), (
                    f"{name}:{number} {line!r} <- {origin} {source!r}"
                )


def test_origins_do_not_change_the_text(
    pristine_project: Path, kernels: dict[str, RenderedKernel]
) -> None:
    project = load_project(pristine_project)
    renderer = Renderer(project)
    for variant in project.variants:
        rendered = renderer.render(variant)
        for plain, mapped in zip(rendered.passes, kernels[variant.name].passes, strict=True):
            assert plain.origins is None
            assert plain.text == mapped.text
            assert plain.text == (pristine_project / plain.output).read_text(encoding="utf-8")


def test_origin_out_of_range(kernels: dict[str, RenderedKernel]) -> None:
    kernel = kernels["attention"]
    assert kernel.origin(0) is None
    assert kernel.origin(len(kernel.text.split("\n"))) is None


# -- doppler-gen show ------------------------------------------------------------------------------


def test_show_prints_line_numbers(pristine_project: Path) -> None:
    result = run_cli(pristine_project, "show", "attention_f16")
    assert result.exit_code == 0, result.stderr
    expected = (
        (pristine_project / "generated/attention_f16.wgsl")
        .read_text(encoding="utf-8")
        .split("\n")[:-1]
    )
    shown = result.stdout.split("\n")[:-1]
    assert len(shown) == len(expected)
    width = len(str(len(expected)))
    for number, (out, line) in enumerate(zip(shown, expected, strict=True), 1):
        assert out == f"{number:>{width}} | {line}".rstrip(), out


def test_show_raw_is_exact(pristine_project: Path) -> None:
    for name in ("attention", "attention_small_f16kv"):
        result = run_cli(pristine_project, "show", name, "--raw")
        assert result.exit_code == 0, result.stderr
        expected = (pristine_project / f"generated/{name}.wgsl").read_text(encoding="utf-8")
        assert result.stdout == expected


def test_show_origins(pristine_project: Path) -> None:
    result = run_cli(pristine_project, "show", "attention_f16", "--origins")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    enable = next(line for line in out.splitlines() if line.endswith("| enable f16;"))
    assert f"{LIB}:{line_containing(pristine_project, LIB, 'enable f16;', exact=True)}" in enable
    masked = next(line for line in out.splitlines() if "| fn is_masked(" in line)
    masked_line = line_containing(pristine_project, MAIN, "fn is_masked(")
    assert re.match(
        rf"\s*\d+ {re.escape(MAIN)}:{masked_line}\s+\| ",
        masked,
    )
    header = out.splitlines()[0]
    assert re.match(r"\s*1\s+\| // AUTO-GENERATED from ", header)


def test_show_in_the_real_repository() -> None:
    # read-only: the command renders in memory and never writes
    result = run_cli(REPO_ROOT, "show", "attention", "--raw")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(
        "// AUTO-GENERATED from templates/attention.wgsl.j2 for variant attention "
    )
