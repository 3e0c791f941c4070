"""Whether a WebGPU adapter is available to the GPU tests, and why not."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from doppler_gen.errors import DopplerGenError


@functools.cache
def adapter_problem() -> str | None:
    """None when wgpu finds a Vulkan adapter (GPU or lavapipe), else the reason to skip."""
    try:
        from doppler_gen.backends import get_backend, select_adapter

        select_adapter(get_backend("wgpu").adapters(), None)
    except (DopplerGenError, ImportError, RuntimeError) as error:
        return f"no Vulkan WebGPU adapter: {error}"
    return None


@functools.cache
def dawn_problem() -> str | None:
    """None when Dawn (Tint, Chrome's compiler) finds an adapter, else the reason to skip."""
    try:
        from doppler_gen.backends import get_backend, select_adapter

        select_adapter(get_backend("dawn").adapters(), None)
    except DopplerGenError as error:
        return f"no Dawn adapter: {error}"
    return None


def open_run_device(
    backend: Any, kernels: Sequence[Any], adapter_want: str | None, limits: str
) -> Any:
    """One device able to run as many of ``kernels`` as the adapter allows (a test's own;
    `validate` opens its devices in worker processes, ``runtime.workers``)."""
    from doppler_gen.runtime.session import choose_adapter, open_device

    requires = {f for k in kernels for f in k.variant.requires}
    return open_device(backend, choose_adapter(backend, adapter_want), requires, limits)
