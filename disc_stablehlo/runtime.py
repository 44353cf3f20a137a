"""The runtime: loads the RAL and artifacts with ctypes, passes numpy buffers as memref
descriptors, and wraps results; `CompiledFunction` is what users call. Neither MLIR nor LLVM nor
any framework is imported here, and no model math runs in Python: it checks arguments, passes
pointers and wraps results."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import glob
import importlib.util
import math
import os
import sys
import sysconfig
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import ml_dtypes
import numpy as np

from . import artifact
from .artifact import Artifact
from .errors import ArtifactError, DiscError, RuntimeFailure, ShapeError

RAL_LIBRARY = "libdisc_ral.so"
RAL_ERR_SHAPE = 5  # ral/ral.h: a size the program computed at run time is negative or overflows


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
        ("ral_runtime_trim", None, [vp]),
        ("ral_runtime_set_cache_limits", None, [vp, ctypes.c_int64, ctypes.c_int64]),
        ("ral_context_create", ctypes.c_int, [vp, ctypes.POINTER(vp)]),
        ("ral_context_destroy", None, [vp]),
        ("ral_context_enter", vp, [vp]),
        ("ral_context_status", ctypes.c_int, [vp]),
        ("ral_context_call", ctypes.c_int, [vp, vp, vp, vp]),
        ("ral_context_message", ctypes.c_char_p, [vp]),
        ("ral_context_take", ctypes.c_int, [vp, vp]),
        ("ral_buffer_free", None, [vp, vp]),
        ("ral_kernel_stats", None, [vp, ctypes.POINTER(KernelStat)]),
        ("ral_abi_version", ctypes.c_int, []),
        ("ral_runtime_enable_gpu", ctypes.c_int, [vp, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]),
        ("ral_gpu_alloc", ctypes.c_int, [vp, ctypes.c_size_t, ctypes.POINTER(vp)]),
        ("ral_gpu_free", None, [vp, vp]),
        ("ral_gpu_copy", ctypes.c_int, [vp, vp, vp, ctypes.c_size_t, ctypes.c_int]),
        ("ral_context_set_stream", None, [vp, vp]),
        ("ral_context_gpu_alloc", ctypes.c_int, [vp, ctypes.c_size_t, ctypes.POINTER(vp)]),
        ("ral_context_synchronize", ctypes.c_int, [vp]),
        ("ral_runtime_gpu_memory_stats", None, [vp, ctypes.POINTER(MemoryStats)]),
        ("ral_gpu_dlpack", vp, [vp, vp, ctypes.c_int32, vp, vp, ctypes.c_uint8, ctypes.c_uint8]),
        ("ral_dlpack_delete", None, [vp]),
        ("ral_kernel_stats_enable", None, [ctypes.c_int]),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    if lib.ral_abi_version() != artifact.RAL_ABI_VERSION:
        raise DiscError(f"{RAL_LIBRARY} has RAL ABI version {lib.ral_abi_version()}, this package needs "
                        f"{artifact.RAL_ABI_VERSION}: reinstall the package")
    if _collecting:
        lib.ral_kernel_stats_enable(1)
    return lib


_collecting = os.environ.get("DISC_STATS") == "1"  # the state ral_kernel_stats_enable was last given

NATIVE_MODULE = "_native.abi3.so"


@functools.cache
def native() -> Any:
    """The host call path's C module (ral_runtime/python/native.c), built next to libdisc_ral.so
    and bound to the entry points of the RAL this package loaded."""
    path = os.path.join(ral_library_dir(), NATIVE_MODULE)
    if not os.path.exists(path):
        raise DiscError(f"{NATIVE_MODULE} not found next to {RAL_LIBRARY} in {ral_library_dir()}: reinstall the package, or "
                        "build ral_runtime/ with Python's headers found")
    spec = importlib.util.spec_from_file_location("disc_stablehlo._native", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lib = ral()
    module.bind(*(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in (
        "ral_context_create", "ral_context_destroy", "ral_context_enter", "ral_context_call", "ral_context_message",
        "ral_context_take", "ral_buffer_free")))
    return module


def collect_stats(on: bool = True) -> None:
    """Starts (or stops) counting kernel calls and their time for `CompiledFunction.stats()`,
    process-wide; off until asked for (or DISC_STATS=1), as counting writes to shared state."""
    global _collecting
    ral().ral_kernel_stats_enable(int(bool(on)))
    _collecting = bool(on)


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


def blas_library() -> str | None:
    """The BLAS the RAL loads for GEMMs: $DISC_BLAS (a path), else MKL's runtime library where
    the `mkl` package is installed (x86-64: faster than OpenBLAS for the skinny products of
    small batches), else scipy-openblas32's."""
    if path := os.environ.get("DISC_BLAS"):
        return path
    import importlib.metadata  # (here: the compiler worker, which imports this module, never needs it)

    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name.startswith("libmkl_rt.so") and os.path.exists(path := str(f.locate())):
            return path
    try:
        return openblas_library()
    except ImportError:  # a runtime-only install (a GPU machine): GEMMs on the CPU then fail with a clear error
        return None


def openblas_library() -> str:
    """scipy-openblas32's shared library."""
    import scipy_openblas32

    return os.path.join(scipy_openblas32.get_lib_dir(), f"lib{scipy_openblas32.get_library()}.so")


