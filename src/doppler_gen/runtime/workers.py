"""Validating variants in worker processes, each with its own device (``validate``).

Why: a kernel can kill the process that compiles or runs it (naga overflows its stack on a
deeply nested expression: SIGSEGV), and a process that dies says nothing, not even under
``--json``. So the GPU work of ``validate`` never runs in the process that reports: one worker
process without ``--jobs``, N with ``--jobs N``. Each worker holds exactly one variant at a
time, so when one dies the parent knows which variant killed it: that variant is FAIL ("the
validation process died (signal 11, SIGSEGV) while validating it"), the reports already
finished are kept, and a fresh worker goes on with the variants left. A worker whose device
did not finish its GPU work in time (``backends.base.gpu_wait_seconds``) sends its report
(FAIL, "did not finish within N s") and exits: that device is unusable, and a fresh worker
takes the next variant.

On a CPU adapter (lavapipe) most of a validation run is compiling pipelines, and a pipeline
compiles on one core; N processes use N cores. A worker opens its device once, on its first
variant, and keeps it; variants are handed out one at a time, so a slow one does not hold back
the others. Reports come back in the order the variants were asked for, and each variant is
validated exactly as in one process (``verify.validate_variant``).

Workers are started with ``spawn``, not ``fork``: a forked child would inherit the parent's
driver threads and handles. On a GPU the workers share it.

Workers never outlive the run. Ctrl-C and SIGTERM in the parent stop them at once (the parent
only waits on pipes, so it takes Ctrl-C even while a kernel never finishes); if the parent
dies without a word (SIGKILL, a crash), each worker notices within a fraction of a second that
it was orphaned and exits. Without this a killed ``validate --jobs`` left workers that went on
through the variants already queued to them, each still compiling on a core.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from doppler_gen.backends import Device, get_backend
from doppler_gen.backends.base import leave_if_spent, process_spent
from doppler_gen.errors import DopplerGenError
from doppler_gen.families import register_family, registered_at_run_time
from doppler_gen.families.base import Family
from doppler_gen.interrupts import handled_by, sigterm_raises
from doppler_gen.render import RenderedKernel
from doppler_gen.runtime.session import Progress, choose_adapter, open_device
from doppler_gen.runtime.verify import CaseSpec, VariantReport, case_specs, validate_variant

_device: Device | None = None  # this worker's device, opened by its first variant
_ORPHAN_POLL_S = 0.2  # how often a worker checks that its parent is alive
_JOIN_S = 5.0  # how long a worker that was told to stop may take before it is killed

DeviceArgs = tuple[str, str | None, list[str], str]  # backend, --adapter, features, limits
Outputs = dict[CaseSpec, np.ndarray]


def _exit_when_orphaned(parent: int) -> None:
    """Exit this worker as soon as ``parent`` is no longer its parent (it died, however)."""
    while os.getppid() == parent:
        time.sleep(_ORPHAN_POLL_S)
    os._exit(1)


def _init_worker(parent: int) -> None:
    """Ctrl-C is the parent's to handle (it stops the workers): a worker ignores it. A watch
    thread ends the worker when the parent dies unannounced (GPU work runs in C with the GIL
    released, so the thread runs during a long compile too)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getppid() != parent:  # the parent died while this worker started
        os._exit(1)
    threading.Thread(
        target=_exit_when_orphaned, args=(parent,), name="orphan-watch", daemon=True
    ).start()


def _worker_device(device_args: DeviceArgs) -> Device:
    """This worker's device, opened on its first variant."""
    global _device
    if _device is None:
        backend_name, adapter_want, requires, limits = device_args
        backend = get_backend(backend_name)
        _device = open_device(backend, choose_adapter(backend, adapter_want), requires, limits)
    return _device


