"""`tune`: candidate enumeration (pure), the variants.toml edit, and --write on a project copy.

The enumeration is tested on synthetic manifest entries so that the rules (powers of two from
16 up to each override's default, the current configuration first, template parameters before
override constants) are pinned independently of the real templates. On lavapipe, one candidate
that breaks the tiled kernel's BLOCK_SIZE == WORKGROUP_SIZE rule must come out "invalid" from
validation, and --write must leave a project whose `check` passes.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, assert_one_line_error, run_cli

from doppler_gen.config import load_project
from doppler_gen.config_edit import edit_variant_entry
from doppler_gen.errors import ConfigError, DopplerGenError, TemplateError
from doppler_gen.runtime.measure import BenchRow, Settings, Timing
from doppler_gen.runtime.session import choose_adapter, open_device
from doppler_gen.shapes import parse_shape
from doppler_gen.tune import (
    Candidate,
    CandidateRenderer,
    CandidateResult,
    TuneRun,
    _settle_winner,
    contract_changes,
    enumerate_candidates,
    evaluate,
    format_report,
    nearest_candidates,
    override_sweep,
    param_grid_size,
    param_layers,
    write_winner,
)

# -- enumeration (pure) --------------------------------------------------------------------------


def _override(name: str, default: Any, type_: str = "u32") -> dict[str, Any]:
    return {"name": name, "type": type_, "default": default}


def test_override_sweep_is_powers_of_two_from_16_up_to_the_default() -> None:
    entry = {
        "overrides": [
            _override("BLOCK_SIZE", 64),
            _override("ODD", 48),
            _override("TINY", 8),
            _override("SIGNED", 32, "i32"),
            _override("GAIN", 1.5, "f32"),
            _override("FLAG", True, "bool"),
        ]
    }
    assert override_sweep(entry) == {
        "BLOCK_SIZE": [16, 32, 64],
        "ODD": [16, 32, 48],
        "TINY": [8],
        "SIGNED": [16, 32],
    }


def test_param_layers_put_the_current_values_first_and_drop_duplicates() -> None:
    tunable = {"block_size": (16, 32, 64), "unroll": (1, 2)}
    current = {"block_size": 64, "unroll": 1}
    layers = list(param_layers(tunable, current))
    sets = [params for layer in layers for _, params in layer]
    assert sets[0] == {"block_size": 64, "unroll": 1}
    assert len(sets) == 6 and len({tuple(sorted(s.items())) for s in sets}) == 6
    assert [len(layer) for layer in layers] == [1, 3, 2]  # by how many parameters change
    assert sorted(position for layer in layers for position, _ in layer) == list(range(6))
    assert param_grid_size(tunable, current) == 6


def _tiled_like_entry(params: Mapping[str, Any]) -> dict[str, Any]:
    """Like the tiled template: BLOCK_SIZE and WORKGROUP_SIZE default to block_size."""
    block = params["block_size"]
    if block > 64:
        raise TemplateError(f"block_size {block} exceeds the 48 KiB tile budget")
    return {
        "overrides": [
            _override("BLOCK_SIZE", block),
            _override("HEAD_TILE", 64),
            _override("WORKGROUP_SIZE", block),
        ]
    }


def test_enumeration_covers_the_product_current_first_parameters_before_constants() -> None:
    candidates = enumerate_candidates(
        {"block_size": 64, "q_dtype": "f16"}, {}, {"block_size": (16, 32, 64)}, _tiled_like_entry
    )
    # block_size 64: 3*3*3 constants; 32: 2*3*2; 16: 1*3*1
    assert len(candidates) == 27 + 12 + 3
    current = candidates[0]
    assert current.label(current) == "current"
    assert dict(current.constants) == {"BLOCK_SIZE": 64, "HEAD_TILE": 64, "WORKGROUP_SIZE": 64}
    labels = [c.label(current) for c in candidates]
    assert labels[1:3] == ["block_size=16", "block_size=32"]  # parameter-only changes next
    assert labels[3:9] == [
        "BLOCK_SIZE=16",
        "BLOCK_SIZE=32",
        "HEAD_TILE=16",
        "HEAD_TILE=32",
        "WORKGROUP_SIZE=16",
        "WORKGROUP_SIZE=32",
    ]
    assert "BLOCK_SIZE=32 WORKGROUP_SIZE=16" in labels  # invalid pairs are enumerated, not guessed
    assert len(set(labels)) == len(labels)
    distances = [len(c.changes(current)) for c in candidates]
    assert distances == sorted(distances)


def test_a_template_refusal_is_a_candidate_with_the_error() -> None:
    candidates = enumerate_candidates(
        {"block_size": 64}, {}, {"block_size": (64, 128)}, _tiled_like_entry
    )
    refused = [c for c in candidates if c.error]
    assert len(refused) == 1 and dict(refused[0].params) == {"block_size": 128}
    assert "48 KiB" in refused[0].error and not refused[0].constants


def test_recorded_overrides_are_the_current_configuration() -> None:
    candidates = enumerate_candidates(
        {"block_size": 64},
        {"WORKGROUP_SIZE": 64, "HEAD_TILE": 32},
        {"block_size": (32,)},
        _tiled_like_entry,
    )
    current = candidates[0]
    assert dict(current.constants) == {"BLOCK_SIZE": 64, "HEAD_TILE": 32, "WORKGROUP_SIZE": 64}
    assert current.overrides_to_record() == {"HEAD_TILE": 32}
    back_to_default = next(c for c in candidates if c.label(current) == "HEAD_TILE=64")
    assert back_to_default.overrides_to_record() == {}
    # block_size moves WORKGROUP_SIZE's default (to 32) but not HEAD_TILE's: the one-change
    # candidate keeps the recorded HEAD_TILE = 32, and the one dropping it says so
    smaller = next(c for c in candidates if c.label(current) == "block_size=32")
    assert dict(smaller.constants) == {"BLOCK_SIZE": 32, "HEAD_TILE": 32, "WORKGROUP_SIZE": 32}
    assert smaller.overrides_to_record() == {"HEAD_TILE": 32}
    dropped = next(c for c in candidates if c.label(current) == "block_size=32 HEAD_TILE=64")
    assert dropped.overrides_to_record() == {}


def test_a_parameter_candidate_keeps_a_recorded_override_its_default_leaves_alone() -> None:
    """A variant that records REDUCE = 128 (default 1024): "unroll=False" must time unroll
    alone, with REDUCE still 128, and come before the candidate that also drops REDUCE; a
    parameter that moves REDUCE's default (its maximum) moves REDUCE with it."""

    def entry(params: Mapping[str, Any]) -> dict[str, Any]:
        return {"overrides": [_override("REDUCE", params["reduce_max"])]}

    candidates = enumerate_candidates(
        {"unroll": True, "reduce_max": 1024},
        {"REDUCE": 128},
        {"unroll": (False,), "reduce_max": (256,)},
        entry,
    )
    current = candidates[0]
    by_label = {c.label(current): c for c in candidates}
    assert by_label["unroll=False"].constants == {"REDUCE": 128}
    assert by_label["unroll=False REDUCE=1024"].constants == {"REDUCE": 1024}
    labels = [c.label(current) for c in candidates]
    assert labels.index("unroll=False") < labels.index("unroll=False REDUCE=1024")
    assert by_label["reduce_max=256"].constants == {"REDUCE": 256}  # the new default
    assert by_label["reduce_max=256 REDUCE=128"].constants == {"REDUCE": 128}
    # --space: the knobs it does not name are held the same way
    spaced = enumerate_candidates(
        {"unroll": True, "reduce_max": 1024},
        {"REDUCE": 128},
        {"unroll": (False,), "reduce_max": (256,)},
        entry,
        space={"unroll": (False, True), "reduce_max": (256, 1024)},
    )
    held = {c.label(spaced[0]): dict(c.constants) for c in spaced}
    # a recorded value off the swept powers of two is held too
    off_grid = enumerate_candidates(
        {"unroll": True, "reduce_max": 1024},
        {"REDUCE": 100},
        {"unroll": (False,), "reduce_max": (1024,)},
        entry,
    )
    assert {"REDUCE": 100} in [
        dict(c.constants) for c in off_grid if c.label(off_grid[0]) == "unroll=False"
    ]
    assert held == {
        "current": {"REDUCE": 128},
        "unroll=False": {"REDUCE": 128},
        "reduce_max=256": {"REDUCE": 256},
        "reduce_max=256 unroll=False": {"REDUCE": 256},
    }


