"""Fault injection: `generate` never destroys, and `check` tells the truth afterwards.

- SIGKILL at random points of `generate` (30 times): every file is its old or its new version,
  `check` names exactly the files that differ from the new tree (temporary files included), and
  the next `generate` completes the tree and removes the temporary files.
- A full disk (a small tmpfs when running as root, else a patched writer), a failing rename, a
  read-only or immutable generated/: one line, exit 2, the old tree intact.
- Concurrent `generate` runs: the second waits for the first; one that cannot get the lock in
  time exits 2 with one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    assert_one_line_error,
    doppler_gen_command,
    edit,
    run_cli,
    snapshot,
)

from doppler_gen import outputs, state

ROOT = os.geteuid() == 0
# the new tree differs from the old in every kernel and in one renamed output, so a run writes,
# removes and replaces the manifest
TEMPLATE_EDIT = ("fn is_masked(", "// tree version 2\nfn is_masked(")
LIB_EDIT = ("// Causal mask", "// causal mask (tree version 2)")
# an output is named after its variant, so a rename renames both
RENAME = (
    'name = "attention_f16kv"\ntemplate = "attention"\noutput = "generated/attention_f16kv.wgsl"',
    'name = "attention_kv16"\ntemplate = "attention"\noutput = "generated/attention_kv16.wgsl"',
)


def toggle(root: Path, version: int) -> None:
    """Switch the project's inputs to tree version 1 or 2 (both are valid projects)."""
    pairs = [
        (root / "templates/attention.wgsl.j2", TEMPLATE_EDIT),
        (root / "templates/lib/attention_common.wgsl.j2", LIB_EDIT),
        (root / "variants.toml", RENAME),
    ]
    for path, (old, new) in pairs:
        if version == 2:
            edit(path, old, new)
        else:
            edit(path, new, old)


def generated_tree(root: Path) -> dict[str, bytes]:
    return snapshot(root / "generated")


def trees(project: Path) -> dict[int, dict[str, bytes]]:
    """The generated/ of version 1 and of version 2 (each written by an undisturbed run)."""
    result = {1: generated_tree(project)}
    toggle(project, 2)
    assert run_cli(project, "generate").exit_code == 0
    result[2] = generated_tree(project)
    toggle(project, 1)
    assert run_cli(project, "generate").exit_code == 0
    assert generated_tree(project) == result[1]
    return result


def expected_report(disk: dict[str, bytes], new: dict[str, bytes]) -> set[str]:
    """What a truthful `check` lists for ``disk`` when ``new`` is what generate would write."""
    lines = set()
    for name in sorted(set(disk) | set(new)):
        path = f"generated/{name}"
        if outputs.LEFTOVER_RE.match(Path(name).name):
            lines.add(f"leftover: {path}")
        elif name not in disk:
            lines.add(f"missing:  {path}")
        elif name not in new:
            lines.add(f"orphaned: {path}")
        elif disk[name] != new[name]:
            lines.add(f"stale:    {path}")
    return lines


def reported(stdout: str) -> set[str]:
    return {
        line.split(" (")[0]
        for line in stdout.splitlines()
        if line.startswith(("stale:", "missing:", "orphaned:", "leftover:"))
    }


# -- SIGKILL -----------------------------------------------------------------------------------

SLOW_STEP_S = 0.003  # each file operation of the child sleeps this long: a slow disk

# The child is a fresh interpreter, not a fork of pytest: by this point the test process may
# hold lavapipe's and wgpu's threads, and a fork of a threaded process can inherit a lock that
# one of them held, leaving the child hung before it writes anything.
CHILD = """
import contextlib, os, sys, time
from doppler_gen import outputs
from doppler_gen.cli import cli

writer, root, pause = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])

def slow(function):
    def wrapper(*args, **kwargs):
        time.sleep(pause)
        return function(*args, **kwargs)
    return wrapper

outputs.stage = slow(outputs.stage)
os.replace, os.link, os.unlink = slow(os.replace), slow(os.link), slow(os.unlink)
run = outputs.Transaction.run

def announce(self, *args, **kwargs):
    os.write(writer, b"w")
    return run(self, *args, **kwargs)

outputs.Transaction.run = announce
with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
    cli.main(["--root", root, "generate"], standalone_mode=True)
"""


