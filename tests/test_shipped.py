"""validate, bench and tune run the committed kernels, and bench/tune judge what they time.

* A committed kernel hand-edited to write zeros must not pass: the tree is stale, so validate,
  bench and tune stop with check's verdict (exit 1) before running anything.
* ``--from-templates`` validates a fresh render instead (the edit is then irrelevant).
* A kernel that is fast but wrong only at the bench shape (a head index that aliases above 32
  heads: every validation case has fewer) is FAIL in bench with no time, and invalid in tune.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, edit, run_cli
from gpu_support import adapter_problem

from doppler_gen.config import load_project
from doppler_gen.outputs import plan, write
from doppler_gen.shipped import StaleTree, load_committed

SMALL = "attention_small_f16kv"
ZEROS = "output[out_offset + d] = acc[d] * inv_l_i;"
needs_adapter = pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
CPU = ("--adapter", "cpu", "--allow-cpu", "--repeats", "20", "--warmup", "0", "--copy-mib", "0")


def _hand_edit(root: Path) -> None:
    edit(root / f"generated/{SMALL}.wgsl", ZEROS, "output[out_offset + d] = 0.0;")


def test_committed_kernels_are_the_files_and_manifest_entries(fresh_project: Path) -> None:
    project = load_project(fresh_project)
    kernels, entries = load_committed(project, (SMALL, "attention_decode_tiered_f16"))
    manifest = json.loads((fresh_project / "generated/manifest.json").read_text())["variants"]
    for kernel, entry in zip(kernels, entries, strict=True):
        assert kernel.text == (fresh_project / kernel.variant.output).read_text()
        assert entry == manifest[kernel.variant.name]
        assert kernel.origins is not None  # compile errors still map to template lines


def test_a_hand_edited_committed_kernel_is_stale(fresh_project: Path) -> None:
    _hand_edit(fresh_project)
    with pytest.raises(StaleTree) as caught:
        load_committed(load_project(fresh_project), ("attention",))  # any selection: whole tree
    assert caught.value.exit_code == 1
    assert f"stale generated/{SMALL}.wgsl" in caught.value.message
    assert "fix with: doppler-gen generate" in caught.value.message


@pytest.mark.parametrize(
    "command",
    [
        ("validate", SMALL, "--quick"),
        ("bench", SMALL, "--shape", "decode:kv=8,h=2,kvh=1,d=8", *CPU),
        ("tune", SMALL, "--shape", "decode:kv=8,h=2,kvh=1,d=8", *CPU[:-2]),
    ],
    ids=["validate", "bench", "tune"],
)
def test_validate_bench_and_tune_refuse_a_stale_tree(
    fresh_project: Path, command: tuple[str, ...]
) -> None:
    _hand_edit(fresh_project)
    result = run_cli(fresh_project, *command)
    assert result.exit_code == 1, result.output
    line = assert_one_line_error(result.stderr)
    assert f"stale generated/{SMALL}.wgsl" in line
    check = run_cli(fresh_project, "check")
    assert check.exit_code == 1
    verdict = check.stderr.strip()  # check's own verdict line, word for word
    assert verdict == "generated/ is out of date (1 file(s)); fix with: doppler-gen generate"
    assert line.startswith(f"error: {verdict} (")
    assert result.stdout == ""


def test_a_missing_manifest_is_stale(fresh_project: Path) -> None:
    (fresh_project / "generated/manifest.json").unlink()
    result = run_cli(fresh_project, "validate", SMALL, "--quick")
    assert result.exit_code == 1
    assert "missing generated/manifest.json" in assert_one_line_error(result.stderr)


@needs_adapter
def test_from_templates_validates_a_fresh_render(fresh_project: Path) -> None:
    _hand_edit(fresh_project)
    result = run_cli(fresh_project, "validate", SMALL, "--quick", "--from-templates", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["ok"] and "--from-templates" in document["kernels"]
    assert document["tier"] == "quick"


@needs_adapter
def test_validate_reports_committed_kernels_and_the_tier(fresh_project: Path) -> None:
    result = run_cli(fresh_project, "validate", SMALL, "--quick", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["kernels"] == "committed generated/" and document["tier"] == "quick"


def _plant_head_alias(root: Path) -> None:
    edit(
        root / "templates/attention.wgsl.j2",
        "let q_offset = query_pos * u.num_heads * head_dim + head_idx * head_dim;",
        "let q_offset = query_pos * u.num_heads * head_dim + (head_idx % 32u) * head_dim;",
    )
    write(plan(load_project(root)))


WIDE = "prefill:q=8,kv=16,h=64,kvh=8,d=16"


@needs_adapter
def test_bench_fails_a_wrong_output_and_does_not_time_it(fresh_project: Path) -> None:
    _plant_head_alias(fresh_project)
    result = run_cli(fresh_project, "bench", SMALL, "--shape", WIDE, *CPU, "--json")
    assert result.exit_code == 1, result.stderr
    (row,) = json.loads(result.stdout)["rows"]
    assert row["status"] == "FAIL" and row["timing"] is None
    assert "wrong output: max abs error" in row["reason"] and "not timed" in row["reason"]


@needs_adapter
def test_bench_times_a_correct_output_at_a_sampled_shape(fresh_project: Path) -> None:
    shape = "prefill:q=300,kv=600,h=4,kvh=2,d=16"  # 720 000 triples: compared on a sample
    result = run_cli(fresh_project, "bench", SMALL, "--shape", shape, *CPU, "--json")
    assert result.exit_code == 0, result.stderr
    (row,) = json.loads(result.stdout)["rows"]
    assert row["status"] == "ok" and row["timing"]["runs"] == 20


@needs_adapter
def test_tune_reports_a_candidate_wrong_at_the_tune_shape_as_invalid(fresh_project: Path) -> None:
    _plant_head_alias(fresh_project)
    args = ("tune", SMALL, "--shape", WIDE, "--max-candidates", "2", *CPU[:-2], "--json")
    result = run_cli(fresh_project, *args)
    assert result.exit_code == 1, result.stderr
    document = json.loads(result.stdout)
    assert document["winner"] is None
    for candidate in document["candidates"]:
        assert candidate["validation"] == "invalid" and candidate["timing"] is None
        assert "wrong output" in candidate["reason"]


@needs_adapter
def test_fail_fast_stops_a_variant_at_its_first_failing_case(fresh_project: Path) -> None:
    _plant_head_alias(fresh_project)
    args = ("validate", SMALL, "--storage-overrun", "--fail-fast", "--json")
    result = run_cli(fresh_project, *args)
    assert result.exit_code == 1, result.stderr
    (variant,) = json.loads(result.stdout)["variants"]
    assert variant["status"] == "FAIL" and variant["failed"] == 1
    assert variant["cases"] == variant["passed"] + 1  # nothing after the first failure
    assert "heads" in variant["failures"][0]["case"]  # only a 33+ head case can see this bug
    assert "stopped there (--fail-fast)" in variant["reason"]
