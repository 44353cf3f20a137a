"""One-file artifacts (format: docs/artifact.md): written by the compiler, read by the runtime.

A `.disc` file holds the host shared object with its kernels, the parameters (64-byte aligned,
copied out of the read-only mapping at load) and a JSON header: the signature with its dimension variables,
the guard's messages, the target, versions and what the compiler reports (kernels, shape facts).
A SHA-256 over everything after the fixed prefix guards against truncated or corrupted files.
Reading needs neither MLIR nor LLVM nor any framework."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import mmap
import os
import platform
import struct
import threading
import zlib
from typing import Any, BinaryIO, Iterator, Sequence

import numpy as np

from .bounded_dynamism.signature import ELEMENT_TYPES, ArgSpec, Assertion, Signature, dtype_name
from .errors import ArtifactError

MAGIC = b"DISCSHLO"
FORMAT_VERSION = 1
RAL_ABI_VERSION = 8  # ral/ral.h's RAL_ABI_VERSION: the calls generated code makes into the RAL
PREFIX = 64          # magic, versions, header size, file size, checksum
ALIGN = 64
_PREFIX = struct.Struct("<8sIIQQ32s")
ENTRY, GUARD = "disc_call_entry", "disc_call_guard"  # the packed entry points (docs/artifact.md)
# constants of at least this many bytes leave the IR and become parameters; smaller ones (shapes,
# indices, scalars, short vectors the lowerings and folds look into) stay in it
PARAM_MIN_BYTES = 1024


def package_version() -> str:
    from . import __version__  # (not importlib.metadata: 40 ms of imports in every compiler worker's start)

    return __version__


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A loop nest the compiler generated (`CompiledFunction.kernels`)."""
    name: str
    kind: str              # fused loops: "stitch fusion" (a reduction and its consumers), "input fusion"
                           # (a reduction and its producers), "loop fusion"; one loop: "elementwise",
                           # "reduction" (inner loops), "copy" (moves data: transposes, broadcasts),
                           # "fill" (stores a value, computes nothing)
    parallel_dims: int     # the first one is split over the RAL thread pool
    ops: tuple[str, ...]   # the scalar ops inside, in order of first appearance
    version: str = ""      # for loops generated in versions chosen at run time: "broadcast-free" or "general"
    relies_on: tuple[str, ...] = ()  # shape facts its code or its bounds rely on (`mod(s, 16) == 0`, `t == s`)
    epilogue_of: str = ""  # the library call it runs behind, block by block (`disc_ral_gemm_f32`, `disc_ral_conv_f32`)

    def __str__(self) -> str:
        version = f" ({self.version} version)" if self.version else ""
        behind = f" behind {self.epilogue_of}" if self.epilogue_of else ""
        facts = f"; relies on {', '.join(self.relies_on)}" if self.relies_on else ""
        return f"{self.name}: {self.kind}{version}{behind}, {self.parallel_dims} parallel dims, ops {', '.join(self.ops)}{facts}"


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    """The flags /proc/cpuinfo lists for this machine's processor."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_flags_needed(features: str) -> list[str]:
    """The /proc/cpuinfo flags among LLVM's enabled `features` (`+avx2,+sse4.2,-sse4a`)."""
    enabled = {f[1:].replace(".", "_") for f in features.split(",") if f.startswith("+")}
    return sorted(enabled & host_cpu_flags())


def _spec_json(spec: ArgSpec) -> dict:
    return {"name": spec.name, "dtype": dtype_name(spec.dtype), "shape": list(spec.shape)}


def _spec(d: dict) -> ArgSpec:
    return ArgSpec(d["name"], tuple(d["shape"]), ELEMENT_TYPES[d["dtype"]])