def _worker_main(
    connection: Connection,
    parent: int,
    device_args: DeviceArgs,
    keep_outputs: bool,
    families: list[Family],
) -> None:
    """A worker's life: validate each variant the parent sends, send back its report (or the
    DopplerGenError that stops the run, such as no adapter), until told to stop (None) or
    until its device is spent (a GPU wait ran out of time: nothing more can run on it).
    ``families``: those the parent registered at run time (a fresh import lacks them)."""
    _init_worker(parent)
    for family in families:
        register_family(family)
    while (task := connection.recv()) is not None:
        kernel, entry, options = task
        try:
            device = _worker_device(device_args)
            outputs: Outputs | None = {} if keep_outputs else None
            report = validate_variant(
                device,
                kernel,
                entry,
                outputs=outputs,
                progress=lambda _name, step: connection.send(("tick", step)),  # a bar moves
                **options,
            )
        except DopplerGenError as error:
            connection.send(("error", _portable(error)))
            return
        except Exception:  # a bug: the parent reports it as one (exit 3)
            connection.send(("bug", traceback.format_exc()))
            return
        spent = process_spent() is not None  # a wait was abandoned: the kernel may run on
        connection.send(("report", (report, outputs, device.adapter.describe(), spent)))
        if spent:  # the process goes, without the interpreter's exit waiting on the device
            connection.close()
            leave_if_spent(0)


def _portable(error: DopplerGenError) -> DopplerGenError:
    """``error`` itself where it survives pickling (its type names it in the JSON error),
    else a plain DopplerGenError with its message, location and exit status."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        plain = DopplerGenError(error.message, location=error.location)
        plain.exit_code = error.exit_code
        return plain
    return error


@dataclass
class _Worker:
    """One worker process, its end of the pipe, and the variant it holds (index, start)."""

    process: BaseProcess
    connection: Connection
    task: tuple[int, float] | None = None


def _start_worker(context: Any, device_args: DeviceArgs, keep_outputs: bool) -> _Worker:
    """A fresh worker process. Ctrl-C is ignored while it is spawned: the child inherits the
    ignored signal through exec, so one still importing when Ctrl-C came does not print a
    traceback before it could ignore it (that Ctrl-C is lost; the next one stops the run)."""
    mine, theirs = context.Pipe()
    process = context.Process(
        target=_worker_main,
        args=(theirs, os.getpid(), device_args, keep_outputs, registered_at_run_time()),
        name="doppler-gen-validate",
        daemon=True,
    )
    with handled_by(signal.SIGINT, signal.SIG_IGN):
        process.start()
    theirs.close()
    return _Worker(process, mine)


def _stop(worker: _Worker, *, now: bool) -> None:
    """End a worker: at once (``now``: Ctrl-C, SIGTERM, an error, a spent device), or by
    telling it there is nothing more to do."""
    if not now:
        try:
            worker.connection.send(None)
        except OSError:
            now = True
    if now:
        worker.process.kill()
    worker.process.join(_JOIN_S)
    if worker.process.is_alive():
        worker.process.kill()
        worker.process.join()
    worker.connection.close()


def death_reason(exitcode: int | None) -> str:
    """How a worker process ended, in words: "signal 11, SIGSEGV" or "exit status 1"."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
        return f"signal {-exitcode}, {name}"
    return f"exit status {exitcode}"


class WorkerBug(RuntimeError):
    """An unexpected exception in a worker (a bug in doppler-gen, exit 3), with its traceback."""


