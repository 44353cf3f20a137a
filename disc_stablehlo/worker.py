"""The compiler worker: MLIR and LLVM run in a process of their own, never in the caller's.

The caller's frontends export a `Source` (StableHLO, a saved torch.export program, TF's exporter
output); the worker imports it, compiles it and writes an artifact, which the caller loads with
the run-time side only. So the package adds no LLVM to the caller's process (TensorFlow, triton
and jax each carry one), and a fatal error inside MLIR or LLVM (an abort, a segfault) ends the
worker, not the caller: it becomes a CompileError naming the stage, with a reproducer.

One worker per caller process, started on the first compilation (in the background, while the
frontend exports) and kept for the next ones; it exits when its parent does (end of its input).
Requests and replies are length-prefixed pickles on its stdin/stdout; the worker reports each
stage before running it, so the caller knows where a crash happened. `DISC_COMPILE_WORKER=0`
compiles in the calling process (debugging)."""

from __future__ import annotations

import atexit
import dataclasses
import faulthandler
import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from importlib import import_module
from typing import Any, BinaryIO, Callable

from . import artifact
from .errors import CompileError, DiscError

# environment variables a compilation reads: sent with each request (the caller's may change)
_ENV_PREFIX = "DISC_"


def _send(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def _error_classes() -> dict[str, type[DiscError]]:
    from . import errors

    return {name: cls for name, cls in vars(errors).items() if isinstance(cls, type) and issubclass(cls, DiscError)}


class Worker:
    """The caller's handle on its worker process (one compilation at a time)."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked child starts its own
        self.lock = threading.Lock()
        self.log = tempfile.TemporaryFile()  # the worker's stderr: forwarded after each request, quoted on a crash
        self.log_read = 0
        self.crashed = False  # its output is then quoted in the error instead of forwarded
        self.used = False  # it has taken a compilation
        self.retired = False  # ended unused (`release`): a compilation that finds it so takes a new worker
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", "from disc_stablehlo.worker import serve; serve()"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})

    def prepare(self, modules: tuple[str, ...]) -> None:
        """Has the worker load `modules` now (no reply: a failure shows in the compilation that needs them)."""
        if not modules:
            return
        with self.lock:
            try:
                _send(self.proc.stdin, {"prepare": modules})
            except OSError:
                pass  # a worker that died: the compilation reports it

    def close(self) -> None:
        """Ends the worker (registered for the caller's exit): its input closes and it returns."""
        if self.pid != os.getpid():
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.log.close()

    def alive(self) -> bool:
        return self.pid == os.getpid() and self.proc.poll() is None

    def compile(self, request: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
        with self.lock:
            if self.retired:
                raise _Retired
            self.used = True
            stage = "starting the compiler worker"
            try:
                _send(self.proc.stdin, request)
                while True:
                    kind, value = _receive(self.proc.stdout)
                    if kind != "stage":
                        break
                    stage = value
                    progress(stage)
            except (OSError, EOFError, pickle.UnpicklingError):
                raise self._crashed(stage, request) from None
            finally:
                self._forward_log()
        if kind == "error":
            name, message = value
            raise _error_classes().get(name, CompileError)(message)
        return value

    def _forward_log(self) -> None:
        """What the worker printed (DISC_LOG reports, warnings) goes to the caller's stderr."""
        self.log.seek(self.log_read)
        text = self.log.read()
        self.log_read += len(text)
        if text and not self.crashed:
            sys.stderr.write(text.decode(errors="replace"))

    def _crashed(self, stage: str, request: dict[str, Any]) -> CompileError:
        self.crashed = True
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        self.log.seek(0)
        lines = self.log.read().decode(errors="replace").strip().splitlines()
        fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
        # what it printed last, and the stack faulthandler printed (its innermost calls first)
        tail = lines[max(0, fatal[-1] - 6):fatal[-1] + 16] if fatal else lines[-12:]
        where = _reproducer(request["source"])
        return CompileError(f"the compiler crashed ({how}) during {stage}; this process is unaffected.\n"
                            + ("".join(f"  | {line}\n" for line in tail) if tail else "")
                            + f"reproducer: {where}\nreplay: disc-stablehlo compile {where}")


class _Retired(Exception):
    """The worker was ended unused before this compilation could take it (`release`)."""


def _reproducer(source: Any) -> str:
    """The source written to a file the CLI compiles again."""
    if source.kind == "torch":
        return source.payload  # the saved program
    folder = tempfile.mkdtemp(prefix="disc-crash-")
    path = os.path.join(folder, "module.mlir" if isinstance(source.payload, str) else "module.mlirbc")
    with open(path, "w" if isinstance(source.payload, str) else "wb") as f:
        f.write(source.payload)
    return path


_worker: Worker | None = None
_worker_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("DISC_COMPILE_WORKER", "1") != "0"


def worker() -> Worker:
    """The running worker, started if there is none (returns at once: it loads MLIR and LLVM
    while the caller's frontend exports)."""
    return _running()[0]


def _running() -> tuple[Worker, bool]:
    """The running worker, and whether this call started it."""
    global _worker
    with _worker_lock:
        if _worker is None or not _worker.alive():
            _worker = Worker()
            atexit.register(_worker.close)
            return _worker, True
        return _worker, False


def prepare(modules: tuple[str, ...]) -> Worker | None:
    """Starts the worker if there is none (it loads MLIR and LLVM in the background) and has it load
    `modules`, the importer's, while the caller's frontend exports; nothing without a worker.
    Returns the worker when this call started it (see `release`)."""
    if not enabled():
        return None
    w, started = _running()
    w.prepare(modules)
    return w if started else None


def release(w: Worker) -> None:
    """Ends `w`, started by `prepare` for a compilation the cache then answered, unless it is no
    longer this process's worker or has taken a compilation: a process whose compilations all hit
    the cache keeps no worker. It is killed (it has only loaded modules; closing its input would
    wait for the imports in flight)."""
    global _worker
    with _worker_lock:
        if _worker is not w or not w.lock.acquire(blocking=False):
            return
        try:
            if w.used:
                return
            w.retired = True
            _worker = None
        finally:
            w.lock.release()
    if w.alive():
        w.proc.kill()
    w.close()


def compile(source: Any, binding: dict, constraints: tuple[str, ...], target: str, buffer_reuse: bool, out_path: str,
            progress: Callable[[str], None] | None = None) -> Compiled:
    """Compiles `source` into an artifact (at `out_path`, or in DISC_CACHE_DIR when that is set);
    the worker writes the file but for the weights the source held back, which the caller writes
    (`Compiled.complete`) or keeps in memory (`artifact.read(pending=)`). `progress` is told each
    stage as it starts."""
    request = {"source": source, "binding": binding, "constraints": tuple(constraints), "target": target,
               "buffer_reuse": buffer_reuse, "out_path": out_path,
               "env": {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIX)}}
    w = worker() if enabled() else None
    sent, picked_up = time.perf_counter(), []

    def report(stage: str) -> None:
        if not picked_up:  # the worker's first stage: it has started (a new worker loads MLIR and LLVM first)
            picked_up.append(time.perf_counter())
        (progress or _no_progress)(stage)
    try:
        while True:
            try:
                reply = w.compile(request, report) if w else handle(request, report)
                break
            except _Retired:  # another thread's cache hit ended it just before
                w = worker()
    finally:
        if source.kind == "torch" and not (w and w.crashed):  # the exporter's saved program (after a crash: the reproducer)
            os.unlink(source.payload)
    if "partial" not in reply:
        return Compiled(reply["path"], None, [], {})
    return Compiled(reply["path"], reply["partial"], [(source.weights[i], at, nbytes) for i, at, nbytes in reply["fills"]],
                    {"waiting for the compiler worker": picked_up[0] - sent, **reply["seconds"]})


@dataclasses.dataclass
class Compiled:
    """What `compile` returns: the artifact's path; unless it was found in the cache (compiled
    before), the file the worker wrote (`partial`), the caller's weights it left room for
    ((array, offset, bytes)) and the seconds each stage took."""
    path: str
    partial: str | None
    fills: list[tuple[Any, int, int]]
    seconds: dict[str, float]

    def complete(self) -> None:
        """Writes the weights and the checksum: the artifact at `path` is whole."""
        start = time.perf_counter()
        artifact.complete(self.partial, self.path, self.fills)
        self.seconds["writing the weights"] = time.perf_counter() - start


def _no_progress(stage: str) -> None:
    pass


def handle(request: dict[str, Any], report: Callable[[str], None]) -> dict:
    """Runs one compilation (in the worker, or here when the worker is disabled): returns the
    artifact's path, and unless it was found in the cache, the partial file written for it and
    where the caller's weights go (`artifact.write`)."""
    from . import mlir_support
    from .build import build_artifact, cache_key
    from .targets import get_target

    frontends = import_module(f"{__package__}.import")
    mlir_support.stage_listener = report
    mlir_support.stage_seconds.clear()
    try:
        report("importing the module")
        start = time.perf_counter()
        imported = frontends.import_source(request["source"])
        mlir_support.add_seconds("importing the module", start)
        tgt = get_target(request["target"])
        cache = request["env"].get("DISC_CACHE_DIR")
        path = request["out_path"]
        if cache:
            os.makedirs(cache, exist_ok=True)
            key = cache_key(imported, request["constraints"], tgt, request["buffer_reuse"], request["source"].weights_digest)
            path = os.path.join(cache, key + ".disc")
            if os.path.exists(path):
                return {"path": path}
        partial = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"  # beside it: renamed into place once complete
        try:
            fills = build_artifact(imported, request["constraints"], tgt, request["buffer_reuse"], partial, request["binding"])
        except BaseException:
            if os.path.exists(partial):
                os.unlink(partial)
            raise
        return {"path": path, "partial": partial, "fills": fills, "seconds": dict(mlir_support.stage_seconds)}
    finally:
        mlir_support.stage_listener = mlir_support.ignore_stage


def serve() -> None:
    """The worker's loop: one request at a time until its input ends."""
    from . import mlir_support  # noqa: F401  (loads MLIR and LLVM now, before the first request)
    from . import build  # noqa: F401

    faulthandler.enable()  # a crash prints the Python stack to stderr, which the caller's error quotes

    # the replies get a descriptor of their own: whatever the compiler prints (Python, or MLIR and
    # LLVM writing to descriptor 1) goes to stderr and cannot corrupt them
    stdin, stdout = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    while True:
        try:
            request = _receive(stdin)
        except EOFError:
            return
        if "prepare" in request:
            for name in request["prepare"]:
                try:
                    import_module(name)
                except Exception:
                    pass  # the compilation that needs it reports the error
            continue
        os.environ.update(request["env"])
        for k in [k for k in os.environ if k.startswith(_ENV_PREFIX) and k not in request["env"]]:
            del os.environ[k]
        fault = request["env"].get("DISC_FAULT_STAGE")  # fault injection (tests): abort at that stage, as an LLVM error does

        def report(stage: str, fault: str | None = fault) -> None:
            _send(stdout, ("stage", stage))
            if stage == fault:
                print(f"DISC_FAULT_STAGE: aborting at {stage}", file=sys.stderr, flush=True)
                os.abort()

        try:
            reply = ("ok", handle(request, report))
        except DiscError as e:
            reply = ("error", (type(e).__name__, str(e)))
        except Exception as e:  # a bug of ours: reported, and the worker goes on
            import traceback

            reply = ("error", ("CompileError", f"internal compiler error: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
        _send(stdout, reply)