@dataclasses.dataclass
class Child:
    """A `generate` in its own process whose file operations are slowed down; ``reader``
    receives one byte when its write transaction begins."""

    process: subprocess.Popen[bytes]
    reader: int

    def started(self, timeout: float = 60.0) -> bool:
        ready, _, _ = select.select([self.reader], [], [], timeout)
        return bool(ready) and os.read(self.reader, 1) == b"w"

    def why(self) -> str:
        """The child's exit status and stderr, for an assertion message."""
        try:
            _, err = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        return f"exit {self.process.returncode}: {err.decode(errors='replace').strip()[-2000:]}"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()
        os.close(self.reader)


def spawn_generate(root: Path) -> Child:
    """Start the child on ``root``; it imports this checkout's doppler_gen, whatever is installed."""
    reader, writer = os.pipe()
    source = str(Path(outputs.__file__).resolve().parents[1])
    inherited = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, inherited]))}
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(writer), str(root), str(SLOW_STEP_S)],
            pass_fds=(writer,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
    finally:
        os.close(writer)
    return Child(process, reader)


def calibrate(root: Path) -> float:
    """Seconds from the start of the transaction to the end of an undisturbed run."""
    child = spawn_generate(root)
    try:
        assert child.started(), f"generate never started writing ({child.why()})"
        start = time.monotonic()
        assert child.process.wait() == 0, child.why()
        return time.monotonic() - start
    finally:
        child.close()


def keep_only_the_tiled_variants(root: Path) -> None:
    """A smaller project (4 kernels) for the many runs below; generate removes the others."""
    toml = root / "variants.toml"
    text = toml.read_text(encoding="utf-8")
    cut = text.index('[[variant]]\nname = "attention_decode_tiered_f16"')
    toml.write_text(text[:cut], encoding="utf-8")
    result = run_cli(root, "generate")
    assert result.exit_code == 0 and " removed" in result.stdout, result.output
    # the tiered, rmsnorm and decode kernels are gone
    kernels = sorted(p.name for p in (root / "generated").glob("*.wgsl"))
    assert kernels == [
        "attention.wgsl",
        "attention_f16.wgsl",
        "attention_f16kv.wgsl",
        "attention_small_f16kv.wgsl",
    ], result.output


def test_sigkill_at_random_points_never_leaves_a_torn_tree(fresh_project: Path) -> None:
    keep_only_the_tiled_variants(fresh_project)
    versions = trees(fresh_project)
    rng = random.Random(11)
    version = 1
    toggle(fresh_project, 2)
    duration = calibrate(fresh_project)  # writes version 2
    print(f"transaction with slowed file operations: {duration:.3f} s")
    version = 2
    outcomes = {"all old": 0, "all new": 0, "mixed": 0, "leftovers": 0}
    for _ in range(30):
        old, new = versions[version], versions[3 - version]
        toggle(fresh_project, 3 - version)
        child = spawn_generate(fresh_project)
        try:
            started = child.started()
            time.sleep(rng.uniform(0, duration * 1.2))
            child.process.send_signal(signal.SIGKILL)
            child.process.wait()
            assert started, f"generate never started writing ({child.why()})"
        finally:
            child.close()
        disk = generated_tree(fresh_project)
        # every file is its old or its new version (or absent where one of them lacks it)
        for name, data in disk.items():
            if not outputs.LEFTOVER_RE.match(Path(name).name):
                assert data in (old.get(name), new.get(name)), f"{name} is torn"
        for name in set(old) & set(new):
            assert name in disk, f"{name} vanished"
        kernels = {n: d for n, d in disk.items() if not outputs.LEFTOVER_RE.match(Path(n).name)}
        outcomes["leftovers"] += kernels != disk
        if kernels not in (old, new):  # killed between two renames: the backups flag it
            assert kernels != disk, "a mixed tree without the transaction's backup files"
        outcomes["all old" if kernels == old else "all new" if kernels == new else "mixed"] += 1
        # check tells the truth about whatever was left
        result = run_cli(fresh_project, "check")
        expected = expected_report(disk, new)
        assert result.exit_code == (1 if expected else 0), result.output
        assert reported(result.stdout) == expected
        # and the next generate completes the job
        again = run_cli(fresh_project, "generate")
        assert again.exit_code == 0, again.output
        assert generated_tree(fresh_project) == new
        version = 3 - version
    print(f"after SIGKILL: {outcomes}")
    assert outcomes["leftovers"] >= 1, outcomes  # the kills did land inside the transaction


# -- a full disk ---------------------------------------------------------------------------------


def grow_every_kernel(root: Path, kib: int) -> None:
    """A template edit that adds ``kib`` KiB of comments to every tiled kernel."""
    comment = "".join(f"// padding line {i:05d} {'x' * 40}\n" for i in range(kib * 1024 // 64))
    edit(root / "templates/attention.wgsl.j2", "fn is_masked(", f"{comment}fn is_masked(")


@contextlib.contextmanager
def small_tmpfs(directory: Path, size: str) -> Iterator[Path]:
    directory.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path, leave: int) -> None:
    """Fill the filesystem of ``directory`` until only about ``leave`` bytes are free."""
    with (directory / "filler").open("wb", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 4096)
    data = (directory / "filler").read_bytes()
    (directory / "filler").write_bytes(data[: max(0, len(data) - leave)])


@pytest.mark.skipif(not ROOT, reason="mounting a tmpfs needs root; see the patched-writer test")
def test_disk_full_on_a_small_tmpfs(fresh_project: Path, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "8m") as mount:  # the project (~3.2 MB) fits, twice over
        project = Path(shutil.copytree(fresh_project, mount / "project"))
        assert run_cli(project, "check").exit_code == 0  # creates .doppler-gen/ and a memo
        before = generated_tree(project)
        grow_every_kernel(project, 64)
        fill(mount, leave=96 * 1024)  # room for one grown kernel, not for all of them
        result = run_cli(project, "generate")
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        assert "No space left on device" in line and "nothing was changed" in line, line
        assert generated_tree(project) == before  # all old, no temporary files
        # check still works on the full disk (its memo cannot be saved): truthful, one line
        stale = run_cli(project, "check")
        assert stale.exit_code == 1 and "stale:    generated/attention.wgsl" in stale.stdout
        assert "Traceback" not in stale.output
        (mount / "filler").unlink()
        assert run_cli(project, "generate").exit_code == 0
        assert run_cli(project, "check").exit_code == 0
        fill(mount, leave=0)
        clean = run_cli(project, "check", "--full")
        assert clean.exit_code == 0 and clean.stderr == "", clean.output


def test_disk_full_with_a_patched_writer(fresh_project: Path, monkeypatch) -> None:
    before = generated_tree(fresh_project)
    grow_every_kernel(fresh_project, 1)
    real_stage = outputs.stage
    calls = []

    def stage_until_full(path, content):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_stage(path, content)

    monkeypatch.setattr(outputs, "stage", stage_until_full)
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert "No space left on device; nothing was changed" in line, line
    assert generated_tree(fresh_project) == before


@pytest.mark.parametrize("hard_links", [True, False])
def test_failed_rename_in_the_middle_restores_the_old_tree(
    fresh_project: Path, monkeypatch, hard_links: bool
) -> None:
    before = generated_tree(fresh_project)
    grow_every_kernel(fresh_project, 1)
    real_replace = os.replace
    calls = []

    def replace_then_fail(source, destination):
        calls.append(destination)
        if len(calls) == 3:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_replace(source, destination)

    monkeypatch.setattr(outputs.os, "replace", replace_then_fail)
    if not hard_links:  # a filesystem without hard links: the backups are kept in memory

        def no_link(source, destination, **options):
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))

        monkeypatch.setattr(outputs.os, "link", no_link)
    result = run_cli(fresh_project, "generate")
    monkeypatch.undo()
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert "Input/output error; nothing was changed" in line, line
    assert generated_tree(fresh_project) == before