@dataclasses.dataclass(frozen=True)
class Deferred:
    """A parameter the compiler knows by its type only: the process that holds its bytes (the
    caller whose PyTorch model it belongs to) writes them into the artifact (`complete`), so
    weights are never serialised for the compiler nor copied through it."""
    index: int            # in the weights the caller held back (`Source.weights`)
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclasses.dataclass
class Contents:
    """What an artifact holds, as the compiler hands it over."""
    signature: Signature
    assertions: list[Assertion]
    target: dict[str, Any]      # name, triple, cpu, cpu_flags
    shared_object: bytes
    llvm_ir: str
    params: Sequence[np.ndarray]
    info: dict[str, Any]        # kernels, shape report, ... (for inspection)
    binding: dict[str, Any] = dataclasses.field(default_factory=dict)  # how a caller's flat arguments map to the inputs


def write(path: str, c: Contents) -> list[tuple[int, int, int]]:
    """Writes the artifact to `path`, except for the bytes of its `Deferred` parameters and the
    checksum: the file is valid once `complete` has written them. Returns (index in the caller's
    weights, offset, bytes) of each deferred parameter."""
    llvm_ir = zlib.compress(c.llvm_ir.encode(), 1)
    params = [p if isinstance(p, Deferred) else np.ascontiguousarray(p) for p in c.params]
    header: dict[str, Any] = {
        "package_version": package_version(), "target": c.target, "entry": ENTRY, "guard": GUARD if c.assertions else None,
        "inputs": [_spec_json(a) for a in c.signature.args], "outputs": [_spec_json(r) for r in c.signature.results],
        "assertions": [{"message": a.message, "num_values": a.num_values} for a in c.assertions],
        "binding": c.binding, "info": c.info,
    }
    size = 0
    for _ in range(8):  # the offsets depend on the header's length and the length on the offsets: a fixpoint
        offset = PREFIX + _align(size)
        sections = {}
        for name, blob in (("object", c.shared_object), ("llvm_ir", llvm_ir)):
            sections[name] = [offset, len(blob)]
            offset = _align(offset + len(blob))
        header["sections"] = sections
        header["params"] = []
        for p in params:
            header["params"].append({"dtype": dtype_name(p.dtype), "shape": list(p.shape), "offset": offset, "nbytes": p.nbytes})
            offset = _align(offset + p.nbytes)
        text = json.dumps(header, separators=(",", ":")).encode()
        if len(text) <= _align(size):
            break
        size = len(text)
    with open(path, "wb") as f:
        f.write(_PREFIX.pack(MAGIC, FORMAT_VERSION, RAL_ABI_VERSION, len(text), offset, bytes(32)))
        f.seek(PREFIX)
        f.write(text)
        for blob, (at, _) in zip((c.shared_object, llvm_ir), sections.values()):
            f.seek(at)
            f.write(blob)
        for p, entry in zip(params, header["params"]):
            if not isinstance(p, Deferred):
                f.seek(entry["offset"])
                f.write(p.reshape(-1).view(np.uint8))
        f.truncate(offset)  # the gaps (and the deferred parameters' room until written) read as zeros
    return [(p.index, entry["offset"], p.nbytes) for p, entry in zip(params, header["params"]) if isinstance(p, Deferred)]


