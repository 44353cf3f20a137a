"""Serving artifacts: dynamic batching of requests of varying shapes, and a Ray Serve deployment
with two replicas on a local Ray instance, called through handles and over HTTP."""

from __future__ import annotations

import io
import json
import socket
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import disc_stablehlo as disc
from disc_stablehlo.errors import DiscError, ShapeError
from disc_stablehlo.serving import batch_dim_of, run_batched


def _model(x, m):
    """Rows along the batch dim are independent: per row, a masked mean and a gated projection."""
    h = jnp.tanh(x * 1.5 + 0.25) * m[..., None]
    return h, h.sum(axis=1) / jnp.maximum(m.sum(axis=1, keepdims=True), 1.0)


def _reference(x, m):
    return tuple(np.asarray(r) for r in jax.jit(_model)(x, m))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    b, s = export.symbolic_shape("b, s", constraints=["b <= 6"])
    f = disc.compile(_model, jax.ShapeDtypeStruct((b, s, 8), jnp.float32), jax.ShapeDtypeStruct((b, s), jnp.float32))
    path = tmp_path_factory.mktemp("serve") / "model.disc"
    f.save(path)
    return path


def _request(rows, seq, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, seq, 8)).astype(np.float32), (rng.random((rows, seq)) < 0.7).astype(np.float32)


def _kernel_calls(fn):
    return max(st["calls"] for name, st in fn.stats().items() if not name.startswith("disc_ral_"))


def test_requests_of_one_shape_run_as_one_call_and_others_apart(artifact):
    fn = disc.load(artifact)
    assert batch_dim_of(fn) == "b"
    requests = [_request(1, 5, 0), _request(2, 5, 1), _request(1, 3, 2), _request(1, 5, 3), _request(2, 3, 4)]
    before = _kernel_calls(fn)
    results = run_batched(fn, requests)
    assert _kernel_calls(fn) - before == 2  # two groups: seq 5 (4 rows) and seq 3 (3 rows)
    for req, got in zip(requests, results):
        for g, w in zip(got, _reference(*req)):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_merged_batch_beyond_the_bound_runs_request_by_request(artifact):
    fn = disc.load(artifact)
    requests = [_request(4, 2, 0), _request(4, 2, 1), _request(1, 2, 2).__class__((np.zeros((1, 2, 8), np.float64), np.zeros((1, 2))))]
    results = run_batched(fn, requests)  # 4 + 4 rows break b <= 6: each runs alone; the float64 one fails alone
    for req, got in zip(requests[:2], results[:2]):
        np.testing.assert_allclose(got[0], _reference(*req)[0], rtol=1e-5, atol=1e-6)
    assert isinstance(results[2], ShapeError) and "float64" in str(results[2])


def test_batching_needs_the_batch_dim_on_every_argument_and_result():
    b = export.symbolic_shape("b")[0]
    f = disc.compile(lambda x, w: x @ w, jax.ShapeDtypeStruct((b, 4), jnp.float32), jax.ShapeDtypeStruct((4, 4), jnp.float32))
    with pytest.raises(DiscError, match="argument 'args\\[1\\]' is float32\\[4, 4\\]; serve with max_batch_size=1"):
        batch_dim_of(f)
    g = disc.compile(lambda x: x.sum(axis=0), jax.ShapeDtypeStruct((b, 4), jnp.float32))
    with pytest.raises(DiscError, match="result 0 has dims \\(4\\)"):
        batch_dim_of(g)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body, content_type):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def test_ray_serve_two_replicas_serve_concurrent_requests_of_varying_shapes(artifact):
    ray = pytest.importorskip("ray", reason="the serve extra (ray[serve]) is not installed")
    from ray import serve

    from disc_stablehlo.serving import deployment

    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = deployment(artifact, num_replicas=2, max_batch_size=6, batch_wait_timeout_s=0.02,
                         ray_actor_options={"num_cpus": 0.5}).bind()
        handle = serve.run(app, name="disc", route_prefix="/model")
        status = serve.status().applications["disc"].deployments["DiscModel"]
        assert status.replica_states.get("RUNNING") == 2

        shapes = [(1 + i % 3, 2 + i % 4) for i in range(24)]
        requests = [_request(r, s, i) for i, (r, s) in enumerate(shapes)]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda req: handle.remote(*req).result(timeout_s=120), requests))
        for req, got in zip(requests, results):
            for g, w in zip(got, _reference(*req)):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

        # a request of more rows than max_batch_size allows still runs (alone); one the guard rejects fails alone
        big = _request(6, 3, 99)
        np.testing.assert_allclose(handle.remote(*big).result(timeout_s=60)[1], _reference(*big)[1], rtol=1e-5, atol=1e-6)
        with pytest.raises(ShapeError, match="constraint b <= 6"):
            handle.remote(*_request(7, 3, 98)).result(timeout_s=60)

        url = f"http://127.0.0.1:{port}/model"
        x, m = _request(2, 4, 7)
        out = json.loads(_post(url, json.dumps({"inputs": [x.tolist(), m.tolist()]}).encode(), "application/json"))
        np.testing.assert_allclose(np.asarray(out["outputs"][1]), _reference(x, m)[1], rtol=1e-5, atol=1e-6)
        buf = io.BytesIO()
        np.savez(buf, x, m)
        with np.load(io.BytesIO(_post(url, buf.getvalue(), "application/octet-stream"))) as z:
            np.testing.assert_allclose(z[z.files[0]], _reference(x, m)[0], rtol=1e-5, atol=1e-6)
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(url, json.dumps({"inputs": [x.tolist()]}).encode(), "application/json")
        assert err.value.code == 400 and "expected 2 inputs" in err.value.read().decode()
    finally:
        serve.shutdown()
        ray.shutdown()
