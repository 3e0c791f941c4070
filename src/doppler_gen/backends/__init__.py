"""GPU runtime backends: one WebGPU implementation each, behind the interface in ``base``.

Implementations are imported only when asked for, so ``import doppler_gen`` stays cheap and
works on machines where wgpu-py or pydawn is missing.
"""

from __future__ import annotations

from importlib import import_module

from doppler_gen.backends.base import (
    LIMIT_PROFILES,
    WEBGPU_DEFAULT_LIMITS,
    AdapterInfo,
    Backend,
    Buffer,
    Device,
    PassTimes,
    Pipeline,
    Step,
    effective_limits,
    select_adapter,
)
from doppler_gen.errors import BackendUnavailable

# name -> "module:class"; resolved lazily by get_backend.
BACKENDS: dict[str, str] = {
    "wgpu": "doppler_gen.backends.wgpu_backend:WgpuBackend",
    "dawn": "doppler_gen.backends.dawn:DawnBackend",
}


def get_backend(name: str = "wgpu") -> Backend:
    """Instantiate the backend called ``name`` (see ``BACKENDS``)."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise BackendUnavailable(
            f"unknown backend {name!r}; choose one of: {', '.join(sorted(BACKENDS))}"
        ) from None
    module_name, class_name = target.split(":")
    backend_cls = getattr(import_module(module_name), class_name)
    return backend_cls()


__all__ = [
    "BACKENDS",
    "LIMIT_PROFILES",
    "WEBGPU_DEFAULT_LIMITS",
    "AdapterInfo",
    "Backend",
    "Buffer",
    "Device",
    "PassTimes",
    "Pipeline",
    "Step",
    "effective_limits",
    "get_backend",
    "select_adapter",
]