def cublas_library() -> str | None:
    """cuBLAS for GEMMs on CUDA GPUs: $DISC_CUBLAS, else the one the `nvidia-cublas` wheels (PyTorch's
    CUDA builds bring them) or the CUDA toolkit install, or None."""
    if path := os.environ.get("DISC_CUBLAS"):
        return path
    roots = [str(Path(p) / "nvidia" / sub / "lib") for p in sys.path if p for sub in ("cublas", "cu13", "cu12")]
    roots += ["/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"]
    for root in roots:
        found = sorted(glob.glob(os.path.join(root, "libcublas.so*")))
        if found:
            return found[-1]
    return None


@dataclasses.dataclass
class DeviceArray:
    """An array in device memory: a CUDA tensor's storage, or a device copy the runtime made."""
    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = 0, 1, 2


def _device_copy(address: int, a: np.ndarray) -> DeviceArray:
    """The device array at `address` laid out as the contiguous host array `a`."""
    return DeviceArray(address, a.shape, tuple(s // a.itemsize for s in a.strides), a.dtype)


def _call_buffer(ctx: ctypes.c_void_p, nbytes: int) -> int:
    """Device memory of the call `ctx` (for its stream, freed with it to that stream's pool:
    nothing reuses it before the call's work is done)."""
    out = ctypes.c_void_p()
    if ral().ral_context_gpu_alloc(ctx, max(nbytes, 1), ctypes.byref(out)) != 0:
        raise RuntimeFailure(ral().ral_context_message(ctx).decode())
    return out.value


def _upload(ctx: ctypes.c_void_p, a: np.ndarray) -> DeviceArray:
    """A copy of the contiguous host array `a` in device memory of the call `ctx`, made on its stream."""
    address = _call_buffer(ctx, a.nbytes)
    _copy(ctx, address, a.ctypes.data, a.nbytes, HOST_TO_DEVICE)
    return _device_copy(address, a)


def _synchronize(ctx: ctypes.c_void_p) -> None:
    """Waits for the work on the context's stream."""
    if ral().ral_context_synchronize(ctx) != 0:
        raise RuntimeFailure(ral().ral_context_message(ctx).decode())


def _copy(ctx: ctypes.c_void_p, dst: int, src: int, nbytes: int, direction: int) -> None:
    if nbytes and ral().ral_gpu_copy(ctx, ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, direction) != 0:
        raise RuntimeFailure(ral().ral_context_message(ctx).decode())


class _Context:
    """A RAL context for one call, current on this thread while it lasts."""

    def __init__(self, rt: "Runtime"):
        self.ctx = ctypes.c_void_p()
        if ral().ral_context_create(rt.handle, ctypes.byref(self.ctx)) != 0:
            raise RuntimeFailure("cannot create a runtime context")

    def __enter__(self) -> ctypes.c_void_p:
        self.previous = ral().ral_context_enter(self.ctx)
        return self.ctx

    def __exit__(self, *exc: Any) -> None:
        ral().ral_context_enter(self.previous)
        ral().ral_context_destroy(self.ctx)


class Runtime:
    """A RAL runtime: caching allocator, thread pool, BLAS (`blas`: its path). Shared by every
    compiled function of the process; thread-safe."""

    def __init__(self, num_threads: int = 0):
        blas = self.blas = blas_library()
        handle = ctypes.c_void_p()
        if ral().ral_runtime_create(blas.encode() if blas else None, num_threads, ctypes.byref(handle)) != 0:
            raise RuntimeFailure(f"cannot create the runtime: {ral().ral_runtime_create_error().decode()}")
        self.handle = handle
        self.lock = threading.Lock()
        self.gpu = ""  # the kind of GPU attached, if any
        # destroyed with this object, which every result buffer keeps alive; not at exit, where
        # arrays may outlive the finalizers
        weakref.finalize(self, ral().ral_runtime_destroy, handle).atexit = False

    def enable_gpu(self, kind: str) -> None:
        """Attaches the first GPU of `kind` ("cuda": the driver and cuBLAS, `cublas_library`;
        "rocm": the HIP runtime and hipBLAS), its primary context shared with PyTorch and JAX;
        once per runtime. $DISC_CUDA_DRIVER / $DISC_CUBLAS and $DISC_HIP_RUNTIME / $DISC_HIPBLAS
        name other libraries."""
        with self.lock:
            if self.gpu == kind:
                return
            if self.gpu:
                raise RuntimeFailure(f"this runtime drives a {self.gpu} GPU; a {kind} artifact needs a runtime of its own")
            if kind == "cuda":
                driver, blas = os.environ.get("DISC_CUDA_DRIVER") or None, cublas_library()
            else:
                driver, blas = os.environ.get("DISC_HIP_RUNTIME", "libamdhip64.so"), os.environ.get("DISC_HIPBLAS", "libhipblas.so")
            status = ral().ral_runtime_enable_gpu(self.handle, driver.encode() if driver else None, blas.encode() if blas else None, 0)
            if status != 0:
                raise RuntimeFailure(f"cannot use a {kind.upper()} GPU: {ral().ral_runtime_create_error().decode()}")
            self.gpu = kind

    def to_device(self, a: np.ndarray) -> DeviceArray:
        """A device copy of a host array (contiguous), freed when the returned array dies; the
        copy is done on return (the array may be used on any stream)."""
        a = np.ascontiguousarray(a)
        out = ctypes.c_void_p()
        if ral().ral_gpu_alloc(self.handle, max(a.nbytes, 1), ctypes.byref(out)) != 0:
            raise RuntimeFailure(f"cannot allocate {a.nbytes} bytes of device memory: {ral().ral_runtime_create_error().decode()}")
        d = _device_copy(out.value, a)
        weakref.finalize(d, self._free, ctypes.c_void_p(out.value))  # holds the runtime: it frees its buffers when destroyed
        with _Context(self) as ctx:
            _copy(ctx, out.value, a.ctypes.data, a.nbytes, HOST_TO_DEVICE)
            _synchronize(ctx)
        return d

    def _free(self, address: ctypes.c_void_p) -> None:
        ral().ral_gpu_free(self.handle, address)

    def reset_peak(self) -> None:
        ral().ral_runtime_reset_peak(self.handle)

    def trim(self) -> None:
        """Gives every cached block (host and GPU memory) back to the system."""
        ral().ral_runtime_trim(self.handle)

    def set_cache_limits(self, max_cached_bytes: int = 1 << 30, idle_seconds: float = 10.0) -> None:
        """Host memory given back by calls is kept for reuse up to `max_cached_bytes` in all and
        for `idle_seconds` (the defaults); past either it goes back to the system."""
        ral().ral_runtime_set_cache_limits(self.handle, max(int(max_cached_bytes), 0), max(int(idle_seconds * 1000), 0))

    def memory_stats(self, device: str = "host") -> dict[str, int]:
        """The allocator's figures for host memory, or ("gpu") for device memory (zeros before
        the GPU is attached)."""
        if device not in ("host", "gpu"):
            raise DiscError(f"memory_stats: device is 'host' or 'gpu', not {device!r}")
        st = MemoryStats()
        (ral().ral_runtime_memory_stats if device == "host" else ral().ral_runtime_gpu_memory_stats)(self.handle, ctypes.byref(st))
        return {name: getattr(st, name) for name, _ in MemoryStats._fields_}


_default_runtime: Runtime | None = None
_default_lock = threading.Lock()


def default_runtime() -> Runtime:
    global _default_runtime
    with _default_lock:
        if _default_runtime is None:
            _default_runtime = Runtime(int(os.environ.get("DISC_NUM_THREADS", "0")))
        return _default_runtime


class PackedFunction:
    """One packed entry point of a compiled shared object (docs/artifact.md): `(void **args, void
    *results)`, results as consecutive memref descriptors (3 + 2 * rank int64 words each), called
    through the RAL (`ral_context_call`: a failed allocation ends the call there)."""

    def __init__(self, lib: ctypes.CDLL, name: str, result_ranks: Sequence[int]):
        self.address = symbol_address(lib, name)
        self.ranks = list(result_ranks)
        self.starts = np.cumsum([0] + [3 + 2 * r for r in self.ranks]).tolist()

    def __call__(self, ctx: ctypes.c_void_p, args: int) -> list[list[int]]:
        """`ctx`: the current context; `args`: the address of the argument pointers
        (`descriptors`). Each result's descriptor words; the context's status says whether the
        call failed."""
        words = (ctypes.c_int64 * max(1, self.starts[-1]))()
        ral().ral_context_call(ctx, self.address, args, ctypes.addressof(words))
        return [words[a:b] for a, b in zip(self.starts, self.starts[1:])]


def descriptors(arrays: Sequence[np.ndarray | DeviceArray]) -> tuple[ctypes.Array, int]:
    """The arrays' memref descriptors laid out in one int64 buffer (allocated and aligned
    pointer, offset 0, sizes, strides in elements) followed by a pointer to each; returns the
    buffer and the address of the pointers, valid while the buffer lives. (One buffer: building
    ctypes structures per argument costs several microseconds each.)"""
    words, starts = [], []
    for a in arrays:
        starts.append(len(words))
        if isinstance(a, DeviceArray):
            words += [a.address, a.address, 0, *a.shape, *a.strides]
            continue
        address = a.__array_interface__["data"][0]
        words += [address, address, 0, *a.shape, *(s // a.itemsize for s in a.strides)]
    buffer = (ctypes.c_int64 * (len(words) + len(starts)))()
    base = ctypes.addressof(buffer)
    buffer[:] = words + [base + 8 * i for i in starts]
    return buffer, base + 8 * len(words)


def _layout(desc: list[int], dtype: np.dtype, rank: int) -> tuple[int, int, tuple[int, ...], tuple[int, ...], int]:
    """A result descriptor's allocated pointer, the address of its first element, its shape, its
    strides in bytes, and the bytes from its first element to the end of its last (0: empty)."""
    allocated, aligned, offset = desc[:3]
    shape = tuple(desc[3:3 + rank])
    strides = tuple(s * dtype.itemsize for s in desc[3 + rank:3 + 2 * rank])
    return allocated, aligned + offset * dtype.itemsize, shape, strides, _span(shape, strides, dtype.itemsize)


def _span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    """The bytes from an array's first element to the end of its last (strides in bytes; 0: empty)."""
    return 0 if 0 in shape else sum((n - 1) * abs(s) for n, s in zip(shape, strides)) + itemsize


def _host_result(item: tuple, dtype: np.dtype) -> np.ndarray:
    """A result of the host call path: (the call's buffer, taken for it, or None; the address of
    its first element; shape; strides in elements). Where the call's buffer could not be taken (an
    argument, a parameter or a constant returned, or a strided view), a copy."""
    owner, address, shape, strides = item
    if owner is not None:
        return np.ndarray(shape, dtype, buffer=owner)
    strides = tuple(st * dtype.itemsize for st in strides)
    span = _span(shape, strides, dtype.itemsize)
    if span == 0:
        return np.zeros(shape, dtype)
    return np.ndarray(shape, dtype, buffer=(ctypes.c_char * span).from_address(address), strides=strides).copy()


def _device_result(rt: "Runtime", ctx: ctypes.c_void_p, desc: list[int], dtype: np.dtype, rank: int,
                   consume: Callable[["_Exported"], Any] | None) -> Any:
    """A result in device memory: handed to `consume` (a framework's DLPack import) without a
    copy where the call's buffer can be taken (else first copied into a buffer of the call's: an
    argument, a parameter or a constant returned), or copied into a numpy array."""
    allocated, address, shape, strides, span = _layout(desc, dtype, rank)
    code = _dlpack_type(dtype)
    if consume is not None and code is not None:
        if address != allocated or not ral().ral_context_take(ctx, ctypes.c_void_p(allocated)):
            copy = _call_buffer(ctx, span)
            _copy(ctx, copy, address, span, DEVICE_TO_DEVICE)
            address = copy
            ral().ral_context_take(ctx, ctypes.c_void_p(copy))
        dims = (ctypes.c_int64 * max(1, 2 * rank))(*shape, *desc[3 + rank:3 + 2 * rank])
        at = ctypes.addressof(dims)
        managed = ral().ral_gpu_dlpack(rt.handle, ctypes.c_void_p(address), rank, at, at + 8 * rank, *code)
        if not managed:
            ral().ral_gpu_free(rt.handle, ctypes.c_void_p(address))
            raise RuntimeFailure("out of memory exporting a result")
        return consume(_Exported(managed, (DLPACK_DEVICES[rt.gpu], 0)))
    if span == 0:
        return np.zeros(shape, dtype)
    host = np.empty(span // dtype.itemsize, dtype)
    _copy(ctx, host.ctypes.data, address, span, DEVICE_TO_HOST)
    view = np.lib.stride_tricks.as_strided(host, shape, strides)
    return view if strides == tuple(dtype.itemsize * math.prod(shape[i + 1:]) for i in range(rank)) else view.copy()


DLPACK_DEVICES = {"cuda": 2, "rocm": 10}  # DLPack's kDLCUDA, kDLROCM
_DLPACK_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}  # numpy's kinds as DLPack type codes


@functools.cache
def _dlpack_type(dtype: np.dtype) -> tuple[int, int] | None:
    """DLPack's (type code, bits) of a dtype; None for one DLPack has no code for (the float8s)."""
    if dtype == ml_dtypes.bfloat16:
        return 4, 16
    code = None if dtype.type.__module__.startswith("ml_dtypes") else _DLPACK_CODES.get(dtype.kind)
    return None if code is None else (code, dtype.itemsize * 8)


# DLPack capsules (prototypes of their own: ctypes.pythonapi's are shared with other code)
_CAPSULE = b"dltensor"
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule: int) -> None:
    """A capsule no framework took (those that take one rename it and call its deleter later)."""
    if _capsule_valid(capsule, _CAPSULE):
        ral().ral_dlpack_delete(_capsule_pointer(capsule, _CAPSULE))


class _Exported:
    """A device result for a framework's `from_dlpack` (the DLPack protocol): complete on the
    call's stream (the caller's: torch's current stream; JAX's results are waited for)."""

    def __init__(self, managed: int, device: tuple[int, int]):
        self._managed, self._device = managed, device

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        managed, self._managed = self._managed, None
        if managed is None:
            raise DiscError("this result was exported already")
        return _capsule_new(managed, _CAPSULE, ctypes.cast(_capsule_destructor, ctypes.c_void_p))

    def __del__(self) -> None:
        if self._managed is not None:
            ral().ral_dlpack_delete(self._managed)


_load_lock = threading.Lock()
_loaded = 0


def _load_shared_object(image: memoryview) -> ctypes.CDLL:
    """dlopens a shared object held in memory: written to a file of a name no other load in this
    process uses (the loader recognises libraries by name), loaded, and removed at once."""
    global _loaded
    with _load_lock:
        _loaded += 1
        n = _loaded
    path = os.path.join(tempfile.gettempdir(), f"disc-{os.getpid()}-{n}-{os.urandom(6).hex()}.so")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(image)
        return ctypes.CDLL(path)
    except OSError as e:
        raise ArtifactError(f"cannot load the artifact's shared object: {e}") from None
    finally:
        os.unlink(path)


class Executable:
    """A loaded artifact: the entry function, its optional guard, its parameters, and how to call them."""

    def __init__(self, art: Artifact, runtime: Runtime):
        self.artifact = art
        # a GPU artifact loads anywhere (it is compiled and saved on machines without a GPU): the GPU
        # is attached and the parameters copied to it at the first call
        kind = art.header["target"]["name"].partition(":")[0]
        self.gpu = kind if kind in ("cuda", "rocm") else ""
        self.lib = _load_shared_object(art.section("object"))
        self.signature = art.signature
        self.runtime = runtime
        self.params = art.params()  # the entry's trailing arguments, after the caller's
        self._device_params: list[DeviceArray] | None = None
        self._lock = threading.Lock()
        self.entry = PackedFunction(self.lib, art.header["entry"], [len(r.shape) for r in self.signature.results])
        self.assertions = art.assertions
        self.guard = PackedFunction(self.lib, art.header["guard"], [1]) if art.header["guard"] else None
        if not self.gpu:
            variables: dict[str, int] = {}  # dimension variable -> its index
            args = [(spec.dtype, tuple(d if isinstance(d, int) else -1 - variables.setdefault(d, len(variables)) for d in spec.shape))
                    for spec in self.signature.args]
            self._plan = native().plan(runtime, runtime.handle.value, self.entry.address, self.guard.address if self.guard else 0,
                                       np.ndarray, args, len(variables), [np.ascontiguousarray(p) for p in self.params],
                                       [(len(r.shape), r.dtype.itemsize) for r in self.signature.results])

    def run(self, arrays: Sequence[np.ndarray | DeviceArray], stream: int = 0,
            consume: Callable[[_Exported], Any] | None = None, synchronize: bool = False) -> list[Any]:
        """Runs the entry on host arrays, numpy results back. A GPU artifact also takes
        `DeviceArray`s; host arrays are copied to the device, and results back to the host, or
        given to `consume` (a framework's DLPack import) without a copy. The launches and copies
        go on `stream` (a CUstream; 0: the default stream); `synchronize`: waited for."""
        if not self.gpu:
            # in C (native.c), for arrays exactly as compiled; others are converted first where they can be
            out = native().call(self._plan, arrays)
            if out is None:
                if any(isinstance(a, DeviceArray) for a in arrays):
                    raise DiscError("an argument is in GPU memory, and this function was compiled for the CPU (target='x86')")
                out = native().call(self._plan, self._checked(arrays))
            if type(out) is list:
                return [_host_result(item, spec.dtype) for item, spec in zip(out, self.signature.results)]
            if out is None:
                raise DiscError("internal error: arguments that pass the signature's check were refused by the call path")
            if out[0] == "guard":
                self._raise_guard(out[1])
            raise (ShapeError if out[1] == RAL_ERR_SHAPE else RuntimeFailure)(out[2])
        arrays = self._checked(arrays)
        with _Context(self.runtime) as ctx:
            params = self.params
            if self.gpu:
                params = self._on_device()
                ral().ral_context_set_stream(ctx, ctypes.c_void_p(stream))
                arrays = [a if isinstance(a, DeviceArray) else _upload(ctx, a) for a in arrays]
            _keep, args = descriptors(arrays + params)
            if self.guard is not None:
                packed = self.guard(ctx, args)[0]
                self._check_status(ctx)
                self._raise_guard((ctypes.c_int64 * packed[3]).from_address(packed[1] + 8 * packed[2]))
            results = self.entry(ctx, args)
            self._check_status(ctx)
            outs = [_device_result(self.runtime, ctx, desc, spec.dtype, len(spec.shape), consume)
                    for desc, spec in zip(results, self.signature.results)]
            if synchronize:
                _synchronize(ctx)
            return outs

    def _checked(self, arrays: Sequence[np.ndarray | DeviceArray]) -> list[np.ndarray | DeviceArray]:
        """The arguments checked against the signature (a ShapeError naming the argument) and made
        what the compiled code takes: native byte order, C-contiguous, the signature's dtype object."""
        if len(arrays) != len(self.signature.args):
            self.signature.check(arrays)  # the count's error
        arrays = [a if isinstance(a, DeviceArray) else _as_numpy(a, "numpy", spec.dtype) for a, spec in zip(arrays, self.signature.args)]
        arrays = [a if isinstance(a, DeviceArray) or a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))
                  for a in arrays]  # other byte order: converted
        self.signature.check(arrays)
        return [a if isinstance(a, DeviceArray) else (a if a.flags.c_contiguous else _contiguous(a, spec.name)).view(spec.dtype)
                for a, spec in zip(arrays, self.signature.args)]  # (ascontiguousarray makes a 0-d array 1-d)

    def _on_device(self) -> list[DeviceArray]:
        """The parameters' device copies (the GPU attached first)."""
        with self._lock:
            if self._device_params is None:
                self.runtime.enable_gpu(self.gpu)
                self._device_params = [self.runtime.to_device(p) for p in self.params]
            return self._device_params

    def _check_status(self, ctx: ctypes.c_void_p) -> None:
        status = ral().ral_context_status(ctx)
        if status != 0:
            raise (ShapeError if status == RAL_ERR_SHAPE else RuntimeFailure)(ral().ral_context_message(ctx).decode())

    def _raise_guard(self, values: Sequence[int]) -> None:
        """The guard's words: the index of the assertion that failed (-1: none), then the values
        of every assertion."""
        failed = values[0]
        if failed >= 0:
            start = 1 + sum(a.num_values for a in self.assertions[:failed])
            raise ShapeError(self.assertions[failed].format(list(values[start:start + self.assertions[failed].num_values])))


@dataclasses.dataclass
class Binding:
    """How a caller's arguments map to the compiled inputs and the results back to the source
    function's structure (JAX pytrees, TF nests, a PyTorch model's outputs). A loaded artifact keeps
    all of it but TF's nests: it takes the arguments as the function did (or their flat leaves;
    the fixed ones too, checked) and gives the results back in the function's structure where
    `result_tree` could describe it (else one array or a tuple)."""
    kept_args: tuple[int, ...] | None = None  # flat argument indices the module keeps (JAX drops unused ones)
    num_flat_args: int | None = None
    pytree: str = ""                          # "jax" or "torch": arguments are that library's pytrees
    keywords: tuple[str, ...] = ()            # keyword arguments, read after the positional ones in this order
    fixed: tuple[tuple[int, str, Any], ...] = ()  # (flat index, name, value) of arguments fixed when compiled (PyTorch's non-tensors)
    pack_results: Callable[[list], Any] | None = None
    result_tree: Any = None  # the results' structure for a loaded artifact (`result_tree`), or None

    def to_json(self) -> dict[str, Any]:
        return {"kept_args": list(self.kept_args) if self.kept_args is not None else None, "num_flat_args": self.num_flat_args,
                "pytree": self.pytree, "keywords": list(self.keywords), "fixed": [list(f) for f in self.fixed],
                "result_tree": self.result_tree}

    @staticmethod
    def from_json(saved: dict[str, Any]) -> Binding:
        """The binding a saved artifact keeps; its results packed as `result_tree` says."""
        b = Binding(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) and k != "result_tree" else v
                       for k, v in saved.items()})
        return dataclasses.replace(b, pack_results=_result_packer(b.pytree, b.result_tree))

    def without_fixed(self, leaves: list[Any]) -> list[Any]:
        """The leaves without the arguments fixed when compiled, each checked to be what it was then."""
        for i, name, value in self.fixed:
            x = leaves[i] if i < len(leaves) else None
            if i < len(leaves) and (hasattr(x, "shape") or isinstance(x, bool) != isinstance(value, bool) or x != value):
                raise ShapeError(f"argument '{name}' is {x!r}; this function was compiled for {value!r} (torch.export fixes "
                                 "arguments that are not tensors at their example values: compile again for another value)")
        skip = {f[0] for f in self.fixed}
        return [x for i, x in enumerate(leaves) if i not in skip]


