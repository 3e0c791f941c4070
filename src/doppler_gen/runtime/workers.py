"""Validating variants in worker processes, each with its own device (``validate --jobs N``).

Why: on a CPU adapter (lavapipe) most of a validation run is compiling pipelines, and a
pipeline compiles on one core; N processes use N cores. A worker opens its device once, on
its first variant, and keeps it; variants are handed out one at a time, so a slow one does
not hold back the others. Reports come back in the order the variants were asked for, and
each variant is validated exactly as in one process (``verify.validate_variant``).

Workers are started with ``spawn``, not ``fork``: a forked child would inherit the parent's
driver threads and handles. On a GPU the workers share it; one process is the default.

Workers never outlive the run. Ctrl-C and SIGTERM in the parent stop them at once; if the
parent dies without a word (SIGKILL, a crash), each worker notices within a fraction of a second
that it was orphaned and exits. Without this a killed ``validate --jobs`` left workers that
went on through the variants already queued to them, each still compiling on a core.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from doppler_gen.backends import Device, get_backend
from doppler_gen.errors import DopplerGenError
from doppler_gen.interrupts import handled_by, sigterm_raises
from doppler_gen.render import RenderedKernel
from doppler_gen.runtime.session import Progress, choose_adapter, open_device
from doppler_gen.runtime.verify import CaseSpec, VariantReport, case_specs, validate_variant

_device: Device | None = None  # this worker's device, opened by its first variant
_ORPHAN_POLL_S = 0.2  # how often a worker checks that its parent is alive


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


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Drop the variants not started and end the workers now, not after their variant (the
    pool's workers are this process's only children)."""
    pool.shutdown(wait=False, cancel_futures=True)
    for child in multiprocessing.active_children():
        child.terminate()


def _worker_device(
    backend_name: str, adapter_want: str | None, requires: list[str], limits: str
) -> Device:
    global _device
    if _device is None:
        backend = get_backend(backend_name)
        _device = open_device(backend, choose_adapter(backend, adapter_want), requires, limits)
    return _device


def _validate_in_worker(
    device_args: tuple[str, str | None, list[str], str],
    kernel: RenderedKernel,
    entry: dict[str, Any],
    options: dict[str, Any],
    keep_outputs: bool,
) -> tuple[VariantReport, dict[CaseSpec, np.ndarray] | None, str]:
    device = _worker_device(*device_args)
    outputs: dict[CaseSpec, np.ndarray] | None = {} if keep_outputs else None
    report = validate_variant(device, kernel, entry, outputs=outputs, **options)
    return report, outputs, device.adapter.describe()


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
    outputs: dict[str, dict[CaseSpec, np.ndarray]] | None = None,
) -> tuple[list[VariantReport], str, int]:
    """``validate_variant`` for every kernel, in ``jobs`` processes (at most one a kernel);
    the reports in kernel order, the adapter's description and the processes used.
    ``options``: validate_variant's keyword arguments (tier, seed, storage_overrun,
    fail_fast); ``outputs`` (if given) receives each variant's case outputs by name."""
    choose_adapter(get_backend(backend_name), adapter)  # a bad --adapter fails here, once
    requires = sorted({f for k in kernels for f in k.variant.requires})
    device_args = (backend_name, adapter, requires, limits)
    reports: list[VariantReport | None] = [None] * len(kernels)
    described = ""
    context = multiprocessing.get_context("spawn")
    workers = max(1, min(jobs, len(kernels)))
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_init_worker, initargs=(os.getpid(),)
    )
    with sigterm_raises():  # SIGTERM stops the workers too, as Ctrl-C does
        try:
            # Ctrl-C is ignored while submit starts the workers, which inherit the ignored
            # signal through exec: a worker still importing when Ctrl-C came printed a
            # traceback before its initializer could ignore it. A Ctrl-C in the few
            # milliseconds of the spawns is lost; the next one stops the run.
            with handled_by(signal.SIGINT, signal.SIG_IGN):
                pending: dict[Future, int] = {
                    pool.submit(
                        _validate_in_worker, device_args, k, e, options, outputs is not None
                    ): i
                    for i, (k, e) in enumerate(zip(kernels, entries, strict=True))
                }
            for future in as_completed(pending):
                index = pending[future]
                name = kernels[index].variant.name
                try:
                    report, kept, described = future.result()
                except BrokenProcessPool as error:
                    raise DopplerGenError(
                        f"a validation worker process died while validating {name} (--jobs "
                        f"{jobs}); run without --jobs to see where: {error}"
                    ) from None
                reports[index] = report
                if outputs is not None:
                    outputs[name] = kept or {}
                if progress:
                    progress(
                        name,
                        len(case_specs(entries[index], tier=options["tier"], seed=options["seed"])),
                    )
        except BaseException:  # Ctrl-C, SIGTERM, a dead worker: the others stop too
            _stop_workers(pool)
            raise
    pool.shutdown()
    return [r for r in reports if r is not None], described, workers
