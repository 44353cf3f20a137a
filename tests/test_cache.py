"""The persistent compile cache (DISC_CACHE_DIR): a second process loads instead of compiling."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import numpy as np
import disc_stablehlo as disc
f = disc.compile('''func.func @main(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
  %0 = stablehlo.tanh %x : tensor<?x8xf32>
  return %0 : tensor<?x8xf32> }''', constraints=CONSTRAINTS)
x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
assert np.allclose(f(x), np.tanh(x), atol=1e-6)
from disc_stablehlo import worker
print(worker._worker is not None, f.compile_count)
"""


def _run(cache: str, constraints: list[str]) -> tuple[bool, int]:
    """(whether the process started a compiler worker, the function's compile_count)."""
    env = dict(os.environ, DISC_CACHE_DIR=cache)
    proc = subprocess.run([sys.executable, "-c", SCRIPT.replace("CONSTRAINTS", repr(constraints))],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    started, count = proc.stdout.strip().splitlines()[-1].split()
    return started == "True", int(count)


def _entries(cache) -> list[str]:
    return sorted(e.rsplit(".", 1)[1] for e in os.listdir(cache))


def test_second_process_loads_from_the_cache_without_a_worker(tmp_path):
    """A later process that sends the same request finds the artifact by the request's key
    (the `.source` entry beside it) and starts no compiler worker."""
    assert _run(str(tmp_path), []) == (True, 1)
    assert _run(str(tmp_path), []) == (False, 0)
    assert _run(str(tmp_path), ["arg0.0 >= 2"]) == (True, 1)  # other constraints: another entry
    assert _entries(tmp_path) == ["disc", "disc", "source", "source"]


def test_a_request_whose_artifact_is_gone_compiles_again(tmp_path):
    assert _run(str(tmp_path), []) == (True, 1)
    for e in os.listdir(tmp_path):
        if e.endswith(".disc"):
            os.unlink(tmp_path / e)
    assert _run(str(tmp_path), []) == (True, 1)
    assert _run(str(tmp_path), []) == (False, 0)


def test_cache_folder_is_created(tmp_path):
    cache = tmp_path / "not" / "there" / "yet"
    assert _run(str(cache), []) == (True, 1)
    assert _run(str(cache), []) == (False, 0)


def test_modules_that_differ_only_in_locations_share_an_entry(tmp_path, monkeypatch):
    """JAX records the caller's stack in the module's locations (the same model exported from a
    service's warm-up and from its request path differs only there); the cache key leaves
    locations out, so the second finds the first's entry."""
    import numpy as np

    import disc_stablehlo as disc

    text = """func.func @main(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
      %0 = stablehlo.tanh %x : tensor<?x8xf32> loc(LOC)
      return %0 : tensor<?x8xf32>
    }"""
    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path))
    first = disc.compile(text.replace("LOC", '"service.py":12:4'))
    second = disc.compile(text.replace("LOC", '"service.py":30:8'))
    assert (first.compile_count, second.compile_count) == (1, 0)
    x = np.linspace(-1, 1, 40, dtype=np.float32).reshape(5, 8)
    np.testing.assert_allclose(second(x), np.tanh(x), rtol=1e-6)


def test_threads_compiling_one_request_at_once_leave_one_entry(tmp_path, monkeypatch):
    import threading

    import disc_stablehlo as disc

    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path))
    text = """func.func @main(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
      %0 = stablehlo.exponential %x : tensor<?x8xf32>
      return %0 : tensor<?x8xf32> }"""
    errors: list[BaseException] = []

    def compile_once():
        try:
            disc.compile(text)
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)
    threads = [threading.Thread(target=compile_once) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and _entries(tmp_path) == ["disc", "source"]
