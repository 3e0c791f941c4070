"""`validate`: skips say why, refusals happen before dispatch, failures are reported usefully."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from conftest import REPO_ROOT, assert_one_line_error, copy_project, doppler_gen_command, run_cli
from gpu_support import adapter_problem, dawn_problem, open_run_device

from doppler_gen.config import load_project
from doppler_gen.errors import DopplerGenError
from doppler_gen.families.attention import CaseSpec
from doppler_gen.families.tiered import tiered_specs
from doppler_gen.families.tiled import tiled_specs
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.outputs import plan, write
from doppler_gen.render import Renderer
from doppler_gen.runtime.runner import KernelRunner, Refusal, evaluate_dispatch, pack_uniforms
from doppler_gen.runtime.verify import folded_cases
from doppler_gen.validate import case_specs, format_report, validate, validate_all

needs_adapter = pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
SMALL = "attention_small_f16kv"


def _entry(name: str) -> tuple:
    project = load_project(REPO_ROOT)
    kernel = Renderer(project).render(project.variant(name), with_origins=True)
    return kernel, variant_entry(kernel, parse_kernel(kernel))


# -- no adapter needed -----------------------------------------------------------------------


def test_full_matrix_has_at_least_40_cases_per_variant_and_quick_is_a_subset() -> None:
    project = load_project(REPO_ROOT)
    for variant in project.variants:
        _, entry = _entry(variant.name)
        meta = entry["metadata"]
        if entry["family"] == "tiled":
            full, quick = (
                tiled_specs(meta["max_head_dim"], quick=q, seed=0) for q in (False, True)
            )
        elif entry["family"] == "tiered":
            cold = entry["params"]["cold"]
            full, quick = (
                tiered_specs(meta["max_head_dim"], meta["max_kv_len"], cold=cold, quick=q, seed=0)
                for q in (False, True)
            )
        else:
            full, quick = (case_specs(entry, quick=q, seed=0) for q in (False, True))
        # the default tier starts with the family's feature matrix; quick is its subset alone
        # (then, for a folding variant, the quick cases again, folded: runtime/verify.py)
        assert case_specs(entry, seed=0)[: len(full)] == full
        assert quick + folded_cases(entry, seed=0) == case_specs(entry, quick=True, seed=0)
        assert len(full) >= 40, variant.name
        assert 5 <= len(quick) < len(full)


def test_cases_are_deterministic_per_seed() -> None:
    assert tiled_specs(64, quick=False, seed=3) == tiled_specs(64, quick=False, seed=3)
    assert tiled_specs(64, quick=False, seed=3) != tiled_specs(64, quick=False, seed=4)


def test_uniforms_are_packed_by_manifest_offsets() -> None:
    _, entry = _entry("attention_decode_tiered_int8_f16kv")
    layout = entry["uniforms"]
    values = {f["name"]: i + 1 for i, f in enumerate(layout["fields"])}
    values["scale"] = 0.5
    data = pack_uniforms(layout, values)
    assert len(data) == 64
    offsets = {f["name"]: f["offset"] for f in layout["fields"]}
    assert struct.unpack_from("<I", data, offsets["packed_stride"])[0] == values["packed_stride"]
    assert struct.unpack_from("<f", data, offsets["scale"])[0] == 0.5


def test_missing_or_unknown_uniform_is_an_error_not_a_silent_zero() -> None:
    _, entry = _entry("attention_decode_tiered_int8_f16kv")
    layout = entry["uniforms"]
    values = {f["name"]: 1 for f in layout["fields"]}
    del values["packed_stride"]
    with pytest.raises(DopplerGenError, match="packed_stride"):
        pack_uniforms(layout, values)
    values.update(packed_stride=1, hot_layout=1)
    with pytest.raises(DopplerGenError, match="hot_layout"):
        pack_uniforms(layout, values)


def test_dispatch_rule_evaluation() -> None:
    assert (
        evaluate_dispatch(
            "ceil(query_len / BLOCK_SIZE) * num_heads",
            {"query_len": 65, "BLOCK_SIZE": 64, "num_heads": 8},
        )
        == 16
    )
    with pytest.raises(DopplerGenError, match="unknown names"):
        evaluate_dispatch("nope * 2", {})


# -- on an adapter (lavapipe in CI) ----------------------------------------------------------


class _NoDispatch:
    """Wraps a device; any dispatch fails the test (refusals must come first)."""

    def __init__(self, device) -> None:
        self._device = device

    def __getattr__(self, name):
        return getattr(self._device, name)

    def dispatch(self, *args, **kwargs):
        raise AssertionError("dispatched a shape that should have been refused")

    def run(self, *args, **kwargs):
        raise AssertionError("ran a shape that should have been refused")

    def storage_buffer(self, *args, **kwargs):
        raise AssertionError("built buffers for a shape that should have been refused")


@needs_adapter
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "spec", "message"),
    [
        (
            SMALL,
            CaseSpec("too wide", head_dim=65, query_len=2, kv_len=2),
            "head_dim 65 exceeds the kernel's maximum 64",
        ),
        (
            "attention_decode_tiered_f16",
            CaseSpec("too wide", head_dim=257, hot_len=2, hot_window=2),
            "head_dim 257 exceeds the kernel's maximum 256",
        ),
        (
            "attention_decode_tiered_int8_f16kv",
            CaseSpec(
                "too long",
                num_heads=1,
                num_kv_heads=1,
                head_dim=8,
                cold_len=131000,
                hot_len=73,
                hot_start=131000,
                hot_window=128,
                start_pos=131072,
            ),
            "KV length 131073 (cold 131000 + hot 73) exceeds MAX_KV_LEN 131072",
        ),
    ],
)
def test_unsupported_shapes_are_refused_before_dispatch(
    name: str, spec: CaseSpec, message: str
) -> None:
    from doppler_gen.backends import get_backend

    kernel, entry = _entry(name)
    device = open_run_device(get_backend("wgpu"), [kernel], None, "adapter")
    try:
        runner = KernelRunner(_NoDispatch(device), kernel, entry)
        refusal = runner.prepare(spec)
        assert isinstance(refusal, Refusal) and message in refusal.reason
        result = runner.run_case(spec)
        assert result.refused and message in result.refused and not result.passed
    finally:
        device.close()


@needs_adapter
@pytest.mark.gpu
def test_webgpu_default_limits_skip_the_48k_tiles_with_the_reason() -> None:
    run = validate(
        load_project(REPO_ROOT),
        ("attention", SMALL, "attention_decode_tiered_f16"),
        limits="webgpu-default",
        quick=True,
    )
    status = {v.name: v for v in run.variants}
    assert status["attention"].status == "SKIP"
    assert status["attention"].reason == "needs 49152 B workgroup storage; limit 16384"
    assert not status["attention"].cases
    assert status[SMALL].status == "PASS" and status[SMALL].cases
    assert status["attention_decode_tiered_f16"].status == "PASS"
    assert run.ok  # skips are not failures, and at least one variant ran


@needs_adapter
@pytest.mark.gpu
def test_a_run_where_everything_skips_is_not_ok() -> None:
    run = validate(load_project(REPO_ROOT), ("attention",), limits="webgpu-default", quick=True)
    assert [v.status for v in run.variants] == ["SKIP"]
    assert not run.ok


def _mutated(tmp_path: Path, file: str, old: str, new: str) -> Path:
    root = copy_project(tmp_path / "p")
    path = root / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    write(plan(load_project(root)))
    return root


@needs_adapter
@pytest.mark.gpu
def test_compile_error_is_shown_at_the_template_line(tmp_path: Path) -> None:
    file = "templates/attention.wgsl.j2"
    old = "    let query_len = u.query_len;"
    root = _mutated(tmp_path, file, old, "    let query_len: f32 = u.query_len;")
    line = next(
        i
        for i, text in enumerate((root / file).read_text().splitlines(), 1)
        if "let query_len: f32" in text
    )
    result = run_cli(root, "validate", SMALL)
    assert result.exit_code == 1
    assert f"templates/attention.wgsl.j2:{line} (generated/{SMALL}.wgsl:" in result.output
    assert "let query_len: f32 = u.query_len;" in result.output  # the surrounding rendered lines


@needs_adapter
@pytest.mark.gpu
def test_unwritten_output_is_caught_by_the_nan_sentinel(tmp_path: Path) -> None:
    old = '    let out_base = {{ "partial_slot" if partials else "head_idx" }} * head_dim + dim0;'
    root = _mutated(
        tmp_path,
        "templates/lib/tiered_decode.wgsl.j2",
        old,
        "    if (head_idx == 0u) { return; }\n" + old,
    )
    run = validate(load_project(root), ("attention_decode_tiered_f16kv",), quick=True)
    report = run.variants[0]
    assert report.status == "FAIL"
    assert "NaN/Inf left" in report.reason and "seed" in report.reason
    assert all(c.verdict.non_finite > 0 for c in report.failures)


@needs_adapter
@pytest.mark.gpu
def test_cli_json_report_and_exit_code() -> None:
    result = run_cli(
        REPO_ROOT, "validate", SMALL, "attention_decode_tiered_int4_f16kv", "--quick", "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert {v["variant"] for v in report["variants"]} == {
        SMALL,
        "attention_decode_tiered_int4_f16kv",
    }
    for variant in report["variants"]:
        assert variant["status"] == "PASS" and variant["failed"] == 0 and variant["cases"] >= 5
        assert variant["worst"]["error_over_tolerance"] < 1


def test_unknown_variant_is_a_usage_error() -> None:
    result = run_cli(REPO_ROOT, "validate", "no_such_variant")
    assert result.exit_code == 2
    assert "no variant matches 'no_such_variant'" in result.stderr


@needs_adapter
@pytest.mark.gpu
def test_f16_tolerance_catches_a_one_ulp_biased_store(tmp_path: Path) -> None:
    """Tight enough for f16: scaling every output by (1 + 2^-10) must fail."""
    common = "templates/lib/attention_common.wgsl.j2"
    old = '{% if dtype == "f32" %}{{ value }}{% else %}{{ dtype }}({{ value }}){% endif %}'
    new = '{% if dtype == "f32" %}{{ value }}{% else %}{{ dtype }}(({{ value }}) * 1.0009765625){% endif %}'
    root = _mutated(tmp_path, common, old, new)
    run = validate(load_project(root), ("attention_decode_tiered_f16",), quick=False)
    assert run.variants[0].status == "FAIL", run.variants[0].reason


def test_reference_sees_the_rounded_inputs() -> None:
    kernel, entry = _entry("attention_f16")

    class _Dev:
        limits: ClassVar[dict] = {}

    runner = KernelRunner(_Dev(), kernel, entry)  # type: ignore[arg-type]
    data = runner.family.build(CaseSpec("x", query_len=3, kv_len=5, head_dim=8), entry)
    assert data.buffers["Q"].dtype == np.float16
    assert data.reference_inputs["q"] is data.buffers["Q"]


@needs_adapter
@pytest.mark.gpu
def test_f32_tolerance_catches_a_relative_bias_of_one_in_4096(tmp_path: Path) -> None:
    """Tight enough for f32: scaling every f32 output by (1 + 2^-12) must fail."""
    common = "templates/lib/attention_common.wgsl.j2"
    old = '{% if dtype == "f32" %}{{ value }}{% else %}'
    new = '{% if dtype == "f32" %}(({{ value }}) * 1.000244140625){% else %}'
    root = _mutated(tmp_path, common, old, new)
    run = validate(load_project(root), (SMALL, "attention_decode_tiered_int8_f16kv"), quick=False)
    assert [v.status for v in run.variants] == ["FAIL", "FAIL"], [v.reason for v in run.variants]


def test_static_skip_counts_invocations_with_the_recorded_pipeline_constants() -> None:
    from doppler_gen.runtime.session import static_skip

    class _Device:
        features = frozenset({"shader-f16"})
        limits: ClassVar[dict] = {"max-compute-invocations-per-workgroup": 256}

    _, entry = _entry("attention_decode_tiered_f16kv")
    assert static_skip(entry, _Device()) == (None, "")  # type: ignore[arg-type]
    entry["passes"][0]["pipeline_constants"] = {"WORKGROUP_SIZE": 1024}
    skip, _ = static_skip(entry, _Device())  # type: ignore[arg-type]
    assert skip == "needs 1024 invocations per workgroup; limit 256"


@needs_adapter
@pytest.mark.gpu
def test_jobs_give_the_one_process_report(tmp_path: Path) -> None:
    """`validate --jobs 2`: each variant validated in a worker process, the same verdicts,
    reasons, case counts and errors as one process, in the same order; a failing variant
    (f32 outputs scaled by 1 + 2^-12) still fails, a skip keeps its reason."""
    common = "templates/lib/attention_common.wgsl.j2"
    old = '{% if dtype == "f32" %}{{ value }}{% else %}'
    new = '{% if dtype == "f32" %}(({{ value }}) * 1.000244140625){% else %}'
    project = load_project(_mutated(tmp_path, common, old, new))
    names = (SMALL, "rmsnorm_f16", "attention_streaming_sg_d64", "rmsnorm")
    one = validate(project, names, quick=True)
    two = validate(project, names, quick=True, jobs=2)
    assert (one.jobs, two.jobs) == (1, 2)
    assert [v.name for v in two.variants] == [v.name for v in one.variants]
    assert sorted(v.name for v in two.variants) == sorted(names)
    assert {v.name: v.status for v in two.variants}[SMALL] == "FAIL" and two.ok is False
    for a, b in zip(one.variants, two.variants, strict=True):
        assert (a.name, a.status, a.reason) == (b.name, b.status, b.reason)
        assert [(c.spec, c.passed) for c in a.cases] == [(c.spec, c.passed) for c in b.cases]
        assert [c.verdict.max_abs_error for c in a.cases if c.verdict] == [
            c.verdict.max_abs_error for c in b.cases if c.verdict
        ]
    assert two.adapter == one.adapter
    assert "in 2 processes" in format_report(two) and "processes" not in format_report(one)


@needs_adapter
@pytest.mark.gpu
def test_cli_jobs_reports_and_exits_as_one_process() -> None:
    result = run_cli(
        REPO_ROOT, "validate", "rmsnorm", "rmsnorm_f16", "--quick", "--jobs", "2", "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["jobs"] == 2 and [v["variant"] for v in report["variants"]] == [
        "rmsnorm",
        "rmsnorm_f16",
    ]
    assert all(v["status"] == "PASS" for v in report["variants"])
    bad = run_cli(REPO_ROOT, "validate", "rmsnorm", "--jobs", "0")
    assert bad.exit_code == 2 and "--jobs" in bad.stderr


@pytest.mark.gpu
@pytest.mark.skipif(
    (adapter_problem() or dawn_problem()) is not None,
    reason=str(adapter_problem() or dawn_problem()),
)
def test_jobs_bring_every_output_back_for_the_backend_comparison() -> None:
    """--backend all --jobs 2: the outputs come back from the workers, so every case of both
    backends is compared."""
    cross = validate_all(load_project(REPO_ROOT), ("rmsnorm", "rmsnorm_f16"), quick=True, jobs=2)
    assert cross.ok, format_report(cross)
    assert [r.jobs for r in cross.runs] == [2, 2]
    for agreement, report in zip(cross.agreements, cross.runs[0].variants, strict=True):
        assert agreement.status == "AGREE" and agreement.compared == len(report.cases) > 0


def _state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a process from /proc, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        state = _state(int(entry.name)) if entry.name.isdigit() else None
        if state is not None and state[0] != "Z" and state[1] == pid:
            found.append(int(entry.name))
    return found


@needs_adapter
@pytest.mark.gpu
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    ("signum", "whole_group", "code", "said"),
    [
        pytest.param(signal.SIGINT, True, 130, "interrupted\n", id="ctrl-c"),
        pytest.param(signal.SIGTERM, False, 143, "terminated\n", id="sigterm-to-the-parent"),
        # no parent left to speak; multiprocessing's resource tracker may warn on stderr
        pytest.param(signal.SIGKILL, False, -signal.SIGKILL, None, id="sigkill-to-the-parent"),
    ],
)
def test_ending_the_run_leaves_no_worker_running(
    signum: int, whole_group: bool, code: int, said: str | None
) -> None:
    """However `validate --jobs 2` ends, no worker goes on. Ctrl-C (the terminal signals the
    whole group): exit 130 and "interrupted", no traceback from the workers, which leave it to
    the parent. SIGTERM to the parent alone (`kill`, a CI timeout): it stops the workers
    first, exit 143 and "terminated". SIGKILL to the parent alone: the workers notice they
    were orphaned and exit (they used to go on through their queued variants)."""
    process = subprocess.Popen(
        [*doppler_gen_command(), "--root", str(REPO_ROOT), "validate", "--jobs", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    children: list[int] = []
    while len(children) < 3 and time.monotonic() < deadline:  # the tracker and two workers
        time.sleep(0.2)
        children = _children(process.pid)
    assert len(children) >= 3, f"the workers never started: {children}"
    time.sleep(1.0)
    if whole_group:
        os.killpg(process.pid, signum)
    else:
        os.kill(process.pid, signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, (process.returncode, stderr)
    assert said is None or stderr == said, stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        (_state(pid) or ("Z",))[0] != "Z" for pid in children
    ):
        time.sleep(0.2)
    assert all((_state(pid) or ("Z",))[0] == "Z" for pid in children), children


def _stack_smashing_project(tmp_path: Path) -> Path:
    """A project whose f32 RMSNorm kernel nests 10,000 parentheses: naga's recursive parser
    overflows its stack on it and the process compiling it dies of SIGSEGV."""
    root = copy_project(tmp_path / "p")
    path = root / "templates/rmsnorm.wgsl.j2"
    old = "    let base = row * u.size;\n"
    deep = '    let base = {{ "(" * 10000 }}row * u.size{{ ")" * 10000 }};\n'
    planted = f'{{% if dtype == "f32" %}}{deep}{{% else %}}{old}{{% endif %}}\n'
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, planted, 1))
    return root


@needs_adapter
@pytest.mark.gpu
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_kernel_that_kills_its_process_fails_alone(tmp_path: Path, jobs: str) -> None:
    """A compiler crash used to end `validate` with 139 and nothing printed, even under
    --json, or (with --jobs) exit 2 blaming whichever variant was submitted first and
    dropping every finished report. Now only the variant whose process died fails, with the
    signal; the others are validated by a fresh process; exit 1 like any failed variant."""
    root = _stack_smashing_project(tmp_path)
    names = ["rmsnorm", "rmsnorm_f16", "attention_decode_tiered_f16"][: 2 if jobs == "1" else 3]
    options = ["--quick", "--from-templates", "--jobs", jobs, "--json"]
    result = subprocess.run(
        [*doppler_gen_command(), "--root", str(root), "validate", *options, *names],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, (result.returncode, result.stderr)
    report = json.loads(result.stdout)
    statuses = {v["variant"]: (v["status"], v["reason"]) for v in report["variants"]}
    died = "the validation process died (signal 11, SIGSEGV) while validating it"
    assert statuses.pop("rmsnorm") == ("FAIL", died)
    assert statuses == {name: ("PASS", "") for name in names[1:]}


def _endless_project(tmp_path: Path) -> Path:
    """A project whose f32 RMSNorm kernel never finishes (its loop steps by 0)."""
    root = copy_project(tmp_path / "p")
    path = root / "templates/rmsnorm.wgsl.j2"
    old = "    for (var i = tid; i < u.size; i = i + WORKGROUP_SIZE) {\n"
    endless = (
        '{% set step = "0u" if dtype == "f32" else "WORKGROUP_SIZE" %}\n'
        "    for (var i = tid; i < u.size; i = i + {{ step }}) {\n"
    )
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, endless, 1))
    return root


def _endless_run(
    root: Path, *names: str, timeout: str | None, backend: str = "wgpu"
) -> subprocess.Popen[str]:
    """`validate --quick --from-templates --json NAMES` in its own session, Ctrl-C not ignored
    (a background process inherits it ignored), with DOPPLER_GEN_GPU_TIMEOUT set."""
    env = dict(os.environ)
    env.pop("DOPPLER_GEN_GPU_TIMEOUT", None)
    if timeout is not None:
        env["DOPPLER_GEN_GPU_TIMEOUT"] = timeout
    options = ["--quick", "--from-templates", "--json", "--backend", backend]
    return subprocess.Popen(
        [*doppler_gen_command(), "--root", str(root), "validate", *options, *names],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _finish(process: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """The run's stdout and stderr; its whole session is killed if it outlives ``timeout``."""
    try:
        return process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


