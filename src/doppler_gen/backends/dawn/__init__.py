"""The Dawn (Tint) implementation of the GPU runtime interface, through pydawn's ctypes bindings.

Chrome compiles WGSL with Tint inside Dawn; Firefox with naga inside wgpu. A kernel that one
accepts and the other rejects (or computes differently) is a production bug, so kernels are
validated on both. pydawn (``dawn-python`` 0.3.0, Dawn of Chromium 133) ships ``libwebgpu_dawn``
and raw ctypes bindings of its ``webgpu.h`` (``pydawn.webgpu``); its ``utils`` helpers assert,
print or drop errors, so only the raw bindings are used here.

Errors are never dropped. Every operation runs inside three error scopes (validation,
out-of-memory, internal) whose errors are raised; the device's uncaptured-error, device-lost
and logging callbacks record anything arriving outside a scope, and the next operation raises
it. Shader errors come from the module's compilation info (Tint's own line:column) or, failing
that, from Tint's text (``:12:5 error: ...``), so they map to template lines like naga's.

Asynchronous calls use the ``...2`` entry points (the older ones print deprecation warnings)
with ``WaitAnyOnly`` callbacks, completed by ``wgpuInstanceWaitAny``; callbacks only copy their
arguments (a string view dies with its callback) because ctypes cannot raise out of them.

pydawn is imported lazily: importing doppler_gen must not pay for (or require) it.
"""

from doppler_gen.backends.dawn.backend import DawnBackend
from doppler_gen.backends.dawn.device import DawnBuffer, DawnDevice, DawnPipeline
from doppler_gen.backends.dawn.ffi import (
    F16_REFUSED,
    INSTALL_HINT,
    feature_name,
    limit_field,
    limit_name,
)
from doppler_gen.backends.dawn.tint import (
    BACKEND_NAME,
    TintMessage,
    one_line,
    parse_diagnostics,
    tint_messages,
)

__all__ = [
    "BACKEND_NAME",
    "F16_REFUSED",
    "INSTALL_HINT",
    "DawnBackend",
    "DawnBuffer",
    "DawnDevice",
    "DawnPipeline",
    "TintMessage",
    "feature_name",
    "limit_field",
    "limit_name",
    "one_line",
    "parse_diagnostics",
    "tint_messages",
]