def test_a_space_sweeps_only_the_knobs_it_names() -> None:
    candidates = enumerate_candidates(
        {"block_size": 64, "q_dtype": "f16"},
        {"HEAD_TILE": 32},
        {"block_size": (16, 32, 64)},
        _tiled_like_entry,
        space={"WORKGROUP_SIZE": (16, 64)},
    )
    current = candidates[0]
    assert [c.label(current) for c in candidates] == ["current", "WORKGROUP_SIZE=16"]
    assert all(c.constants["HEAD_TILE"] == 32 for c in candidates)  # held at the variant's value
    candidates = enumerate_candidates(
        {"block_size": 64},
        {},
        {"block_size": (16, 32, 64)},
        _tiled_like_entry,
        space={"block_size": (32,), "HEAD_TILE": (16, 64)},
    )
    current = candidates[0]
    labels = {c.label(current) for c in candidates}
    assert labels == {"current", "HEAD_TILE=16", "block_size=32", "block_size=32 HEAD_TILE=16"}


def test_a_knob_the_rendering_ignores_gives_no_candidate() -> None:
    """Candidates whose kernel (its digest) and constants a closer candidate already has are
    dropped: `unroll` changes nothing below block_size 64 here, so it only multiplies there."""

    def entry(params: Mapping[str, Any]) -> dict[str, Any]:
        unrolled = params["unroll"] and params["block_size"] >= 64
        digest = f"block{params['block_size']}-{'unrolled' if unrolled else 'loop'}"
        return {"kernel_digest": digest, "overrides": [_override("WORKGROUP_SIZE", 16)]}

    candidates = enumerate_candidates(
        {"block_size": 32, "unroll": False},
        {},
        {"block_size": (32, 64), "unroll": (False, True)},
        entry,
    )
    current = candidates[0]
    assert [c.label(current) for c in candidates] == [
        "current",
        "block_size=64",
        "block_size=64 unroll=True",
    ]
    assert candidates[0].kernel == "block32-loop"
    # without a recorded digest nothing is merged (synthetic entries, older manifests)
    bare = enumerate_candidates(
        {"block_size": 32, "unroll": False},
        {},
        {"block_size": (32, 64), "unroll": (False, True)},
        lambda params: {"overrides": [_override("WORKGROUP_SIZE", 16)]},
    )
    assert len(bare) == 4