@needs_adapter
@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend",
    [
        "wgpu",
        pytest.param(
            "dawn",
            marks=pytest.mark.skipif(dawn_problem() is not None, reason=str(dawn_problem())),
        ),
    ],
)
def test_a_kernel_that_never_finishes_fails_after_the_time_limit(
    tmp_path: Path, backend: str
) -> None:
    """An endless kernel hung `validate` for ever. Now the wait for it ends after
    DOPPLER_GEN_GPU_TIMEOUT seconds, that variant FAILs, and the next one runs in a fresh
    worker (the spent device is never asked again). On Dawn the reason was the follow-up
    error of popping the error scopes on the spent instance, without the hint."""
    root = _endless_project(tmp_path)
    process = _endless_run(root, "rmsnorm", "rmsnorm_f16", timeout="2", backend=backend)
    stdout, stderr = _finish(process, timeout=60)
    assert process.returncode == 1, (process.returncode, stderr)
    statuses = {v["variant"]: (v["status"], v["reason"]) for v in json.loads(stdout)["variants"]}
    status, reason = statuses.pop("rmsnorm")
    assert status == "FAIL" and "did not finish" in reason and "within 2 s" in reason, reason
    assert "DOPPLER_GEN_GPU_TIMEOUT sets the limit" in reason, reason
    assert statuses == {"rmsnorm_f16": ("PASS", "")}


