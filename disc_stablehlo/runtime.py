"""The runtime loader: loads the RAL and compiled shared objects with ctypes, passes numpy
buffers as memref descriptors, and wraps results. No MLIR is needed here, and no model math
runs in Python: it checks arguments, passes pointers and wraps results."""

from __future__ import annotations

import ctypes
import functools
import os
import sysconfig
import threading
import weakref
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .bounded_dynamism import Signature
from .bounded_dynamism.guards import Assertion
from .errors import DiscError, RuntimeFailure, ShapeError

RAL_LIBRARY = "libdisc_ral.so"


def ral_library_dir() -> str:
    """Where libdisc_ral.so lives: $DISC_RAL_DIR, or the package's _lib folder (next to this
    file, or under site-packages for editable installs)."""
    candidates = [os.environ.get("DISC_RAL_DIR", ""), str(Path(__file__).parent / "_lib"),
                  str(Path(sysconfig.get_paths()["platlib"]) / "disc_stablehlo" / "_lib")]
    for d in candidates:
        if d and os.path.exists(os.path.join(d, RAL_LIBRARY)):
            return d
    raise DiscError(f"{RAL_LIBRARY} not found in {[c for c in candidates if c]}: install the package "
                    "(pip install .) or point DISC_RAL_DIR at a build of ral_runtime/")


@functools.cache
def ral() -> ctypes.CDLL:
    lib = ctypes.CDLL(os.path.join(ral_library_dir(), RAL_LIBRARY), mode=ctypes.RTLD_GLOBAL)
    vp = ctypes.c_void_p
    for name, res, args in [
        ("ral_runtime_create", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(vp)]),
        ("ral_runtime_create_error", ctypes.c_char_p, []),
        ("ral_runtime_destroy", None, [vp]),
        ("ral_runtime_memory_stats", None, [vp, ctypes.POINTER(MemoryStats)]),
        ("ral_runtime_reset_peak", None, [vp]),
        ("ral_context_create", ctypes.c_int, [vp, ctypes.POINTER(vp)]),
        ("ral_context_destroy", None, [vp]),
        ("ral_context_enter", vp, [vp]),
        ("ral_context_status", ctypes.c_int, [vp]),
        ("ral_context_message", ctypes.c_char_p, [vp]),
        ("ral_context_take", ctypes.c_int, [vp, vp]),
        ("ral_buffer_free", None, [vp, vp]),
        ("ral_kernel_stats", None, [vp, ctypes.POINTER(KernelStat)]),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class KernelStat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("calls", "pool_calls", "fused_calls", "ns")]


def symbol_address(lib: ctypes.CDLL, symbol: str) -> int:
    return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value


def kernel_stats(address: int) -> dict[str, float]:
    """Calls of a kernel (or library entry) at `address`, those run on the thread pool, those run
    as a GEMM epilogue behind its row blocks and those run inline (the small-size version), and
    their total wall time in seconds."""
    st = KernelStat()
    ral().ral_kernel_stats(ctypes.c_void_p(address), ctypes.byref(st))
    return {"calls": st.calls, "pool": st.pool_calls, "fused": st.fused_calls,
            "inline": st.calls - st.pool_calls - st.fused_calls, "seconds": st.ns * 1e-9}


class MemoryStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("bytes_in_use", "peak_bytes", "bytes_cached", "allocations", "cache_hits")]


class Runtime:
    """A RAL runtime: caching allocator, thread pool, BLAS. Shared by every compiled function
    of the process; thread-safe."""

    def __init__(self, num_threads: int = 0):
        import scipy_openblas32

        blas = os.path.join(scipy_openblas32.get_lib_dir(), f"lib{scipy_openblas32.get_library()}.so")
        handle = ctypes.c_void_p()
        if ral().ral_runtime_create(blas.encode(), num_threads, ctypes.byref(handle)) != 0:
            raise RuntimeFailure(f"cannot create the runtime: {ral().ral_runtime_create_error().decode()}")
        self.handle = handle
        weakref.finalize(self, ral().ral_runtime_destroy, handle)

    def reset_peak(self) -> None:
        ral().ral_runtime_reset_peak(self.handle)

    def memory_stats(self) -> dict[str, int]:
        st = MemoryStats()
        ral().ral_runtime_memory_stats(self.handle, ctypes.byref(st))
        return {name: getattr(st, name) for name, _ in MemoryStats._fields_}


_default_runtime: Runtime | None = None
_default_lock = threading.Lock()


def default_runtime() -> Runtime:
    global _default_runtime
    with _default_lock:
        if _default_runtime is None:
            _default_runtime = Runtime(int(os.environ.get("DISC_NUM_THREADS", "0")))
        return _default_runtime


@functools.cache
def descriptor_type(rank: int) -> type[ctypes.Structure]:
    """MLIR's memref descriptor for a rank: allocated and aligned pointers, offset, sizes, strides."""
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})