def complete(partial: str, path: str, fills: Sequence[tuple[np.ndarray, int, int]]) -> None:
    """Makes the file `write` left at `partial` a valid artifact at `path`: writes each
    (array, offset, bytes) of `fills` (the deferred parameters, one copy from the caller's
    memory; an array of another size than the room left for it is refused, not written over its
    neighbours) and the checksum, then renames it into place (a concurrent reader sees all of it
    or nothing). The checksum is computed beside the writes, over the deferred parameters in memory."""
    blobs = sorted((at, np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for a, at, _ in fills)
    try:
        if _wrong_size(fills):
            raise ArtifactError(f"{partial}: {_wrong_size(fills)}")
        with open(partial, "r+b") as f, mmap.mmap(f.fileno(), 0) as data:
            digest = hashlib.sha256()

            def checksum() -> None:
                view, done = memoryview(data), PREFIX
                for at, blob in blobs:
                    digest.update(view[done:at])
                    digest.update(blob)
                    done = at + len(blob)
                digest.update(view[done:])
                view.release()

            summing = threading.Thread(target=checksum)
            summing.start()
            try:
                for at, blob in blobs:
                    os.pwrite(f.fileno(), blob, at)
            finally:
                summing.join()
            data[32:PREFIX] = digest.digest()  # the prefix's last field
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


COPY_PIECE = 32 << 20  # bytes: a large copy is cut into pieces of this size, shared by up to COPY_THREADS threads
COPY_THREADS = 4


def _copy(pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Copies each (destination, source) pair of byte arrays; a large copy in pieces over several
    threads: its cost is mostly the first touch of the destination's fresh pages, which each
    thread takes in parallel (440 MB of BERT-base weights: 1.05 -> 0.54 s on two cores where the
    kernel maps small pages, 0.074 -> 0.035 s where it maps huge ones)."""
    pieces = [(d[i:i + COPY_PIECE], s[i:i + COPY_PIECE]) for d, s in pairs for i in range(0, len(d), COPY_PIECE)]
    threads = min(COPY_THREADS, len(os.sched_getaffinity(0)), len(pieces))
    if threads < 2:
        for d, s in pieces:
            np.copyto(d, s)
        return
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda piece: np.copyto(*piece), pieces))


def _wrong_size(fills: Sequence[tuple[np.ndarray, int, int]]) -> str | None:
    """What is wrong with weights (array, offset, bytes) of another size than the room left for them."""
    wrong = [(a.nbytes, nbytes, at) for a, at, nbytes in fills if a.nbytes != nbytes]
    return (f"internal compiler error: weights of {wrong[0][0]} bytes for the {wrong[0][1]} bytes left at offset {wrong[0][2]}"
            if wrong else None)


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A file written beside `path` and renamed into place once complete: a concurrent reader
    sees all of it or nothing, and a failed write leaves nothing behind."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@dataclasses.dataclass
class Artifact:
    """A verified artifact, mapped read-only; or one just compiled, without its checksum, whose
    deferred parameters are still in the caller's memory (`pending`: offset -> array), which
    `params` reads there and `save` writes: a model's weights need not go through a file it may
    never keep. `pending` is None for a whole file."""
    path: str
    header: dict[str, Any]
    data: mmap.mmap
    pending: dict[int, np.ndarray] | None = None

    def section(self, name: str) -> memoryview:
        offset, size = self.header["sections"][name]
        return memoryview(self.data)[offset:offset + size]

    def params(self) -> list[np.ndarray]:
        """The parameters, read-only, copied out of the mapped file (or the caller's memory, for
        pending ones) into one block of the process's own memory: kernels stream weights from
        there markedly faster than from the file's page-cache pages once other work has taken
        them out of the cache (GPT-2 at (1, 32): a call after another model's 58 -> 47 ms).
        Pending parameters are then the block's copies (what `save` writes)."""
        params = self.header["params"]
        if not params:
            return []
        start = min(p["offset"] for p in params)
        size = max(p["offset"] + p["nbytes"] for p in params) - start
        memory = np.empty(size + ALIGN, np.uint8)
        skip = -memory.ctypes.data % ALIGN  # the file's alignment kept
        block = memory[skip:skip + size]
        pairs = []
        for p in params:
            at, n = p["offset"], p["nbytes"]
            pending = self.pending.get(at) if self.pending else None
            pairs.append((block[at - start:at - start + n], np.frombuffer(self.data, np.uint8, n, at) if pending is None
                          else np.ascontiguousarray(pending).reshape(-1).view(np.uint8)))
        _copy(pairs)
        block.flags.writeable = False
        out = [np.frombuffer(block, ELEMENT_TYPES[p["dtype"]], int(np.prod(p["shape"], dtype=np.int64)), p["offset"] - start)
               .reshape(p["shape"]) for p in params]
        if self.pending is not None:
            self.pending = {p["offset"]: a for p, a in zip(params, out) if p["offset"] in self.pending}
        return out

    def save(self, path: str) -> None:
        """Writes the artifact to `path` (renamed into place once complete); a just compiled one
        gets its pending parameters and its checksum (`complete`)."""
        if self.pending is None:
            with replacing(path) as f:
                f.write(memoryview(self.data))
            return
        partial = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"
        try:
            with open(partial, "wb") as f:
                f.write(memoryview(self.data))
        except BaseException:  # a failed write leaves nothing behind (`complete` removes it after)
            if os.path.exists(partial):
                os.unlink(partial)
            raise
        complete(partial, path, [(a, at, a.nbytes) for at, a in self.pending.items()])

    @property
    def signature(self) -> Signature:
        return Signature(tuple(_spec(a) for a in self.header["inputs"]), tuple(_spec(r) for r in self.header["outputs"]))

    @property
    def assertions(self) -> list[Assertion]:
        return [Assertion(a["message"], a["num_values"]) for a in self.header["assertions"]]

    @property
    def llvm_ir(self) -> str:
        return zlib.decompress(self.section("llvm_ir")).decode()

    @property
    def kernels(self) -> list[Kernel]:
        return [Kernel(**{k: tuple(v) if isinstance(v, list) else v for k, v in kd.items()}) for kd in self.header["info"]["kernels"]]


def read(path: str, verify: bool = True, pending: Sequence[tuple[np.ndarray, int, int]] | None = None) -> Artifact:
    """Maps and verifies an artifact; ArtifactError says what is wrong with a file that is not one.
    `verify=False` skips the checksum, for a file this process has just completed, or one the
    compiler has just written but for the deferred parameters `pending` ((array, offset, bytes),
    as `complete` takes them), which stay in this process's memory (`Artifact.pending`)."""
    def bad(why: str) -> ArtifactError:
        return ArtifactError(f"{path}: {why}")

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < PREFIX:
                raise bad(f"not a disc_stablehlo artifact (truncated: {size} bytes)")
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise bad(f"cannot read the artifact: {e.strerror}") from None
    magic, fmt, abi, header_size, file_size, checksum = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise bad("not a disc_stablehlo artifact (wrong magic number)")
    if fmt != FORMAT_VERSION:
        raise bad(f"artifact format version {fmt}, this runtime reads version {FORMAT_VERSION}: compile the model again")
    if file_size != size:
        raise bad(f"truncated or extended: the artifact says {file_size} bytes, the file has {size}")
    if verify and hashlib.sha256(memoryview(data)[PREFIX:]).digest() != checksum:
        raise bad("corrupted: the checksum does not match the contents")
    if abi != RAL_ABI_VERSION:
        raise bad(f"linked against RAL ABI version {abi}, this runtime has version {RAL_ABI_VERSION}: compile the model again")
    try:
        header = json.loads(bytes(data[PREFIX:PREFIX + header_size]))
    except ValueError as e:
        raise bad(f"unreadable header: {e}") from None
    _check_target(header.get("target", {}), bad)
    if pending is None:
        return Artifact(path, header, data)
    if _wrong_size(pending):
        raise bad(_wrong_size(pending))
    return Artifact(path, header, data, {at: a for a, at, _ in pending})


def _check_target(target: dict, bad: Any) -> None:
    if target.get("name", "").partition(":")[0] not in ("x86", "cuda", "rocm"):
        raise bad(f"compiled for target '{target.get('name')}', this runtime runs x86 code and CUDA or ROCm kernels")
    if platform.machine() not in ("x86_64", "AMD64"):
        raise bad(f"compiled for {target.get('triple')}, this machine is {platform.machine()}")
    missing = sorted(set(target.get("cpu_flags", ())) - host_cpu_flags())
    if missing:
        raise bad(f"compiled for a {target.get('cpu')} processor with {', '.join(missing)}, which this processor lacks")
