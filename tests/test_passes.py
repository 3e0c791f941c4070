"""Multi-pass variants end to end, through the test-only two-pass ``rowsum`` family.

tests/fixtures/twopass declares a template with two passes and a scratch buffer; the family
lives in tests/families/rowsum.py. Nothing in the product knows either, so this also proves
that a family is a plug-in: generate, check, the manifest, validate and bench all work on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, edit, line_of, run_cli
from families import twopass
from families.rowsum import ROWSUM
from gpu_support import adapter_problem

from doppler_gen.config import load_project
from doppler_gen.errors import ConfigError, InterfaceError
from doppler_gen.families import FAMILIES
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.outputs import plan
from doppler_gen.render import Renderer
from doppler_gen.wgsl import parse_module

needs_adapter = pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
rowsum_family = pytest.fixture(autouse=True)(twopass.registered_rowsum)
project = pytest.fixture(twopass.generated_copy)


def _manifest(root: Path) -> dict:
    return json.loads((root / "generated/manifest.json").read_text(encoding="utf-8"))


# -- generate and check --------------------------------------------------------------------------


def test_one_file_per_pass_with_the_generated_header(project: Path) -> None:
    files = sorted(p.name for p in (project / "generated").iterdir() if p.is_file())
    assert files == [
        "manifest.json",
        "rowsum.partials.wgsl",
        "rowsum.reduce.wgsl",
        "rowsum_chunk64.partials.wgsl",
        "rowsum_chunk64.reduce.wgsl",
    ]
    first = (project / "generated/rowsum.reduce.wgsl").read_text(encoding="utf-8").splitlines()[0]
    assert first == (
        "// AUTO-GENERATED from templates/rowsum_reduce.wgsl.j2 for variant rowsum pass reduce "
        "by doppler-gen - do not edit."
    )
    assert run_cli(project, "check").exit_code == 0


def test_generate_is_deterministic_and_check_sees_a_stale_pass(project: Path) -> None:
    before = {p: p.read_bytes() for p in (project / "generated").rglob("*") if p.is_file()}
    assert run_cli(project, "generate").exit_code == 0
    assert {p: p.read_bytes() for p in (project / "generated").rglob("*") if p.is_file()} == before
    edit(project / "generated/rowsum.partials.wgsl", "acc + v * v", "acc + v")
    result = run_cli(project, "check")
    assert result.exit_code == 1 and "rowsum.partials.wgsl" in result.output


def test_a_removed_pass_file_is_an_orphan(project: Path) -> None:
    text = (project / "variants.toml").read_text(encoding="utf-8")
    head, _, _ = text.partition('[[variant]]\nname = "rowsum_chunk64"')
    (project / "variants.toml").write_text(head, encoding="utf-8")
    result = run_cli(project, "generate")
    assert result.exit_code == 0, result.output
    assert not (project / "generated/rowsum_chunk64.reduce.wgsl").exists()


# -- the manifest -------------------------------------------------------------------------------


def test_manifest_records_each_pass_and_the_scratch(project: Path) -> None:
    entry = _manifest(project)["variants"]["rowsum"]
    assert "file" not in entry and "bindings" not in entry  # no short form for two passes
    partials, reduce = entry["passes"]
    assert [partials["name"], reduce["name"]] == ["partials", "reduce"]
    assert partials["file"] == "generated/rowsum.partials.wgsl"
    assert partials["entry_point"] == "partials" and reduce["entry_point"] == "reduce"
    assert partials["dispatch"] == "ceil(size / CHUNK) * rows" and reduce["dispatch"] == "rows"
    assert partials["workgroup_size_default"] == [64, 1, 1]
    assert reduce["workgroup_size_default"] == [1, 1, 1]
    # storage of THAT entry point: reduce uses no workgroup variable, reduce_tiled's tile is not
    # counted; partials' sums is 64 f32
    assert partials["workgroup_storage_bytes"] == 256
    assert reduce["workgroup_storage_bytes"] == 0
    assert entry["workgroup_storage_bytes"] == 256
    roles = {p["name"]: {b["name"]: b["role"] for b in p["bindings"]} for p in entry["passes"]}
    assert roles == {
        "partials": {"params": "uniform", "x": "input", "partial": "scratch"},
        "reduce": {"params": "uniform", "partial": "scratch", "y": "output"},
    }
    assert entry["scratch"] == [
        {"name": "partial", "size": "ceil(size / CHUNK) * rows", "element_type": "f32"}
    ]
    assert entry["metadata"]["dispatch"] == {
        "partials": "ceil(size / CHUNK) * rows",
        "reduce": "rows",
    }
    for record in entry["passes"]:
        assert [f["name"] for f in record["uniforms"]["fields"]] == ["rows", "size"]
        assert record["constants"] == {"CHUNK": 128}
        import hashlib

        text = (project / record["file"]).read_bytes()
        assert record["sha256"] == hashlib.sha256(text).hexdigest()


def test_the_parser_counts_storage_per_entry_point() -> None:
    module = parse_module(
        """
        var<workgroup> a: array<f32, 100>;
        var<workgroup> b: array<u32, 8>;
        fn helper() -> f32 { return a[0]; }
        @compute @workgroup_size(8) fn first() { let x = helper(); }
        @compute @workgroup_size(4, 2) fn second() { b[0] = 1u; }
        """
    )
    assert list(module.entry_points) == ["first", "second"]
    assert module.entry_point is None  # several: a pass must name one
    assert module.entry_storage_bytes("first") == 400
    assert module.entry_storage_bytes("second") == 32
    assert module.workgroup_storage_bytes == 432
    assert module.entry_workgroup_size("second") == (4, 2, 1)


# -- config and interface errors ----------------------------------------------------------------


def _load_error(root: Path, old: str, new: str) -> ConfigError | InterfaceError:
    edit(root / "variants.toml", old, new)
    with pytest.raises((ConfigError, InterfaceError)) as caught:
        project = load_project(root)
        plan(project)
    return caught.value


def test_an_unregistered_family_is_an_error_at_its_line(project: Path) -> None:
    FAMILIES.pop("rowsum")
    text = (project / "variants.toml").read_text(encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_project(project)
    assert caught.value.location == f"variants.toml:{line_of(text, 'family = ')}"
    assert "family 'rowsum' is not registered" in caught.value.message
    result = run_cli(project, "check")
    assert result.exit_code == 2
    assert_one_line_error(result.stderr)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('name = "reduce"', 'name = "partials"', "must match [a-z][a-z0-9_]* and be unique"),
        ('entry = "reduce"', 'entry = "nope"', "has no @compute fn nope"),
        ('entry = "reduce"\n', "", "several @compute entry points (reduce, reduce_tiled)"),
        (
            'dispatch = "rows"',
            'dispatch = "lines"',
            "(pass reduce) 'lines' uses lines, which the WGSL",
        ),
        (
            'partial = "ceil',
            'partial = "ceil(cols) + ceil',
            "uses cols, which no pass of variant rowsum declares",
        ),
        (
            "[templates.rowsum.scratch]\n",
            '[templates.rowsum.scratch]\nextra = "rows"\n',
            "extra is bound by no pass",
        ),
        ('dispatch = "rows"', 'dispatch = "rows"\nwhat = 1', "unknown key 'what'"),
        ('source = "rowsum_reduce.wgsl.j2"', 'source = "missing.wgsl.j2"', "not found"),
    ],
)
def test_pass_and_scratch_errors_name_the_problem(
    project: Path, old: str, new: str, message: str
) -> None:
    error = _load_error(project, old, new)
    assert message in error.message, error.message
    assert error.location and error.location.startswith("variants.toml")


def test_scratch_needs_two_passes(project: Path) -> None:
    text = (project / "variants.toml").read_text(encoding="utf-8")
    start = text.index("[[templates.rowsum.pass]]")
    end = text.index("[templates.rowsum.scratch]")
    single = 'source = "rowsum_partials.wgsl.j2"\ndispatch = "rows"\n\n'
    (project / "variants.toml").write_text(text[:start] + single + text[end:], encoding="utf-8")
    with pytest.raises(ConfigError, match="scratch buffers need two or more passes"):
        load_project(project)


def test_a_single_pass_variant_keeps_the_short_form(pristine_project: Path) -> None:
    project = load_project(pristine_project)
    kernel = Renderer(project).render(project.variant("attention_small_f16kv"))
    entry = variant_entry(kernel, parse_kernel(kernel))
    assert [p["name"] for p in entry["passes"]] == ["main"]
    assert entry["file"] == entry["passes"][0]["file"] == "generated/attention_small_f16kv.wgsl"
    assert entry["scratch"] == []


# -- on a device ----------------------------------------------------------------------------


@needs_adapter
@pytest.mark.gpu
def test_validate_runs_both_passes_in_one_command_buffer(project: Path) -> None:
    from gpu_support import open_run_device

    from doppler_gen.backends import get_backend
    from doppler_gen.runtime.runner import KernelRunner, Prepared

    loaded = load_project(project)
    kernel = Renderer(loaded).render(loaded.variant("rowsum"))
    entry = variant_entry(kernel, parse_kernel(kernel))
    device = open_run_device(get_backend("wgpu"), [kernel], None, "adapter")
    runs: list[int] = []
    original = device.run
    device.run = lambda steps: (runs.append(len(steps)), original(steps))[1]  # type: ignore[method-assign]
    try:
        runner = KernelRunner(device, kernel, entry)
        spec = ROWSUM.specs(entry, "default", 0)[4]
        prepared = runner.prepare(spec)
        assert isinstance(prepared, Prepared)
        assert prepared.scratch_bytes == {"partial": 4 * 8 * 5}  # ceil(1000 / 128) * 5 rows
        verdict = runner.judge(prepared, runner.run(prepared))
        assert verdict.passed, verdict
    finally:
        device.close()
    assert runs == [2]


@needs_adapter
@pytest.mark.gpu
def test_validate_and_bench_on_the_cli(project: Path, tmp_path: Path) -> None:
    result = run_cli(project, "validate", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [v["status"] for v in document["variants"]] == ["PASS", "PASS"]
    assert all(v["cases"] == 8 and v["passed"] == 8 for v in document["variants"])
    output = tmp_path / "bench.json"
    bench = run_cli(
        project,
        "bench",
        "rowsum",
        "--allow-cpu",
        "--adapter",
        "cpu",
        "--shape",
        "rowsum:rows=4,size=3000",
        "--repeats",
        "20",
        "--warmup",
        "1",
        "--copy-mib",
        "0",
        "--json",
        "--output",
        str(output),
    )
    assert bench.exit_code == 0, bench.output
    rows = json.loads(output.read_text(encoding="utf-8"))["rows"]
    assert [r["status"] for r in rows] == ["ok"]
    assert set(rows[0]["pass_timings"]) == {"partials", "reduce"}
    assert rows[0]["split_pass_total"]["runs"] == 20  # the compute-pass-each encoding's whole
    assert rows[0]["timing"]["runs"] == 20
    assert rows[0]["bytes"] == 4 * 4 * 3000 + 4 * 4  # x read once, y written once


@needs_adapter
@pytest.mark.gpu
def test_an_unwritten_scratch_slot_is_caught_by_the_nan_poison(project: Path) -> None:
    """The partials pass skips the last chunk of each row: the reduce reads poisoned scratch."""
    edit(
        project / "templates/rowsum_partials.wgsl.j2",
        "    if (lid.x == 0u) {",
        "    if (lid.x == 0u && (chunk + 1u < chunks || chunks == 1u)) {",
    )
    assert run_cli(project, "generate").exit_code == 0
    result = run_cli(project, "validate", "rowsum", "--json")
    assert result.exit_code == 1
    variant = json.loads(result.stdout)["variants"][0]
    assert variant["status"] == "FAIL"
    assert variant["failures"] and variant["failures"][0]["non_finite"] > 0


def test_show_prints_every_pass_or_the_one_asked_for(project: Path) -> None:
    both = run_cli(project, "show", "rowsum")
    assert both.exit_code == 0, both.output
    assert "// == pass partials (generated/rowsum.partials.wgsl)" in both.stdout
    assert "// == pass reduce (generated/rowsum.reduce.wgsl)" in both.stdout
    raw = run_cli(project, "show", "rowsum", "--raw", "--pass", "reduce")
    assert raw.exit_code == 0
    assert raw.stdout == (project / "generated/rowsum.reduce.wgsl").read_text(encoding="utf-8")
    refused = run_cli(project, "show", "rowsum", "--raw")
    assert refused.exit_code == 2 and "add --pass NAME" in refused.stderr
    assert_one_line_error(refused.stderr)
    unknown = run_cli(project, "show", "rowsum", "--pass", "nope")
    assert unknown.exit_code == 2 and "passes: partials, reduce" in unknown.stderr


def test_list_names_each_pass_file_and_template(project: Path) -> None:
    """list showed a multi-pass variant's declared output (generated/rowsum.wgsl, no file) and
    only its first pass's template."""
    listing = run_cli(project, "list")
    assert listing.exit_code == 0, listing.output
    row = next(line for line in listing.stdout.splitlines() if line.startswith("rowsum "))
    assert "generated/rowsum.partials.wgsl, generated/rowsum.reduce.wgsl" in row
    assert "templates/rowsum_partials.wgsl.j2, templates/rowsum_reduce.wgsl.j2" in row
    assert "generated/rowsum.wgsl" not in row
    rows = json.loads(run_cli(project, "list", "--json").stdout)
    assert rows[0]["templates"] == [
        "templates/rowsum_partials.wgsl.j2",
        "templates/rowsum_reduce.wgsl.j2",
    ]