def result_tree(structure: Any) -> Any:
    """A JSON description of a structure of results whose leaves are "*": "*", ["tuple" | "list",
    [...]], ["dict", [[key, ...], ...]] (string keys), None; or None where it holds anything else
    (a namedtuple, a custom node: a loaded artifact then gives the results as a tuple)."""
    def describe(node: Any) -> Any:
        if type(node) in (tuple, list):
            return [type(node).__name__, [describe(x) for x in node]]
        if type(node) is dict and all(isinstance(k, str) for k in node):
            return ["dict", [[k, describe(v)] for k, v in node.items()]]
        if node is None or node == "*":
            return node
        raise ValueError(node)
    try:
        return describe(structure)
    except ValueError:
        return None


def _result_packer(pytree: str, tree: Any) -> Callable[[list], Any] | None:
    """Results in the structure `result_tree` described (PyTorch's: its own TreeSpec, as text)."""
    if tree is None:
        return None
    if pytree == "torch":
        def pack(outs: list) -> Any:
            from torch.utils._pytree import treespec_loads, tree_unflatten

            return tree_unflatten(outs, treespec_loads(tree))
        return pack

    def build(node: Any, leaves: Iterator[Any]) -> Any:
        if node == "*":
            return next(leaves)
        if node is None:
            return None
        kind, children = node
        if kind == "dict":
            return {k: build(c, leaves) for k, c in children}
        built = [build(c, leaves) for c in children]
        return tuple(built) if kind == "tuple" else built
    return lambda outs: build(tree, iter(outs))