def test_interrupt_in_the_middle_restores_the_old_tree(fresh_project: Path, monkeypatch) -> None:
    before = generated_tree(fresh_project)
    grow_every_kernel(fresh_project, 1)
    real_replace = os.replace
    calls = []

    def replace_then_interrupt(source, destination):
        calls.append(destination)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_replace(source, destination)

    monkeypatch.setattr(outputs.os, "replace", replace_then_interrupt)
    result = run_cli(fresh_project, "generate")
    monkeypatch.undo()
    assert result.exit_code == 130
    assert generated_tree(fresh_project) == before


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as in a terminal: a shell's background job (the test
    slices of .ci/test) starts with SIGINT ignored, and a held Ctrl-C then rightly does
    nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_right_after_a_rename_waits_for_a_consistent_tree(
    fresh_project: Path, monkeypatch
) -> None:
    """A SIGINT that landed after a rename and before its undo record left that file new and
    every other old (and, elsewhere, a backup or a staged file behind). It now waits."""
    grow_every_kernel(fresh_project, 1)
    real_replace = os.replace
    calls = []

    def replace_then_ctrl_c(source, destination):
        real_replace(source, destination)
        calls.append(destination)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(outputs.os, "replace", replace_then_ctrl_c)
    result = run_cli(fresh_project, "generate")
    monkeypatch.undo()
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.stderr
    assert len(calls) > 2  # the transaction went on to its end
    assert not list((fresh_project / "generated").rglob("*.tmp"))
    assert run_cli(fresh_project, "check", "--full").exit_code == 0  # all new