@needs_adapter
@pytest.mark.gpu
def test_bench_after_a_kernel_that_never_finishes_ends(tmp_path: Path) -> None:
    """bench runs in one process: after the time limit ended the wait for the endless kernel,
    opening the next row's device blocked behind it for ever, deaf to Ctrl-C. Now that row
    and the rest are FAIL at once ("not run"), and the report comes."""
    root = _endless_project(tmp_path)
    env = {**os.environ, "DOPPLER_GEN_GPU_TIMEOUT": "2"}
    options = ["--from-templates", "--allow-cpu", "--copy-mib", "0", "--no-baseline", "--json"]
    process = subprocess.Popen(
        [*doppler_gen_command(), "--root", str(root), "bench", *options, "rmsnorm", "rmsnorm_f16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    stdout, stderr = _finish(process, timeout=90)
    assert process.returncode == 1, (process.returncode, stderr)
    rows = {r["variant"]: r for r in json.loads(stdout)["rows"]}
    assert rows["rmsnorm"]["status"] == "FAIL" and "did not finish" in rows["rmsnorm"]["reason"]
    assert rows["rmsnorm_f16"]["status"] == "FAIL"
    assert rows["rmsnorm_f16"]["reason"].startswith("not run: an earlier kernel of this run")


@needs_adapter
@pytest.mark.gpu
def test_ctrl_c_stops_a_kernel_that_never_finishes(tmp_path: Path) -> None:
    """Ctrl-C could not stop `validate` while wgpu-native blocked the main thread waiting for
    an endless kernel. Now: exit 130 at once, "interrupted" in JSON, no worker left."""
    process = _endless_run(_endless_project(tmp_path), "rmsnorm", timeout=None)
    time.sleep(6)  # started, compiled, and stuck in the endless dispatch
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = _finish(process, timeout=20)
    assert process.returncode == 130, (process.returncode, stderr)
    assert stderr == "interrupted\n" and json.loads(stdout)["error"]["type"] == "Interrupted"


@pytest.mark.parametrize(
    "args",
    [
        ("validate", "--quick", "rmsnorm"),
        ("bench", "rmsnorm", "--allow-cpu"),
        ("tune", "rmsnorm", "--allow-cpu"),
    ],
)
@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan"])
def test_a_bad_gpu_timeout_is_one_line_before_anything_runs(
    pristine_project: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], value: str
) -> None:
    """It was read by each wait, so every variant failed with its message."""
    monkeypatch.setenv("DOPPLER_GEN_GPU_TIMEOUT", value)
    result = run_cli(pristine_project, *args)
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line == (
        f"error: DOPPLER_GEN_GPU_TIMEOUT={value!r}: must be a positive number of seconds"
    )
    assert result.stdout == ""


@needs_adapter
@pytest.mark.gpu
@pytest.mark.parametrize("jobs", [1, 2])
def test_progress_moves_case_by_case(jobs: int) -> None:
    """Since the cases run in worker processes the bar moved once a variant, at its end: one
    long variant showed no progress at all. The workers now report each case."""
    from doppler_gen.validate import validate

    steps: list[tuple[str, int]] = []
    project = load_project(REPO_ROOT)
    names = ("rmsnorm", "rmsnorm_f16")
    run = validate(
        project, names, quick=True, jobs=jobs, progress=lambda n, s: steps.append((n, s))
    )
    cases = {r.name: len(r.cases) for r in run.variants}
    assert all(r.status == "PASS" for r in run.variants)
    for name in names:
        mine = [step for n, step in steps if n == name]
        assert mine == [1] * cases[name], (name, mine)  # one tick a case, none left over


def test_a_bug_in_a_worker_names_its_exception_first() -> None:
    """The CLI prints an internal error's first line: it read "a validation worker failed:",
    the exception itself lost to the lines below."""
    import multiprocessing
    from types import SimpleNamespace

    from doppler_gen.runtime.workers import WorkerBug, _Run, _Worker

    kernel = SimpleNamespace(variant=SimpleNamespace(name="rmsnorm"))
    run = _Run([kernel], [{}], {"tier": "quick", "seed": 0}, None, None)  # type: ignore[list-item]
    mine, theirs = multiprocessing.Pipe()
    worker = _Worker(process=None, connection=mine, task=(0, 0.0))  # type: ignore[arg-type]
    theirs.send(("bug", 'Traceback (most recent call last):\n  File "x"\nRuntimeError: boom\n'))
    with pytest.raises(WorkerBug) as raised:
        run.collect(worker)
    assert str(raised.value).splitlines()[0] == "in a validation worker: RuntimeError: boom"
    assert 'File "x"' in str(raised.value)  # the traceback stays for --debug