class CompiledFunction:
    """A function compiled once for every shape its signature admits.

    Call it with numpy arrays (numpy out), JAX arrays (JAX out), torch tensors (torch out) or
    tf.Tensors (tf.Tensor out); results follow the source function's structure (JAX pytrees, TF
    nests, a PyTorch model's outputs) or come as one array / a tuple. `save(path)` writes its artifact; `disc.load(path)`
    gives it back in any process, without the compiler."""

    def __init__(self, executable: Executable, binding: Binding | None = None, compile_count: int = 1):
        art = executable.artifact
        self._exe = executable
        self._binding = binding or Binding.from_json(art.header["binding"])
        self.signature = executable.signature
        self.kernels = art.kernels  # the loop nests (kind, ops inside) run on the RAL thread pool
        self.compile_count = compile_count  # native code generations: 1, or 0 when loaded
        self.compile_seconds: dict[str, float] = {}  # the compilation's stages in this process (compiler.compile_source)
        kept = self._binding.kept_args
        self._select = None if kept is None or kept == tuple(range(self._binding.num_flat_args)) else kept

    @property
    def llvm_ir(self) -> str:
        """The LLVM IR the shared object was generated from."""
        return self._exe.artifact.llvm_ir

    def save(self, path: str | os.PathLike) -> None:
        """Writes the artifact to one file (docs/artifact.md): shared object, parameters, metadata."""
        self._exe.artifact.save(os.fspath(path))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b = self._binding
        if kwargs.keys() != set(b.keywords) and (kwargs or not b.keywords):  # (none: every leaf given in order)
            raise ShapeError(f"expected the keyword arguments {sorted(b.keywords)} (as compiled), got {sorted(kwargs)}")
        given = args + tuple(kwargs[k] for k in b.keywords if kwargs)
        # JAX: a nested list of numbers is an array, unless the count says it is a list of scalar arguments
        # (PyTorch's lists of numbers are arguments torch.export fixed)
        leaves, kind = _flatten(given, b.pytree, numbers_as_arrays=b.pytree == "jax")
        if b.pytree == "jax" and b.kept_args is not None and len(leaves) != b.num_flat_args:
            leaves, kind = _flatten(given, b.pytree)
        if b.fixed:
            leaves = b.without_fixed(leaves)
        if b.kept_args is not None:
            if len(leaves) != b.num_flat_args:
                raise ShapeError(f"expected {b.num_flat_args} array arguments, got {len(leaves)}")
            if self._select is not None:
                leaves = [leaves[i] for i in self._select]
        if len(leaves) != len(self.signature.args):  # (extra ones were dropped by the zips below)
            raise ShapeError(f"expected {len(self.signature.args)} array arguments, got {len(leaves)}")
        if self._exe.gpu and any(_on_gpu(x, kind) for x in leaves):
            outs = self._run_on_gpu(leaves, kind)
        elif kind == "numpy":  # lists and other array-likes are made arrays where the call path needs it
            outs = self._exe.run(leaves)
        else:
            outs = [_as_kind(o, kind) for o in self._exe.run([_as_numpy(x, kind, spec.dtype) for x, spec in zip(leaves, self.signature.args)])]
        if b.pack_results is not None:
            return b.pack_results(outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run_on_gpu(self, leaves: list[Any], kind: str) -> list[Any]:
        """GPU arrays in (torch tensors, or JAX arrays), the same kind out without copies
        (DLPack): torch's work on the tensors' device's current stream, which the results are
        complete on; JAX's arrays are waited for before, and the results before they are given
        back (JAX's own streams have no order to ours). Host arrays among them are copied in."""
        if kind == "torch":
            import torch

            device = next(x.device for x in leaves if x.is_cuda)
            stream, consume, synchronize = torch.cuda.current_stream(device).cuda_stream, torch.from_dlpack, False
        else:
            import jax

            device = next(iter(next(x for x in leaves if _on_gpu(x, kind)).devices()))
            stream, consume, synchronize = 0, jax.dlpack.from_dlpack, True
        args, keep = [], []  # `keep`: the arrays read in place live until the call returns
        for x, spec in zip(leaves, self.signature.args):
            if not _on_gpu(x, kind):
                args.append(_as_numpy(x, kind, spec.dtype))
                continue
            if kind == "torch":
                x = x.detach().contiguous()
                address, strides, dtype = x.data_ptr(), tuple(x.stride()), _numpy_dtype(x.dtype)
            else:
                x = x.block_until_ready()
                address, dtype = x.unsafe_buffer_pointer(), np.dtype(x.dtype)
                strides = tuple(math.prod(x.shape[i + 1:]) for i in range(x.ndim))  # JAX arrays: dense, row-major
            keep.append(x)
            args.append(DeviceArray(address, tuple(x.shape), strides, dtype))
        outs = self._exe.run(args, stream, consume, synchronize)
        return [o if not isinstance(o, np.ndarray) else _to_device(_as_kind(o, kind), kind, device) for o in outs]

    @property
    def symbolic_result_shapes(self) -> list[tuple[str, ...]]:
        """Each result's dims as expressions over the dimension variables (e.g. ('b', '2*s'))."""
        return [tuple(dims) for dims in self._exe.artifact.header["info"]["symbolic_result_shapes"]]

    def shape_report(self) -> str:
        """Dimension variables, symbolic shapes of arguments, results and intermediates, the
        facts collected, and which broadcasts rely on which fact."""
        return self._exe.artifact.header["info"]["shape_report"]

    def memory_stats(self, device: str = "host") -> dict[str, int]:
        return self._exe.runtime.memory_stats(device)

    def stats(self) -> dict[str, dict[str, float]]:
        """Per kernel of this function: calls, how many ran on the thread pool ("pool"), behind
        the row blocks of the GEMM whose epilogue it is ("fused") and inline ("inline": the
        small-size version chosen from the real sizes), and total seconds; plus the library
        GEMM entries (counted over the whole process, while `collect_stats()` is on). Kernels generated in versions
        (`kernels[i].version`) count separately, so the counts say which version ran; kernels of one
        structure (the same code: one object, `targets/codegen.py`) share their counters. CPU
        targets only: a GPU's kernels are timed with its vendor's profiler (nsys, rocprof)."""
        if self._exe.gpu:
            raise DiscError(f"stats() counts CPU kernels; this function runs its kernels on a {self._exe.gpu} GPU "
                            "(time them with the vendor's profiler: nsys, rocprof)")
        if not _collecting:
            raise DiscError("kernel statistics are off: call disc.collect_stats() (or set DISC_STATS=1) before the calls to count")
        out = {k.name: kernel_stats(symbol_address(self._exe.lib, k.name)) for k in self.kernels}
        for name in self._exe.artifact.header["info"]["library_calls"]:
            out[name] = kernel_stats(symbol_address(ral(), name))
        return out

    def entry_time(self) -> dict[str, float]:
        """Calls of the compiled code and the seconds spent in it, over this function's life (every
        thread): a call's time beyond it is the call path's (arguments checked and passed,
        results wrapped). CPU targets only."""
        if self._exe.gpu:
            raise DiscError(f"entry_time() times the host call path; this function runs on a {self._exe.gpu} GPU")
        calls, ns = native().entry_time(self._exe._plan)
        return {"calls": calls, "seconds": ns * 1e-9}


@functools.cache
def _numpy_dtype(torch_dtype: Any) -> np.dtype:
    """The numpy (or ml_dtypes) dtype a torch dtype's tensors are read as."""
    import torch

    return _as_numpy(torch.empty(0, dtype=torch_dtype), "torch", None).dtype


def _as_kind(o: np.ndarray, kind: str) -> Any:
    """A result as the kind of array the arguments were."""
    if kind == "jax":
        import jax

        if o.dtype.type.__module__.startswith("ml_dtypes"):  # numpy exports no DLPack for these
            return jax.numpy.asarray(o)
        return jax.dlpack.from_dlpack(o)  # shares the buffer where it is aligned as XLA wants (the RAL's are)
    if kind == "torch":
        return _torch_of(o)  # shares the buffer, no copy
    if kind == "tensorflow":
        import tensorflow as tf

        return tf.convert_to_tensor(o)
    return o


def _contiguous(a: np.ndarray, name: str) -> np.ndarray:
    """A row-major copy of the view `a` (a broadcast view's copy may not fit in memory)."""
    try:
        return np.ascontiguousarray(a)
    except MemoryError:
        raise RuntimeFailure(f"argument '{name}': out of memory copying the {a.dtype}{list(a.shape)} view into a row-major array "
                             f"({a.size * a.itemsize} bytes); the compiled code takes row-major arrays") from None


def _as_numpy(x: Any, kind: str, dtype: np.dtype) -> np.ndarray:
    """An argument as the numpy array the runtime takes: a torch tensor's data (those of dtypes
    numpy lacks, bfloat16 and the float8s, read through integers of their width as the
    ml_dtypes type of the same name); a Python list or number as an array of the argument's
    dtype (it has none of its own); any other array as it is (the signature names a wrong dtype)."""
    if type(x) is np.ndarray:
        return x
    if kind == "torch":
        x = x.detach().cpu()
        name = str(x.dtype).removeprefix("torch.")
        if x.dtype.is_floating_point and name not in ("float16", "float32", "float64"):
            import torch

            return x.view(torch.int16 if x.element_size() == 2 else torch.uint8).numpy().view(getattr(ml_dtypes, name))
        return x.numpy()
    if isinstance(x, (list, tuple, int, float, bool, complex)):
        return np.asarray(x, dtype=dtype)
    return np.asarray(x)


def _torch_of(o: np.ndarray) -> Any:
    """A result as a torch tensor sharing its buffer (an ml_dtypes array through integers of its
    width, as the torch dtype of the same name)."""
    import torch

    if not o.dtype.type.__module__.startswith("ml_dtypes"):
        return torch.from_numpy(o)
    t = getattr(torch, o.dtype.name, None)
    if not isinstance(t, torch.dtype):
        raise DiscError(f"a result of dtype {o.dtype.name} has no torch dtype to be returned as")
    return torch.from_numpy(o.view(np.int16 if o.itemsize == 2 else np.uint8)).view(t)


def _on_gpu(x: Any, kind: str) -> bool:
    """Whether `x` is a torch tensor or a JAX array in GPU memory."""
    if kind == "torch":
        return x.is_cuda
    return kind == "jax" and hasattr(x, "devices") and any(d.platform in ("gpu", "cuda", "rocm") for d in x.devices())


def _to_device(x: Any, kind: str, device: Any) -> Any:
    """A result the runtime gave back in host memory (of a dtype DLPack lacks) on the arguments' GPU."""
    if kind == "torch":
        return x.to(device)
    import jax

    return jax.device_put(x, device)


def _numbers(x: Any) -> bool:
    """Whether `x` is a (nested) list or tuple of Python numbers, as an array is written."""
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(v, (int, float, complex)) or _numbers(v) for v in x)