def test_no_candidate_of_a_shuffle_free_tiered_kernel_unrolls_its_shuffles() -> None:
    """attention_decode_tiered_f16 has no subgroups: unrolled_shuffles renders the same WGSL,
    so no candidate differs from another by it alone."""
    project = load_project(REPO_ROOT)
    variant = project.variant("attention_decode_tiered_f16")
    renderer = CandidateRenderer(project, variant)
    candidates = enumerate_candidates(
        variant.params, variant.overrides, variant.template.tunable, renderer.entry
    )
    current = candidates[0]
    assert not any("unrolled_shuffles" in c.changes(current) for c in candidates)
    assert len({(c.kernel, tuple(sorted(c.constants.items()))) for c in candidates}) == len(
        candidates
    )


def test_the_real_variants_enumerate() -> None:
    project = load_project(REPO_ROOT)
    for name in ("attention_f16", "attention_decode_tiered_f16"):
        variant = project.variant(name)
        renderer = CandidateRenderer(project, variant)
        candidates = enumerate_candidates(
            variant.params, variant.overrides, variant.template.tunable, renderer.entry
        )
        assert candidates[0].label(candidates[0]) == "current"
        assert all(not c.error for c in candidates), name
        tunable = set(variant.template.tunable)
        assert tunable and all(set(c.params) == tunable for c in candidates)


def _grid_entry(params: Mapping[str, Any]) -> dict[str, Any]:
    """A synthetic entry whose kernel ignores `unused` and whose override default follows `a`."""
    calls.append(dict(params))
    digest = "-".join(f"{k}{v}" for k, v in sorted(params.items()) if k != "unused")
    return {"kernel_digest": digest, "overrides": [_override("WIDTH", 16 * params["a"])]}


calls: list[dict[str, Any]] = []
GRID = {name: (1, 2, 3) for name in ("a", "b", "c", "d", "unused")}  # 243 parameter sets
GRID_CURRENT = {name: 1 for name in GRID}


@pytest.mark.parametrize("limit", [1, 2, 5, 9, 10, 30, 100, 500])
def test_nearest_candidates_are_the_full_enumeration_s_first(limit: int) -> None:
    """Rendering only as deep as the limit needs gives exactly the first candidates of the
    whole grid's enumeration, in the same order."""
    everything = enumerate_candidates(GRID_CURRENT, {}, GRID, _grid_entry)
    calls.clear()
    nearest = nearest_candidates(GRID_CURRENT, {}, GRID, _grid_entry, limit=limit)
    assert [c.key for c in nearest.candidates[:limit]] == [c.key for c in everything[:limit]]
    rendered = {tuple(sorted(c.items())) for c in calls}  # the current set is asked for twice
    assert nearest.parameter_sets == 243 and nearest.rendered == len(rendered)
    if nearest.complete:
        assert [c.key for c in nearest.candidates] == [c.key for c in everything]
    else:
        assert nearest.rendered < 243 and len(nearest.candidates) >= limit


def test_a_huge_grid_is_rendered_only_as_deep_as_the_cap_needs() -> None:
    """37,000 parameter sets of the prefill template were all rendered (about 15 minutes and
    13 GB) before `--max-candidates 1` let the first candidate run."""
    huge = {name: tuple(range(1, 8)) for name in ("a", "b", "c", "d", "e", "f")}  # 117,649
    calls.clear()
    nearest = nearest_candidates(dict.fromkeys(huge, 1), {}, huge, _grid_entry, limit=32)
    assert len(calls) <= 2 + 6 * 6 and nearest.depth == 1 and not nearest.complete
    assert nearest.parameter_sets == 7**6 and len(nearest.candidates) >= 32


def test_a_real_prefill_template_enumerates_quickly() -> None:
    project = load_project(REPO_ROOT)
    variant = project.variant("attention_prefill_large_sg_d64_f16")
    renderer = CandidateRenderer(project, variant)
    nearest = nearest_candidates(
        variant.params, variant.overrides, variant.template.tunable, renderer.entry, limit=32
    )
    assert nearest.parameter_sets > 10_000 and nearest.rendered < 400
    assert (
        len(nearest.candidates) >= 32
        and nearest.candidates[0].label(nearest.candidates[0]) == "current"
    )


