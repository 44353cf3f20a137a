"""One-file artifacts: save and load round trips, a run-time side without the compiler, and
files that are not loadable artifacts."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import disc_stablehlo as disc
from disc_stablehlo import artifact

W = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)


def _model(x, y):
    return jax.nn.softmax(jnp.tanh(x @ W) * 2.0, axis=-1) + y.sum(axis=0)


def _compiled():
    b, s = export.symbolic_shape("b, s", constraints=["s >= 2"])
    return disc.compile(_model, jax.ShapeDtypeStruct((b, 64), jnp.float32), jax.ShapeDtypeStruct((s, 32), jnp.float32))


def _inputs(b: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(b * 100 + s)
    return rng.standard_normal((b, 64)).astype(np.float32), rng.standard_normal((s, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    f = _compiled()
    path = tmp_path_factory.mktemp("artifact") / "model.disc"
    f.save(path)
    return f, path


def test_a_loaded_artifact_behaves_as_the_compiled_function(saved):
    f, path = saved
    g = disc.load(path)
    assert g.compile_count == 0 and f.compile_count == 1
    for b, s in [(1, 2), (5, 3), (17, 9)]:
        x, y = _inputs(b, s)
        np.testing.assert_allclose(g(x, y), np.asarray(jax.jit(_model)(x, y)), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(g(x, y), f(x, y))
    assert [str(k) for k in g.kernels] == [str(k) for k in f.kernels]
    assert g.shape_report() == f.shape_report() and g.llvm_ir == f.llvm_ir
    assert g.signature == f.signature and g.symbolic_result_shapes == f.symbolic_result_shapes
    with pytest.raises(disc.ShapeError, match="s"):
        g(*_inputs(3, 1))


def test_a_loaded_artifact_takes_and_gives_the_functions_structures(tmp_path):
    """A loaded artifact takes the arguments as the function did (pytrees; or their flat leaves)
    and gives the results back in the function's structure: JAX's dicts, tuples, lists and
    Nones, and a PyTorch model's outputs (a dict here, transformers' ModelOutput too)."""
    b = export.symbolic_shape("b")[0]

    def fn(x, p):
        return {"y": x @ p["w"] + p["b"], "aux": (x.sum(), None, [x * 2])}

    specs = (jax.ShapeDtypeStruct((b, 3), jnp.float32), {"w": jax.ShapeDtypeStruct((3, 2), jnp.float32), "b": jax.ShapeDtypeStruct((2,), jnp.float32)})
    disc.compile(fn, *specs).save(tmp_path / "jax.disc")
    g = disc.load(tmp_path / "jax.disc")
    x, p = np.ones((4, 3), np.float32), {"w": np.full((3, 2), 0.5, np.float32), "b": np.arange(2, dtype=np.float32)}
    want = jax.jit(fn)(x, p)
    for got in (g(x, p), g(x, p["b"], p["w"])):  # the leaves: the dict's in sorted order
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for a, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, w, rtol=1e-6)
    torch = pytest.importorskip("torch")

    class Model(torch.nn.Module):
        def forward(self, x, extra):
            return {"double": x * 2, "parts": (x + extra["a"], x - 1)}

    t, extra = torch.randn(3, 4), {"a": torch.randn(3, 4)}
    n = torch.export.Dim("n")
    disc.compile(Model(), (t, extra), dynamic_shapes=({0: n}, {"a": {0: n}})).save(tmp_path / "torch.disc")
    out = disc.load(tmp_path / "torch.disc")(t, extra)
    assert list(out) == ["double", "parts"] and isinstance(out["parts"], tuple)
    torch.testing.assert_close(out["parts"][0], t + extra["a"])


def test_the_weights_are_stored_once_in_the_parameter_section(saved):
    _, path = saved
    art = artifact.read(str(path))
    [param] = art.params()
    np.testing.assert_array_equal(param, W)
    assert art.header["params"][0]["offset"] % 64 == 0 and not param.flags.writeable
    assert open(path, "rb").read().count(W.tobytes()) == 1


BLOCKER = """
import sys
BLOCKED = {"torch_mlir", "llvmlite", "jax", "jaxlib", "torch", "tensorflow"}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"the run-time side imported {name}")
sys.meta_path.insert(0, Blocker())
import numpy as np
import disc_stablehlo as disc
f = disc.load(sys.argv[1])
data = np.load(sys.argv[2])
out = f(data["x"], data["y"])
np.testing.assert_allclose(out, data["expected"], rtol=1e-5, atol=1e-6)
assert not BLOCKED & {m.split(".")[0] for m in sys.modules}
print("ok")
"""


def test_loading_and_calling_import_no_compiler_and_no_framework(saved, tmp_path):
    f, path = saved
    x, y = _inputs(4, 6)
    np.savez(tmp_path / "data.npz", x=x, y=y, expected=f(x, y))
    proc = subprocess.run([sys.executable, "-c", BLOCKER, str(path), str(tmp_path / "data.npz")], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def _rewrite_header(data: bytes, edit) -> bytes:
    """The file with its header edited (same length) and the checksum recomputed."""
    import hashlib

    size = struct.unpack_from("<Q", data, 16)[0]
    text = edit(data[64:64 + size].decode()).encode()
    assert len(text) == size
    body = text + data[64 + size:]
    return data[:32] + hashlib.sha256(body).digest() + body


def _unknown_cpu_flag(header: str) -> str:
    flag = json.loads(header)["target"]["cpu_flags"][0]
    return header.replace(f'"{flag}"', '"' + "z" * len(flag) + '"', 1)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:len(d) // 2], "truncated"),
    (lambda d: d + b"\0" * 64, "truncated or extended"),
    (lambda d: d[:len(d) - 100] + bytes([d[-100] ^ 1]) + d[len(d) - 99:], "corrupted"),
    (lambda d: b"NOTADISC" + d[8:], "not a disc_stablehlo artifact"),
    (lambda d: d[:8] + struct.pack("<I", 99) + d[12:], "format version 99"),
    (lambda d: d[:12] + struct.pack("<I", artifact.RAL_ABI_VERSION + 1) + d[16:], f"RAL ABI version {artifact.RAL_ABI_VERSION + 1}"),
    (lambda d: b"", "truncated"),
    (lambda d: _rewrite_header(d, lambda h: h.replace('"name":"x86"', '"name":"gpu"')), "target 'gpu'"),
    (lambda d: _rewrite_header(d, _unknown_cpu_flag), "which this processor lacks"),
])
def test_damaged_files_are_rejected_and_never_loaded(saved, tmp_path, damage, message):
    _, path = saved
    bad = tmp_path / "bad.disc"
    bad.write_bytes(damage(path.read_bytes()))
    with pytest.raises(disc.ArtifactError, match=message):
        disc.load(bad)


def test_a_missing_file_is_an_artifact_error(tmp_path):
    with pytest.raises(disc.ArtifactError, match="cannot read"):
        disc.load(tmp_path / "nothing.disc")


def test_the_cache_keeps_artifacts_not_pickles(tmp_path, monkeypatch):
    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path))
    first, second = _compiled(), _compiled()
    assert (first.compile_count, second.compile_count) == (1, 0)
    entries = [e for e in os.listdir(tmp_path) if e.endswith(".disc")]
    assert len(entries) == 1, os.listdir(tmp_path)
    # each request (two call sites: two exports with different locations) names the one artifact
    assert {(tmp_path / e).read_text() for e in os.listdir(tmp_path) if e.endswith(".source")} == set(entries)
    x, y = _inputs(3, 4)
    np.testing.assert_array_equal(disc.load(tmp_path / entries[0])(x, y), first(x, y))


def _with_deferred(tmp_path, shape=(256,)):
    """An artifact written with one parameter left for the caller (`Deferred`), as the compiler
    worker writes a PyTorch model's."""
    from disc_stablehlo.bounded_dynamism.signature import Signature

    contents = artifact.Contents(Signature((), ()), [], {"name": "x86", "triple": "x86_64-unknown-linux-gnu", "cpu_flags": []},
                                 b"\x7fELF", "", [np.ones(300, np.float32), artifact.Deferred(0, np.dtype(np.float32), shape)], {})
    partial = str(tmp_path / "a.disc.partial")
    return partial, artifact.write(partial, contents)


def test_the_caller_completes_a_deferred_parameter(tmp_path):
    partial, fills = _with_deferred(tmp_path)
    weights = np.arange(256, dtype=np.float32)
    artifact.complete(partial, str(tmp_path / "a.disc"), [(weights, at, nbytes) for _, at, nbytes in fills])
    art = artifact.read(str(tmp_path / "a.disc"))  # the checksum covers the weights written by the caller
    np.testing.assert_array_equal(art.params()[1], weights)
    assert not os.path.exists(partial)


def test_weights_of_another_size_than_their_room_are_refused(tmp_path):
    partial, fills = _with_deferred(tmp_path)
    with pytest.raises(disc.ArtifactError, match="1200 bytes for the 1024 bytes"):
        artifact.complete(partial, str(tmp_path / "a.disc"), [(np.zeros(300, np.float32), at, nbytes) for _, at, nbytes in fills])
    assert not os.path.exists(partial) and not os.path.exists(tmp_path / "a.disc")