def _flatten(args: tuple, pytree: str, numbers_as_arrays: bool = False) -> tuple[list[Any], str]:
    """The array leaves, and which kind of array comes back: 'jax', 'torch' or 'numpy'. With
    `numbers_as_arrays` (JAX pytrees), nested lists of numbers are leaves (arrays) instead of lists of scalars."""
    is_leaf = _numbers if numbers_as_arrays else None
    if all(hasattr(x, "shape") for x in args):  # arrays alone are their own leaves (no import)
        leaves = list(args)
    elif pytree == "jax":
        import jax

        leaves = [leaf for x in args for leaf in jax.tree_util.tree_leaves(x, is_leaf=is_leaf)]
    elif pytree == "torch":
        from torch.utils._pytree import tree_leaves

        leaves = tree_leaves(args)
    else:
        leaves = list(args)
    modules = {t.__module__.split(".")[0] for t in {type(x) for x in leaves}}
    for kind, names in (("jax", ("jax", "jaxlib")), ("torch", ("torch",)), ("tensorflow", ("tensorflow",))):
        if modules & set(names):
            return leaves, kind
    return leaves, "numpy"


def read_npz(file: Any) -> list[np.ndarray]:
    """Arguments from an .npz (path or file object), in the order they were stored."""
    with np.load(file, allow_pickle=False) as data:
        return [data[k] for k in data.files]


def write_npz(file: Any, fn: CompiledFunction, outs: Sequence[np.ndarray]) -> None:
    """Results to an .npz (path or file object), named as the signature names them."""
    np.savez(file, **{spec.name: o for spec, o in zip(fn.signature.results, outs)})


def load(path: str | os.PathLike) -> CompiledFunction:
    """Loads an artifact written by `CompiledFunction.save` (or kept in the compile cache). A
    truncated, corrupted, other-version or other-target file raises ArtifactError and is not loaded."""
    return CompiledFunction(Executable(artifact.read(os.fspath(path)), default_runtime()), compile_count=0)