def _results_type(ranks: Sequence[int]) -> type[ctypes.Structure]:
    return type("Results", (ctypes.Structure,), {"_fields_": [(f"r{i}", descriptor_type(r)) for i, r in enumerate(ranks)]})


class NativeFunction:
    """One C-interface entry point of a compiled shared object."""

    def __init__(self, lib: ctypes.CDLL, name: str, result_ranks: Sequence[int]):
        self.fn = getattr(lib, f"_mlir_ciface_{name}")
        self.fn.restype = None
        self.results_type = _results_type(result_ranks)

    def __call__(self, args: Sequence[Any]) -> ctypes.Structure:
        """`args`: pointers to the arguments' descriptors (`descriptors`)."""
        results = self.results_type()
        self.fn(ctypes.byref(results), *args)
        return results


def descriptors(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, list[ctypes.c_void_p]]:
    """The arrays' memref descriptors laid out in one int64 buffer (allocated and aligned
    pointer, offset 0, sizes, strides in elements), and a pointer to each; the pointers are
    valid while the buffer lives. (One numpy buffer: building ctypes structures per argument
    costs several microseconds each.)"""
    words, starts = [], []
    for a in arrays:
        starts.append(len(words))
        address = a.__array_interface__["data"][0]
        words += [address, address, 0, *a.shape, *(s // a.itemsize for s in a.strides)]
    buffer = np.array(words, dtype=np.int64)
    base = buffer.__array_interface__["data"][0]
    return buffer, [ctypes.c_void_p(base + 8 * i) for i in starts]


def _wrap(rt: Runtime, ctx: ctypes.c_void_p, desc: ctypes.Structure, dtype: np.dtype, rank: int) -> np.ndarray:
    shape = tuple(desc.sizes) if rank else ()
    strides = tuple(s * dtype.itemsize for s in desc.strides) if rank else ()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    address = desc.aligned + desc.offset * dtype.itemsize
    span = max(1, int(sum((n - 1) * abs(s) for n, s in zip(shape, strides))) + dtype.itemsize)
    raw = (ctypes.c_char * span).from_address(address)
    view = np.ndarray(shape, dtype, buffer=raw, strides=strides)
    if view.flags.c_contiguous and ral().ral_context_take(ctx, desc.allocated):
        # the result buffer now belongs to the array: given back to the RAL when it dies
        weakref.finalize(raw, ral().ral_buffer_free, rt.handle, ctypes.c_void_p(desc.allocated))
        return view
    return view.copy()  # an argument, a constant, or a result returned twice


class Executable:
    """A compiled shared object: the entry function, its optional guard, and how to call them."""

    def __init__(self, so_path: str, entry: str, signature: Signature, assertions: list[Assertion], runtime: Runtime,
                 params: Sequence[np.ndarray] = ()):
        self.lib = ctypes.CDLL(so_path)
        self.params = list(params)  # the entry's trailing arguments, after the caller's
        self.signature = signature
        self.runtime = runtime
        self.entry = NativeFunction(self.lib, entry, [len(r.shape) for r in signature.results])
        self.assertions = assertions
        self.guard = NativeFunction(self.lib, "disc_guard", [1]) if assertions else None


    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.signature.check(arrays)
        arrays = [np.ascontiguousarray(a) for a in arrays] + self.params
        lib, ctx = ral(), ctypes.c_void_p()
        if lib.ral_context_create(self.runtime.handle, ctypes.byref(ctx)) != 0:
            raise RuntimeFailure("cannot create a runtime context")
        previous = lib.ral_context_enter(ctx)
        try:
            _keep, args = descriptors(arrays)
            if self.guard is not None:
                self._check_guard(ctx, self.guard(args).r0)
            results = self.entry(args)
            self._check_status(ctx)
            return [_wrap(self.runtime, ctx, getattr(results, f"r{i}"), spec.dtype, len(spec.shape))
                    for i, spec in enumerate(self.signature.results)]
        finally:
            lib.ral_context_enter(previous)
            lib.ral_context_destroy(ctx)

    def _check_status(self, ctx: ctypes.c_void_p) -> None:
        if ral().ral_context_status(ctx) != 0:
            raise RuntimeFailure(ral().ral_context_message(ctx).decode())

    def _check_guard(self, ctx: ctypes.c_void_p, packed: ctypes.Structure) -> None:
        self._check_status(ctx)
        values = np.ctypeslib.as_array(ctypes.cast(packed.aligned, ctypes.POINTER(ctypes.c_int64)), (packed.sizes[0],))
        failed = int(values[0])
        if failed >= 0:
            start = 1 + sum(a.num_values for a in self.assertions[:failed])
            operands = [int(v) for v in values[start:start + self.assertions[failed].num_values]]
            raise ShapeError(self.assertions[failed].format(operands))
