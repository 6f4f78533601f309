"""Registering a ring's pages with CUDA as pinned host memory, where there is a CUDA GPU.

Pinned (page-locked, registered) host memory lets the GPU copy a batch by DMA
straight from the ring slot; otherwise the driver first stages it through a
pinned buffer of its own. This is a probe, never a requirement: without an
NVIDIA driver, or without the CUDA runtime library (JAX's CUDA wheels ship it
as ``nvidia/cuda_runtime/lib/libcudart.so.12``), nothing happens.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

__all__ = ["cuda_runtime", "register", "unregister"]

#: cudaHostRegisterPortable: pinned for every CUDA context, not only the current one.
_PORTABLE = 1
_runtime = None


def cuda_runtime():
    """The CUDA runtime library (ctypes), or None when this machine has no NVIDIA driver or no runtime."""
    global _runtime
    if _runtime is not None:
        return _runtime or None
    _runtime = False
    if not os.path.exists("/proc/driver/nvidia/version"):
        return None
    candidates = ["libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"]
    for site in sys.path:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        _runtime = lib
        return lib
    return None


def register(address: int, size: int) -> bool:
    """Registers ``size`` bytes at ``address`` as pinned memory; True when CUDA accepted them."""
    lib = cuda_runtime()
    return lib is not None and lib.cudaHostRegister(address, size, _PORTABLE) == 0


def unregister(address: int) -> None:
    """Undoes :func:`register` (before the memory is unmapped)."""
    lib = cuda_runtime()
    if lib is not None:
        lib.cudaHostUnregister(address)
