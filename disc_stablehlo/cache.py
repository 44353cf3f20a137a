"""The persistent compile cache (`DISC_CACHE_DIR`), without MLIR.

An artifact is stored under the key the compiler worker computes from the imported module
(locations left out, so the same program exported from another call site finds it; `build.cache_key`).
Computing that key takes the worker: MLIR's start and the import. So the caller also records,
beside each artifact, the key of what it sent the worker (the frontend's exported bytes, with
their locations, and every option): a later process that exports the same bytes (the same code,
a restarted service) loads the artifact without the worker (the one `compile` started while the
frontend exported, so that a miss need not wait for it, is ended: `worker.release`)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import zipfile
from typing import Any, Sequence

from . import artifact
from .runtime import RAL_LIBRARY, ral_library_dir


@functools.cache
def build_digest() -> bytes:
    """The package version, the compiler's own sources and the RAL build (read once per
    process): a changed pass never reuses objects an older build compiled, version number or not."""
    root = os.path.dirname(os.path.abspath(__file__))
    sources = sorted(os.path.join(folder, f) for folder, _, files in os.walk(root) for f in files if f.endswith(".py"))
    h = hashlib.sha256(artifact.package_version().encode())
    for path in sources + [os.path.join(ral_library_dir(), RAL_LIBRARY)]:
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    return h.digest()


def source_key(source: Any, binding: dict, constraints: Sequence[str], target: str, buffer_reuse: bool) -> str:
    """The key of a compilation request as the caller sends it (`Source`, options)."""
    h = hashlib.sha256(build_digest())
    fields = {name: value for name, value in vars(source).items() if name not in ("payload", "weights")}
    h.update(repr(sorted(fields.items())).encode() + b"\0")
    h.update(json.dumps([binding, list(constraints), target, buffer_reuse], sort_keys=True).encode() + b"\0")
    if source.kind == "torch":  # the saved program's path: its archive's members
        _hash_program(h, source.payload)
    else:
        h.update(source.payload if isinstance(source.payload, bytes) else source.payload.encode())
    return h.hexdigest()[:32]


def _hash_program(h: Any, path: str) -> None:
    """A saved torch.export program's members by their names inside its folder, which torch names
    after the file (a temporary one), less the id torch draws at random for each save."""
    with zipfile.ZipFile(path) as archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename.partition("/")[2]):
            name = info.filename.partition("/")[2]
            if name != ".data/serialization_id":
                h.update(name.encode() + b"\0" + archive.read(info) + b"\0")


def _index(cache: str, key: str) -> str:
    return os.path.join(cache, f"{key}.source")


def lookup(cache: str, key: str) -> str | None:
    """The artifact recorded for the request key `key`, when it is still there."""
    try:
        with open(_index(cache, key)) as f:
            name = f.read().strip()
    except OSError:
        return None
    path = os.path.join(cache, name)
    return path if os.path.basename(name) == name and os.path.exists(path) else None


def record(cache: str, key: str, path: str) -> None:
    """Records that the request key `key` compiled to the artifact `path` (in `cache`)."""
    index = _index(cache, key)
    partial = f"{index}.{os.getpid()}.{threading.get_ident()}.partial"  # per process and thread: renamed into place
    with open(partial, "w") as f:
        f.write(os.path.basename(path))
    os.replace(partial, index)