@pytest.mark.usefixtures("ctrl_c_raises")
def test_signals_held_during_a_transaction_act_after_it() -> None:
    from doppler_gen.interrupts import deferred_signals

    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with deferred_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            assert seen == []  # held
        assert seen == [signal.SIGTERM]  # delivered to the handler that was in place
        with pytest.raises(KeyboardInterrupt), deferred_signals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_a_failure_while_a_signal_is_held_is_what_is_reported() -> None:
    """A rollback that could not restore a file says so; the Ctrl-C held meanwhile must not
    turn that into a bare "interrupted"."""
    from doppler_gen.errors import DopplerGenError
    from doppler_gen.interrupts import deferred_signals

    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    with pytest.raises(DopplerGenError, match="COULD NOT RESTORE"), deferred_signals():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        raise DopplerGenError("cannot write: EIO; COULD NOT RESTORE generated/x.wgsl")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_an_ignored_sigterm_stays_ignored() -> None:
    from doppler_gen.interrupts import sigterm_raises

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """Make ``directory`` read-only: a read-only bind mount as root (which ignores modes)."""
    if not ROOT:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    bind = subprocess.run(["mount", "--bind", str(directory), str(directory)], check=False)
    if bind.returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=False)


def test_read_only_generated_directory(fresh_project: Path) -> None:
    before = generated_tree(fresh_project)
    grow_every_kernel(fresh_project, 1)
    with read_only(fresh_project / "generated"):
        result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert "cannot write" in line and "nothing was changed" in line, line
    assert generated_tree(fresh_project) == before


def test_read_only_project_that_is_up_to_date(fresh_project: Path) -> None:
    """A read-only checkout: generate has nothing to do, check works without saving a memo."""
    shutil.rmtree(fresh_project / ".doppler-gen", ignore_errors=True)
    with read_only(fresh_project):
        generate = run_cli(fresh_project, "generate")
        check = run_cli(fresh_project, "check")
    assert generate.exit_code == 0, generate.output
    kernels = len(list((fresh_project / "generated").rglob("*.*")))  # every generated file
    assert generate.stdout.endswith(f"0 written, {kernels} unchanged, 0 removed\n"), generate.stdout
    assert check.exit_code == 0 and check.stderr == "", check.output
    assert not (fresh_project / ".doppler-gen").exists()


@pytest.mark.skipif(not ROOT, reason="chattr +i needs root")
@pytest.mark.parametrize(
    ("immutable", "named"),
    [("generated/attention_f16.wgsl", "generated/attention_f16.wgsl"), ("generated", "generated/")],
)
def test_immutable_kernel_or_directory(fresh_project: Path, immutable: str, named: str) -> None:
    """The error names what refused: the kernel, or the directory (whose first staged file,
    the manifest, was once named instead)."""
    target = fresh_project / immutable
    if subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        before = generated_tree(fresh_project)
        grow_every_kernel(fresh_project, 1)
        result = run_cli(fresh_project, "generate")
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        assert line.startswith(f"error: {named}: cannot write: Operation not permitted"), line
        assert "nothing was changed" in line
        assert generated_tree(fresh_project) == before
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=False)


def test_leftover_temporary_files_are_reported_and_cleaned(fresh_project: Path) -> None:
    """What SIGKILL leaves between writing a temporary file and renaming it."""
    generated = fresh_project / "generated"
    empty = generated / ".attention.wgsl.a1b2c3d4.tmp"
    empty.write_bytes(b"")
    partial = generated / ".manifest.json.zz_9yx8w.tmp"
    partial.write_bytes(b'{\n  "format": 1,\n')
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 1
    assert reported(result.stdout) == {
        f"leftover: generated/{empty.name}",
        f"leftover: generated/{partial.name}",
    }
    assert "temporary file of an interrupted generate" in result.stdout
    fixed = run_cli(fresh_project, "generate")
    assert fixed.exit_code == 0, fixed.output
    assert f"removed   generated/{empty.name}" in fixed.stdout
    assert not empty.exists() and not partial.exists()
    assert run_cli(fresh_project, "check").exit_code == 0