class _Run:
    """The parent's side of one run: which variant each worker holds, what came back."""

    def __init__(
        self,
        kernels: Sequence[RenderedKernel],
        entries: Sequence[dict[str, Any]],
        options: dict[str, Any],
        progress: Progress | None,
        outputs: dict[str, Outputs] | None,
    ) -> None:
        self.kernels, self.entries, self.options = kernels, entries, options
        self.progress, self.outputs = progress, outputs
        self.reports: list[VariantReport | None] = [None] * len(kernels)
        self.ticked = [0] * len(kernels)  # cases the progress callback has been told of
        self.waiting = deque(range(len(kernels)))
        self.described = ""

    def hand_out(self, worker: _Worker) -> None:
        """Give ``worker`` the next variant."""
        index = self.waiting.popleft()
        worker.task = (index, time.perf_counter())
        worker.connection.send((self.kernels[index], self.entries[index], self.options))

    def collect(self, worker: _Worker) -> bool | None:
        """Take what ``worker`` sent: a case done (None: it is still busy), its report (True:
        it can take another variant; False: its device is spent and it exits), or, when it
        died instead, report its variant as FAIL with how it died (False)."""
        assert worker.task is not None
        index, started = worker.task
        try:
            kind, sent = worker.connection.recv()
            if kind == "tick":
                self._tick(index, sent)
                return None
        except (EOFError, OSError):
            worker.process.join(_JOIN_S)
            reason = death_reason(worker.process.exitcode)
            report = VariantReport(
                self.kernels[index].variant.name,
                "FAIL",
                f"the validation process died ({reason}) while validating it",
                seconds=time.perf_counter() - started,
            )
            self._record(index, report, None, "")
            return False
        if kind == "error":
            raise sent
        if kind == "bug":  # the exception's own line first: that is what the CLI prints
            last = next((line for line in reversed(sent.splitlines()) if line.strip()), "")
            raise WorkerBug(f"in a validation worker: {last.strip()}\n{sent}")
        report, kept, described, spent = sent
        self._record(index, report, kept, described)
        return not spent

    def _record(
        self, index: int, report: VariantReport, kept: Outputs | None, described: str
    ) -> None:
        name = self.kernels[index].variant.name
        self.reports[index] = report
        self.described = described or self.described
        if self.outputs is not None:
            self.outputs[name] = kept or {}
        if self.progress:  # the cases not ticked off (a compile error, a worker that died)
            specs = case_specs(
                self.entries[index], tier=self.options["tier"], seed=self.options["seed"]
            )
            self._tick(index, len(specs) - self.ticked[index])

    def _tick(self, index: int, step: int) -> None:
        self.ticked[index] += step
        if self.progress and step > 0:
            self.progress(self.kernels[index].variant.name, step)


def validate_in_workers(
    backend_name: str,
    kernels: Sequence[RenderedKernel],
    entries: Sequence[dict[str, Any]],
    *,
    jobs: int,
    adapter: str | None,
    limits: str,
    options: dict[str, Any],
    progress: Progress | None = None,
    outputs: dict[str, Outputs] | None = None,
) -> tuple[list[VariantReport], str, int]:
    """``validate_variant`` for every kernel, in ``jobs`` processes (at most one a kernel);
    the reports in kernel order, the adapter's description and the processes used.
    ``options``: validate_variant's keyword arguments (tier, seed, storage_overrun,
    fail_fast); ``outputs`` (if given) receives each variant's case outputs by name."""
    requires = sorted({f for k in kernels for f in k.variant.requires})
    device_args: DeviceArgs = (backend_name, adapter, requires, limits)
    keep = outputs is not None
    run = _Run(kernels, entries, options, progress, outputs)
    context = multiprocessing.get_context("spawn")
    count = max(1, min(jobs, len(kernels)))
    workers: list[_Worker] = []
    with sigterm_raises():  # SIGTERM stops the workers too, as Ctrl-C does
        try:
            workers = [_start_worker(context, device_args, keep) for _ in range(count)]
            for worker in workers:
                if run.waiting:
                    run.hand_out(worker)
            while any(w.task is not None for w in workers):
                busy = {w.connection: w for w in workers if w.task is not None}
                for ready in wait(list(busy)):
                    worker = busy[ready]  # type: ignore[index]
                    alive = run.collect(worker)
                    if alive is None:  # a case done; the variant goes on
                        continue
                    worker.task = None
                    if alive and run.waiting:
                        run.hand_out(worker)
                    elif not alive and run.waiting:  # it died, or its device is spent
                        _stop(worker, now=True)
                        workers[workers.index(worker)] = fresh = _start_worker(
                            context, device_args, keep
                        )
                        run.hand_out(fresh)
        except BaseException:  # Ctrl-C, SIGTERM, an error: every worker stops at once
            for worker in workers:
                _stop(worker, now=True)
            raise
    for worker in workers:
        _stop(worker, now=not worker.process.is_alive())
    # no worker lived to report its adapter (each died on its first variant): say so
    described = run.described or "an adapter no worker lived to describe"
    return [r for r in run.reports if r is not None], described, count