def test_a_candidate_failing_the_full_matrix_gives_way_to_the_next(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fastest candidate failed the full matrix and was still reported as the winner (exit
    0), while a slower one that passed was never considered."""
    from doppler_gen import tune

    project = load_project(fresh_project)
    candidates = _small_candidates(project)
    current = _timed(candidates[0], "current", 300.0)
    wrong = _timed(candidates[1], "wrong", 100.0)
    right = _timed(candidates[2], "right", 200.0)
    verdicts = {candidates[1].key: "FAIL: 2 case(s) failed", candidates[2].key: "PASS"}
    judged = []

    def full(device: Any, renderer: Any, candidate: Candidate, settings: Any) -> str:
        judged.append(candidate.key)
        return verdicts[candidate.key]

    monkeypatch.setattr(tune, "_full_validation", full)
    run = _small_run([current, wrong, right])
    run.winner_full_validation = _settle_winner(None, None, run, Settings())
    assert run.winner is right and run.winner_full_validation == "PASS"
    assert judged == [candidates[1].key, candidates[2].key]
    assert wrong.validation == "FAIL" and "full validation matrix: FAIL: 2 case" in wrong.reason
    report = format_report(run)
    assert "winner: right" in report and "full validation matrix: PASS" in report
    verdicts[candidates[2].key] = "FAIL: 1 case(s) failed"
    again = _small_run(
        [
            _timed(candidates[0], "current", 300.0),
            _timed(candidates[1], "w", 100.0),
            _timed(candidates[2], "r", 200.0),
        ]
    )
    assert _settle_winner(None, None, again, Settings()) == ""
    assert again.winner is again.current  # every faster one failed: the current one stays


def test_contract_changes_name_old_and_new() -> None:
    before = {"max_head_dim": 256, "q_dtype": "f16"}
    assert contract_changes(before, {"max_head_dim": 64, "q_dtype": "f16"}) == "max_head_dim 256→64"
    assert contract_changes(before, dict(before)) == ""


# -- editing variants.toml -----------------------------------------------------------------------

TOML = """\
# header comment
[templates.t]
source = "t.wgsl.j2"

[[variant]]
name = "plain"
template = "t"
requires = ["shader-f16"]

[[variant]]
name = "with_params"  # trailing comment
template = "t"
params = { kv_dtype = "f16", block_size = 16 }  # keep me
overrides = { WORKGROUP_SIZE = 16 }

# between entries
[[variant]]
name = "last"
template = "t"
"""


def test_edit_inserts_params_after_the_last_key_and_nothing_else_changes() -> None:
    edited = edit_variant_entry(TOML, "plain", {"max_head_dim": 64}, {"WORKGROUP_SIZE": 64})
    assert (
        edited.replace("params = { max_head_dim = 64 }\noverrides = { WORKGROUP_SIZE = 64 }\n", "")
        == TOML
    )
    assert edited.index("overrides = { WORKGROUP_SIZE = 64 }") < edited.index(
        'name = "with_params"'
    )
    data = tomllib.loads(edited)
    assert data["variant"][0]["params"] == {"max_head_dim": 64}
    assert data["variant"][0]["overrides"] == {"WORKGROUP_SIZE": 64}


def test_edit_merges_params_keeps_their_comment_and_replaces_overrides() -> None:
    edited = edit_variant_entry(
        TOML, "with_params", {"block_size": 32, "head_tile": 32}, {"BLOCK_SIZE": 16}
    )
    assert 'params = { kv_dtype = "f16", block_size = 32, head_tile = 32 }  # keep me\n' in edited
    assert "overrides = { BLOCK_SIZE = 16 }\n" in edited
    assert edited.count("\n") == TOML.count("\n")
    entry = tomllib.loads(edited)["variant"][1]
    assert entry["params"] == {"kv_dtype": "f16", "block_size": 32, "head_tile": 32}
    assert "# between entries" in edited and "# header comment" in edited


def test_edit_removes_an_emptied_overrides_table() -> None:
    edited = edit_variant_entry(TOML, "with_params", {}, {})
    assert "overrides" not in edited
    assert edited.count("\n") == TOML.count("\n") - 1


def test_edit_of_the_last_entry_without_a_trailing_newline() -> None:
    edited = edit_variant_entry(TOML.rstrip("\n"), "last", {"block_size": 32}, {})
    assert tomllib.loads(edited)["variant"][2]["params"] == {"block_size": 32}


def test_edit_refuses_forms_it_cannot_rewrite_safely() -> None:
    sub_table = TOML + "[variant.params]\nblock_size = 16\n"
    with pytest.raises(ConfigError, match=r"\[variant.params\] sub-table"):
        edit_variant_entry(sub_table, "last", {"block_size": 32}, {})
    dotted = TOML.replace('name = "last"\n', 'name = "last"\nparams.block_size = 16\n')
    with pytest.raises(ConfigError, match="one inline table line"):
        edit_variant_entry(dotted, "last", {"block_size": 32}, {})
    with pytest.raises(ConfigError, match="no \\[\\[variant\\]\\] entry named 'nope'"):
        edit_variant_entry(TOML, "nope", {"block_size": 32}, {})


def test_a_description_line_that_reads_like_a_key_is_never_edited() -> None:
    """A multi-line description with a line `overrides = { ... }` lost that line to --write
    (and one on the string's last line made the edit fail as an unterminated string)."""
    body = (
        'description = """the host sets\noverrides = { WORKGROUP_SIZE = 128 }\n'
        '(measured by hand)"""\n'
    )
    text = TOML.replace('name = "plain"\n', 'name = "plain"\n' + body)
    edited = edit_variant_entry(text, "plain", {"block_size": 32}, {"WORKGROUP_SIZE": 64})
    entry = tomllib.loads(edited)["variant"][0]
    assert entry["description"] == tomllib.loads(text)["variant"][0]["description"]
    assert entry["overrides"] == {"WORKGROUP_SIZE": 64} and entry["params"] == {"block_size": 32}
    last = TOML.replace(
        'name = "plain"\n', 'name = "plain"\ndescription = """x\noverrides = { A = 1 }"""\n'
    )
    entry = tomllib.loads(edit_variant_entry(last, "plain", {}, {"WORKGROUP_SIZE": 64}))
    assert entry["variant"][0]["description"] == "x\noverrides = { A = 1 }"


def test_a_spaced_variant_header_is_found() -> None:
    spaced = TOML.replace('[[variant]]\nname = "plain"', '[[ variant ]]  # spaced\nname = "plain"')
    assert spaced != TOML
    edited = edit_variant_entry(spaced, "plain", {"block_size": 32}, {})
    assert tomllib.loads(edited)["variant"][0]["params"] == {"block_size": 32}


# -- on lavapipe ---------------------------------------------------------------------------------


def _cpu_adapter_problem() -> str | None:
    """None when wgpu sees a CPU (lavapipe) Vulkan adapter, else why the test must skip."""
    try:
        from doppler_gen.backends import get_backend, select_adapter

        adapter = select_adapter(get_backend("wgpu").adapters(), "cpu")
    except (DopplerGenError, ImportError, RuntimeError) as error:
        return f"no CPU WebGPU adapter: {error}"
    return None if adapter.is_cpu else "no CPU WebGPU adapter"


needs_cpu_adapter = pytest.mark.skipif(
    _cpu_adapter_problem() is not None, reason=str(_cpu_adapter_problem())
)
TINY_TIERED = "tiered:cold=24,hot=8,h=4,kvh=2,d=16"
# tune of a small tiered variant on lavapipe at a tiny shape
TINY_TUNE = (
    "tune",
    "attention_decode_tiered_f16",
    "--adapter",
    "cpu",
    "--allow-cpu",
    "--shape",
    TINY_TIERED,
)


@needs_cpu_adapter
def test_tune_refuses_a_cpu_adapter_in_one_line() -> None:
    result = run_cli(REPO_ROOT, "tune", "attention_decode_tiered_f16", "--adapter", "cpu")
    assert result.exit_code == 2
    assert "tune measures GPUs;" in assert_one_line_error(result.stderr)


@needs_cpu_adapter
def test_a_block_size_workgroup_size_mismatch_is_invalid_not_timed() -> None:
    from doppler_gen.backends import get_backend

    project = load_project(REPO_ROOT)
    variant = project.variant("attention_small_f16kv")
    renderer = CandidateRenderer(project, variant)
    kernel, entry = renderer.render({"block_size": 32})
    backend = get_backend("wgpu")
    adapter = choose_adapter(backend, "cpu", True, "tune")
    candidate = Candidate(
        {"block_size": 32},
        {"BLOCK_SIZE": 32, "HEAD_TILE": 64, "WORKGROUP_SIZE": 16},
        {"BLOCK_SIZE": 32, "HEAD_TILE": 64, "WORKGROUP_SIZE": 32},
    )
    device = open_device(backend, adapter, kernel.variant.requires, "adapter", timing=True)
    try:
        result = evaluate(
            device,
            renderer,
            candidate,
            "block_size=32 WORKGROUP_SIZE=16",
            parse_shape("prefill:q=16,kv=16,h=2,kvh=1,d=16"),
            Settings(repeats=20, warmup=0),
            entry["metadata"],
            lambda: pytest.fail("a candidate that fails validation must not be timed"),
        )
    finally:
        device.close()
    assert result.validation == "invalid" and result.row is None
    assert "failed" in result.reason or "refused" in result.reason


@needs_cpu_adapter
def test_without_shape_tune_times_the_first_default_shape_the_kernel_can_run() -> None:
    """A split-KV decode kernel's reduce pass needs query_len * num_heads = 65,536 workgroups at
    the tiled family's first default shape, the 2048-query prefill: tune timed every candidate
    there, each one refused, and reported no winner. It takes the decode default instead and
    says why; a prefill kernel keeps the prefill shape."""
    from doppler_gen.backends import get_backend
    from doppler_gen.runtime.runner import KernelRunner
    from doppler_gen.tune import default_shape

    project = load_project(REPO_ROOT)
    backend = get_backend("wgpu")
    adapter = choose_adapter(backend, "cpu", True, "tune")
    picked = {}
    for name in ("attention_decode_split_d64", "attention_prefill_large_d64"):
        kernel, entry = CandidateRenderer(project, project.variant(name)).render({})
        device = open_device(backend, adapter, kernel.variant.requires, "adapter")
        try:
            picked[name] = default_shape("tiled", KernelRunner(device, kernel, entry), 0)
        finally:
            device.close()
    shape, passed_over = picked["attention_decode_split_d64"]
    limit = 65535  # lavapipe's maxComputeWorkgroupsPerDimension, WebGPU's default
    assert shape.label == "decode:kv=8192,h=32,kvh=8,d=64"
    assert passed_over == (
        "prefill:q=2048,kv=2048,h=32,kvh=8,d=64 (65536 workgroups (pass reduce) exceed the "
        f"device limit {limit} per dimension)",
    )
    shape, passed_over = picked["attention_prefill_large_d64"]
    assert (shape.label, passed_over) == ("prefill:q=2048,kv=2048,h=32,kvh=8,d=64", ())
    current = _timed(_small_candidates(project)[0], "current", 300.0)
    passed = picked["attention_decode_split_d64"][1]
    run = TuneRun("x", "decode", "GPU", False, Settings(), [current], 1, 1, passed_over=passed)
    assert run.as_dict()["default_shapes_passed_over"] == list(passed)
    assert f"default shape passed over: {passed[0]}" in format_report(run).splitlines()


@needs_cpu_adapter
def test_tune_json_on_lavapipe(tmp_path: Path) -> None:
    output = tmp_path / "tune.json"
    result = run_cli(
        REPO_ROOT,
        *TINY_TUNE,
        "--space",
        "max_head_dim=256,64",
        "--space",
        "dims_per_lane=8,16",
        "--max-candidates",
        "2",
        "--repeats",
        "20",
        "--warmup",
        "1",
        "--json",
        "--output",
        str(output),
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert json.loads(output.read_text()) == document
    assert document["cpu_adapter"] is True and document["shape"] == TINY_TIERED
    assert document["capped"] is True and document["candidates_run"] == 2
    assert document["candidates_total"] > 2
    current, other = document["candidates"]
    assert current["candidate"] == "current" and current["vs_current"] == 1.0
    assert (
        other["candidate"] == "max_head_dim=64"
        and "max_head_dim 256→64" in other["contract_changes"]
    )
    assert all(
        c["validation"] == "PASS" and c["timing"]["runs"] == 20 for c in document["candidates"]
    )
    assert document["winner"]["candidate"] in ("current", "max_head_dim=64")
    assert document["written"] is None
    # each candidate's result is on stderr as soon as it is known (a run cut short keeps them)
    lines = [line for line in result.stderr.splitlines() if line.startswith("tune: [")]
    assert lines[0] == "tune: [1/2] current" and lines[2] == "tune: [2/2] max_head_dim=64"
    median = document["candidates"][0]["timing"]["median_us"]
    assert re.fullmatch(r"tune: \[1/2\] current: PASS, [0-9.]+ µs \([0-9.]+–[0-9.]+\)", lines[1])
    assert abs(float(lines[1].split(", ")[1].split(" ")[0]) - median) <= 0.06


@needs_cpu_adapter
def test_time_limit_stops_starting_candidates_and_still_reports(fresh_project: Path) -> None:
    """A limit already spent when the first candidate ends: only the current configuration
    runs, and the table, the winner and --write still come (a GPU sweep cut by the clock
    keeps its results instead of dying mid-table)."""
    before = (fresh_project / "variants.toml").read_text()
    result = run_cli(
        fresh_project,
        *TINY_TUNE,
        "--space",
        "dims_per_lane=8,16",
        "--space",
        "keys_per_step=1,2",
        "--max-candidates",
        "3",
        "--time-limit",
        "0.001",
        "--repeats",
        "20",
        "--warmup",
        "0",
        "--write",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["time_cut"] is True and document["time_limit_s"] == 0.001
    assert document["candidates_run"] == 1 and document["capped"] is True
    assert [c["candidate"] for c in document["candidates"]] == ["current"]
    assert document["winner"]["candidate"] == "current"
    assert document["written"]["changed"] is False
    assert (fresh_project / "variants.toml").read_text() == before
    started = [line for line in result.stderr.splitlines() if re.match(r"tune: \[\d/3\] ", line)]
    assert started and all(line.startswith("tune: [1/3] current") for line in started)
    text = run_cli(
        fresh_project,
        *TINY_TUNE,
        "--space",
        "dims_per_lane=8,16",
        "--time-limit",
        "600",
        "--repeats",
        "20",
        "--warmup",
        "0",
    )
    assert text.exit_code == 0, text.stderr
    assert "time limit:" not in text.stdout  # both candidates ran inside the limit
    assert text.stdout.count("PASS") >= 2


def test_time_limit_report_line_names_what_ran(fresh_project: Path) -> None:
    project = load_project(fresh_project)
    candidates = _small_candidates(project)
    results = [_timed(candidates[0], "current", 300.0), _timed(candidates[1], "b", 200.0)]
    run = TuneRun(
        "attention_small_f16kv", "prefill", "synthetic", False, Settings(), results, 42, 12
    )
    assert not run.time_cut and "time limit" not in format_report(run)  # no limit given
    run.time_limit, run.elapsed = 150.0, 151.4
    report = format_report(run)
    assert "capped: kept 12 of 42 candidates (raise --max-candidates)" in report
    assert "time limit: ran 2 of 12 candidates in 151 s (--time-limit 150)" in report
    assert run.winner is results[1]  # the winner is chosen among the candidates that ran


def test_time_limit_must_be_positive() -> None:
    result = run_cli(REPO_ROOT, "tune", "attention_decode_tiered_f16", "--time-limit", "0")
    assert result.exit_code == 2
    assert "--time-limit" in result.stderr


@needs_cpu_adapter
def test_tune_write_records_the_winner_and_check_stays_clean(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timings are made deterministic (time = max_head_dim µs) so that max_head_dim=64 wins;
    validation and the dispatches themselves are real."""
    import doppler_gen.tune as tune_module

    real_measure = tune_module.measure_on_fresh_device

    def measure(*args: Any, constants: dict[str, float] | None = None, **kwargs: Any) -> Any:
        row = real_measure(*args, constants=constants, **kwargs)
        if row.timing is not None and constants:
            max_head_dim = args[2]["params"]["max_head_dim"]
            row.timing = Timing(tuple([max_head_dim * 1e3] * row.timing.runs))
        return row

    monkeypatch.setattr(tune_module, "measure_on_fresh_device", measure)
    before = (fresh_project / "variants.toml").read_text()
    args = [
        *TINY_TUNE,
        "--space",
        "max_head_dim=64,128",
        "--max-candidates",
        "3",
        "--repeats",
        "20",
        "--warmup",
        "0",
        "--write",
        "--json",
    ]
    # the winner narrows the host contract (max_head_dim 256 -> 64): not written without consent
    refused = run_cli(fresh_project, *args)
    assert refused.exit_code == 2
    assert "--accept-contract-change" in refused.stderr
    assert (fresh_project / "variants.toml").read_text() == before
    result = run_cli(fresh_project, *args, "--accept-contract-change")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["winner"]["candidate"] == "max_head_dim=64"
    assert document["written"]["changed"] is True
    assert "generated/attention_decode_tiered_f16.wgsl" in document["written"]["files"]
    after = (fresh_project / "variants.toml").read_text()
    assert after.replace("params = { max_head_dim = 64 }\n", "", 1) == before
    project = load_project(fresh_project)
    assert project.variant("attention_decode_tiered_f16").params["max_head_dim"] == 64
    check = run_cli(fresh_project, "check")
    assert check.exit_code == 0, check.output
    again = run_cli(
        fresh_project,
        *TINY_TUNE,
        "--max-candidates",
        "1",
        "--repeats",
        "20",
        "--warmup",
        "0",
        "--write",
    )
    assert again.exit_code == 0, again.stderr
    assert "the winner is the current configuration; nothing written" in again.stdout
    assert (fresh_project / "variants.toml").read_text() == after


def test_tune_of_an_unknown_variant_is_one_line() -> None:
    result = run_cli(REPO_ROOT, "tune", "no_such_variant")
    assert result.exit_code == 2
    assert "unknown variant 'no_such_variant'" in assert_one_line_error(result.stderr)


@needs_cpu_adapter
@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("bogus=1", "bogus is neither a tunable parameter of template attention_decode_split"),
        ("unroll=maybe", "'maybe' is not true or false"),
        ("kv_splits=many", "'many' is not an integer"),
        ("kv_splits=1.5", "'1.5' is not an integer"),
        ("kv_splits", "expected NAME=V1,V2,..."),
    ],
)
def test_a_bad_space_is_one_line(space: str, message: str) -> None:
    result = run_cli(
        REPO_ROOT, "tune", "attention_decode_split_d64", "--allow-cpu", "--space", space
    )
    assert result.exit_code == 2
    assert message in assert_one_line_error(result.stderr)


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("block_order=bogus,ascending", "'bogus' is not one of the choices of block_order"),
        ("block_k=0", "block_k must be a positive integer"),
    ],
)
def test_space_values_outside_what_variants_toml_accepts_are_refused_first(
    space: str, message: str
) -> None:
    """`--space block_order=bogus` was validated, timed and named the winner (the template
    reads any other word as "ascending"), and --write would have recorded it."""
    tiny = ("--shape", "prefill:q=8,kv=8,h=2,kvh=1,d=16", "--max-candidates", "2")
    result = run_cli(
        REPO_ROOT, "tune", "attention_streaming", "--allow-cpu", *tiny, "--space", space
    )
    assert result.exit_code == 2
    assert message in assert_one_line_error(result.stderr)


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("WORKGROUP_SIZE=0", "WORKGROUP_SIZE = 0: it sizes the dispatch or the workgroup"),
        ("WORKGROUP_SIZE=64,-1", "WORKGROUP_SIZE = -1: out of range for u32"),
        ("WORKGROUP_SIZE=4294967296", "WORKGROUP_SIZE = 4294967296: out of range for u32"),
        ("REDUCE_WORKGROUP_SIZE=0", "REDUCE_WORKGROUP_SIZE = 0: it sizes the dispatch"),
    ],
)
def test_override_space_values_variants_toml_would_refuse_are_refused_before_a_device(
    monkeypatch: pytest.MonkeyPatch, space: str, message: str
) -> None:
    """`--space WORKGROUP_SIZE=0` (or -1, or 2**32) went on to compile and run candidates;
    the same value in `overrides` is a config error. The range checks are variants.toml's."""

    def no_device(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("tune reached for a GPU backend")

    monkeypatch.setattr("doppler_gen.backends.get_backend", no_device)
    result = run_cli(REPO_ROOT, "tune", "attention_decode_tiered_split_short_f16", "--space", space)
    assert result.exit_code == 2, (result.output, result.stderr)
    assert message in assert_one_line_error(result.stderr)


def test_tune_shape_of_the_wrong_family_is_one_line() -> None:
    result = run_cli(REPO_ROOT, "tune", "attention_f16", "--shape", TINY_TIERED)
    assert result.exit_code == 2
    assert "is for tiered kernels; attention_f16 is tiled" in assert_one_line_error(result.stderr)


def _small_candidates(project: Any) -> list[Candidate]:
    """attention_small_f16kv's candidates over its whole tunable grid (no device needed)."""
    variant = project.variant("attention_small_f16kv")
    return enumerate_candidates(
        variant.params,
        variant.overrides,
        variant.template.tunable,
        CandidateRenderer(project, variant).entry,
    )


def _small_run(results: list[CandidateResult], **fields: Any) -> TuneRun:
    """A finished synthetic run of attention_small_f16kv over ``results`` (no device)."""
    return TuneRun(
        "attention_small_f16kv",
        "prefill",
        "synthetic",
        False,
        Settings(),
        results,
        len(results),
        32,
        **fields,
    )


def _timed(candidate: Candidate, label: str, us: float) -> CandidateResult:
    row = BenchRow("attention_small_f16kv", "prefill", "ok", timing=Timing(tuple([us * 1e3] * 20)))
    return CandidateResult(candidate, label, "PASS", row=row)


def test_write_winner_records_params_and_overrides_without_a_gpu(fresh_project: Path) -> None:
    project = load_project(fresh_project)
    candidates = _small_candidates(project)
    current = candidates[0]
    winner = next(c for c in candidates if c.label(current) == "block_size=32 HEAD_TILE=32")
    run = TuneRun(
        "attention_small_f16kv",
        "prefill",
        "synthetic",
        False,
        Settings(),
        [_timed(current, "current", 300.0), _timed(winner, "winner", 200.0)],
        42,
        32,
    )
    with pytest.raises(DopplerGenError, match="did not pass the full validation matrix"):
        write_winner(project, run)  # screened with the quick matrix only: not enough to write
    run.winner_full_validation = "PASS"
    written = write_winner(project, run)
    assert written["changed"] is True and written["summary"] == "block_size=32 HEAD_TILE=32"
    text = (fresh_project / "variants.toml").read_text()
    assert (
        'params = { kv_dtype = "f16", block_size = 32 }\noverrides = { HEAD_TILE = 32 }\n' in text
    )
    reloaded = load_project(fresh_project).variant("attention_small_f16kv")
    assert reloaded.params["block_size"] == 32 and dict(reloaded.overrides) == {"HEAD_TILE": 32}
    manifest = json.loads((fresh_project / "generated" / "manifest.json").read_text())
    assert manifest["variants"]["attention_small_f16kv"]["pipeline_constants"] == {"HEAD_TILE": 32}
    assert run_cli(fresh_project, "check").exit_code == 0
    # back to the original configuration: the overrides line goes away again
    back = TuneRun(
        "attention_small_f16kv",
        "prefill",
        "synthetic",
        False,
        Settings(),
        [_timed(winner, "current", 300.0), _timed(current, "x", 100.0)],
        42,
        32,
        winner_full_validation="PASS",
    )
    project = load_project(fresh_project)
    assert write_winner(project, back)["changed"] is True
    assert "HEAD_TILE" not in (fresh_project / "variants.toml").read_text()
    assert run_cli(fresh_project, "check").exit_code == 0


def test_a_winner_inside_the_current_spread_is_not_a_winner(fresh_project: Path) -> None:
    project = load_project(fresh_project)
    candidates = _small_candidates(project)
    current_timing = Timing(tuple(us * 1e3 for us in [290.0] * 2 + [300.0] * 16 + [310.0] * 2))
    current = CandidateResult(
        candidates[0],
        "current",
        "PASS",
        row=BenchRow("attention_small_f16kv", "prefill", "ok", timing=current_timing),
    )
    noisy = _timed(candidates[1], "noise", 299.5)  # faster median, not below the p10 (299)
    run = TuneRun(
        "attention_small_f16kv", "prefill", "synthetic", False, Settings(), [current, noisy], 2, 32
    )
    assert run.winner is current
    clear = _timed(candidates[1], "clear", 250.0)
    run.results = [current, clear]
    assert run.winner is clear


def test_write_refuses_when_variants_toml_changed_during_the_run(fresh_project: Path) -> None:
    project = load_project(fresh_project)
    candidates = _small_candidates(project)
    run = _small_run(
        [_timed(candidates[0], "current", 300.0), _timed(candidates[1], "w", 100.0)],
        winner_full_validation="PASS",
    )
    path = fresh_project / "variants.toml"
    path.write_text(path.read_text() + "\n# edited meanwhile\n")
    with pytest.raises(DopplerGenError, match="changed while tune ran"):
        write_winner(project, run)
    assert path.read_text().endswith("# edited meanwhile\n")


def test_among_candidates_within_the_fastest_spread_the_simplest_wins(fresh_project: Path) -> None:
    project = load_project(fresh_project)
    candidates = _small_candidates(project)
    spread = Timing(tuple(us * 1e3 for us in [198.0] * 2 + [200.0] * 14 + [202.0] * 4))
    simple = CandidateResult(
        candidates[1],
        "simple",
        "PASS",
        row=BenchRow("v", "prefill", "ok", timing=Timing((200.5e3,) * 20)),
    )
    fancy = CandidateResult(
        candidates[2], "fancy", "PASS", row=BenchRow("v", "prefill", "ok", timing=spread)
    )
    run = TuneRun(
        "attention_small_f16kv",
        "prefill",
        "synthetic",
        False,
        Settings(),
        [_timed(candidates[0], "current", 300.0), simple, fancy],
        3,
        32,
    )
    assert run.winner is simple  # 200.5 µs is within the fastest (200 µs) one's p90 (202)


def test_a_clear_win_is_not_lost_to_a_simpler_candidate_inside_the_current_spread(
    fresh_project: Path,
) -> None:
    """The simplest candidate within the fastest one's spread was taken first and then held to
    the current configuration's p10: a simpler candidate that was only noise (297.5 µs against
    a p10 of 297) made the current configuration win over one 3 % faster (290 µs)."""
    project = load_project(fresh_project)
    candidates = _small_candidates(project)
    current_timing = Timing(tuple(us * 1e3 for us in [297.0] * 3 + [300.0] * 17))
    current = CandidateResult(
        candidates[0],
        "current",
        "PASS",
        row=BenchRow("attention_small_f16kv", "prefill", "ok", timing=current_timing),
    )
    noise = _timed(candidates[1], "noise", 297.5)  # not below the current p10 (297)
    faster_timing = Timing(tuple(us * 1e3 for us in [288.0] * 2 + [290.0] * 14 + [298.0] * 4))
    faster = CandidateResult(
        candidates[2],
        "faster",
        "PASS",
        row=BenchRow("attention_small_f16kv", "prefill", "ok", timing=faster_timing),
    )
    run = _small_run([current, noise, faster])
    assert run.winner is faster
    # within the faster one's spread, the simplest candidate that beats the current p10 wins
    simple = _timed(candidates[1], "simple", 291.0)
    run.results = [current, simple, faster]
    assert run.winner is simple