# -- concurrency ---------------------------------------------------------------------------------


def test_concurrent_generate_runs(fresh_project: Path) -> None:
    versions = trees(fresh_project)
    toggle(fresh_project, 2)
    command = [*doppler_gen_command(), "--root", str(fresh_project), "generate"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    runs += [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(*run.communicate(timeout=120), run.returncode) for run in runs]
    for _, stderr, code in results:
        assert code == 0, stderr
        assert stderr == ""
    assert generated_tree(fresh_project) == versions[2]
    assert run_cli(fresh_project, "check").exit_code == 0


def test_second_generate_gives_up_after_waiting(fresh_project: Path, monkeypatch) -> None:
    state.ensure_state_dir(fresh_project)
    before = generated_tree(fresh_project)
    grow_every_kernel(fresh_project, 1)
    monkeypatch.setattr(state, "LOCK_WAIT_S", 0.3)
    with open(fresh_project / ".doppler-gen/generate.lock", "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        holder.write("4194305\n")  # a finished run's: above Linux's largest pid
        holder.flush()
        started = time.monotonic()
        result = run_cli(fresh_project, "generate")
        waited = time.monotonic() - started
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line.startswith("error: .doppler-gen/generate.lock: another doppler-gen generate")
    # the process that holds the lock (this one, as the kernel lists it), never the pid in the
    # file, which an earlier run left there; no pid where the kernel cannot say
    assert f"(pid {os.getpid()})" in line or "(pid" not in line, line
    assert "4194305" not in line and "waited 0.3 s" in line, line
    assert waited >= 0.3
    assert generated_tree(fresh_project) == before
    assert run_cli(fresh_project, "generate").exit_code == 0  # the lock is free again


def test_the_lock_holder_is_named_only_if_it_is_there(tmp_path: Path, monkeypatch) -> None:
    """Where the kernel cannot say who holds the lock, the pid in the file is named only if
    that process exists: a finished run's pid named no one."""
    monkeypatch.setattr(state, "_kernel_lock_holder", lambda _handle: None)
    path = tmp_path / "lock"
    for text, named in [
        (f"{os.getpid()}\n", f" (pid {os.getpid()})"),
        ("4194305\n", ""),  # above Linux's largest pid: no such process
        ("9" * 30 + "\n", ""),
        ("not a pid\n", ""),
    ]:
        path.write_text(text)
        handle = os.open(path, os.O_RDONLY)
        try:
            assert state._holder(handle) == named, text
        finally:
            os.close(handle)


# -- the project state directory is never a way out of the project ---------------------------------


@pytest.mark.parametrize("planted", ["lock-link", "state-link", "state-file", "ignore-link"])
def test_state_directory_never_writes_through_a_planted_path(
    fresh_project: Path, tmp_path: Path, planted: str
) -> None:
    """A symlink where the lock, the state directory or its .gitignore belongs once made
    `generate` and `check` write outside the project (the lock truncated its target)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me\n")
    state_path = fresh_project / ".doppler-gen"
    if planted == "lock-link":
        state_path.mkdir()
        (state_path / "generate.lock").symlink_to(victim / "precious.txt")
    elif planted == "state-link":
        state_path.symlink_to(victim, target_is_directory=True)
    elif planted == "state-file":
        state_path.write_text("not a directory\n")
    else:
        state_path.mkdir()
        (state_path / ".gitignore").symlink_to(victim / "created-outside")
    grow_every_kernel(fresh_project, 1)
    result = run_cli(fresh_project, "generate")
    if planted == "ignore-link":  # the lock works; the .gitignore is simply not written
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        why = {"lock-link": "it is a symlink", "state-link": "is a symlink"}
        assert why.get(planted, "is not a directory") in line, line
        assert "File exists" not in line
    check = run_cli(fresh_project, "check")  # works, with or without a memo
    assert check.exit_code == (0 if planted == "ignore-link" else 1), check.output
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
    assert (victim / "precious.txt").read_text() == "keep me\n"


def test_a_fifo_in_place_of_the_memo_does_not_hang_check(fresh_project: Path) -> None:
    state.ensure_state_dir(fresh_project)
    os.mkfifo(fresh_project / ".doppler-gen/check-memo")
    started = time.monotonic()
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 0, result.output
    assert "unchanged since" not in result.stdout  # a full check, then a real memo
    assert time.monotonic() - started < 60
    assert (fresh_project / ".doppler-gen/check-memo").is_file()
