"""Serving artifacts on Ray Serve (`pip install disc_stablehlo[serve]`).

    from ray import serve
    from disc_stablehlo.serving import deployment

    app = deployment("model.disc", num_replicas=4, max_batch_size=32).bind()
    handle = serve.run(app)
    y = handle.remote(x).result()          # numpy in, numpy out (a tuple for several results)
    # or over HTTP: POST an .npz (arrays in argument order) or JSON {"inputs": [...]} to the route

Each replica loads the artifact once (the runtime only: no compiler, no framework) and serves
requests of any shape the signature admits. Dynamic batching: requests that arrive together and
agree on everything but the batch dim are concatenated along it, run as one call and split
again; requests of other shapes run as their own groups in the same round. Batching assumes the
model treats rows of the batch dim independently (no batch-wide statistics); it is enabled only
when every argument and result has the batch dim at axis 0 (else construction fails: serve
with max_batch_size=1)."""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from .errors import DiscError, ShapeError
from .runtime import CompiledFunction, load, read_npz, write_npz

Request = tuple[np.ndarray, ...]
Result = tuple[np.ndarray, ...]


def batch_dim_of(fn: CompiledFunction, batch_dim: str | None = None) -> str:
    """The dimension variable requests are batched along: `batch_dim`, or the first argument's
    axis-0 variable. Raises DiscError when some argument or result does not have it at axis 0."""
    args = fn.signature.args
    name = batch_dim if batch_dim is not None else (args[0].shape[0] if args and args[0].shape else None)
    if not isinstance(name, str):
        raise DiscError(f"cannot batch: the first argument ({args[0].describe() if args else 'none'}) has no dynamic axis 0; "
                        "serve with max_batch_size=1")
    for spec in args:
        if not spec.shape or spec.shape[0] != name:
            raise DiscError(f"cannot batch along '{name}': argument '{spec.name}' is {spec.describe()}; serve with max_batch_size=1")
    for i, dims in enumerate(fn.symbolic_result_shapes):
        if not dims or dims[0] != name:
            raise DiscError(f"cannot batch along '{name}': result {i} has dims ({', '.join(dims)}); serve with max_batch_size=1")
    return name


def _call(fn: CompiledFunction, args: Sequence[np.ndarray]) -> Result:
    out = fn(*args)
    return out if isinstance(out, tuple) else (out,)


def run_batched(fn: CompiledFunction, requests: Sequence[Request]) -> list[Result | Exception]:
    """Runs requests as few calls as their shapes allow: requests that agree on dtypes and on
    every dim but axis 0 are concatenated along axis 0, run once and split. A group whose merged
    call is rejected (e.g. it exceeds the batch dim's bound) runs request by request, so each gets
    exactly what its own call gives. Returns per request its results or its exception."""
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, req in enumerate(requests):
        groups[tuple((a.dtype.str, a.shape[1:]) if a.ndim else (a.dtype.str, None) for a in req)].append(i)
    out: list[Result | Exception] = [ShapeError("not run")] * len(requests)
    for members in groups.values():
        if len(members) > 1 and all(a.ndim for a in requests[members[0]]):
            sizes = [requests[i][0].shape[0] for i in members]
            merged = [np.concatenate([requests[i][k] for i in members]) for k in range(len(requests[members[0]]))]
            try:
                results = _call(fn, merged)
            except ShapeError:
                pass
            else:
                bounds = np.cumsum([0, *sizes])
                for j, i in enumerate(members):
                    out[i] = tuple(r[bounds[j]:bounds[j + 1]] for r in results)
                continue
        for i in members:
            try:
                out[i] = _call(fn, requests[i])
            except DiscError as e:
                out[i] = e
    return out


def decode_body(body: bytes, content_type: str, fn: CompiledFunction) -> Request:
    """An HTTP request body: an .npz (arrays in argument order, as `disc-stablehlo run` reads) or JSON
    {"inputs": [nested lists, one per argument]}, converted to the signature's dtypes."""
    if content_type.startswith("application/json"):
        inputs = json.loads(body)["inputs"]
        specs = fn.signature.args
        if len(inputs) != len(specs):
            raise ShapeError(f"expected {len(specs)} inputs ({', '.join(s.describe() for s in specs)}), got {len(inputs)}")
        return tuple(np.asarray(x, dtype=s.dtype) for x, s in zip(inputs, specs))
    return tuple(read_npz(io.BytesIO(body)))


def encode_results(results: Result, as_json: bool, fn: CompiledFunction) -> tuple[bytes, str]:
    """JSON {"outputs": [nested lists]}, or an .npz with the results named as in the signature."""
    if as_json:
        return json.dumps({"outputs": [r.tolist() for r in results]}).encode(), "application/json"
    buf = io.BytesIO()
    write_npz(buf, fn, results)
    return buf.getvalue(), "application/octet-stream"


def deployment(artifact_path: str | os.PathLike, *, max_batch_size: int = 16, batch_wait_timeout_s: float = 0.005,
               batch_dim: str | None = None, **options: Any):
    """A Ray Serve deployment serving the artifact at `artifact_path` (a path every replica's node
    can read: shared storage, or the same file on each node). `max_batch_size` counts rows of the
    batch dim per merged call (1: no batching); `options` go to `serve.deployment` (num_replicas,
    ray_actor_options, autoscaling_config, ...). Each replica runs the RAL with as many threads as
    the CPUs Ray gives it (DISC_NUM_THREADS overrides)."""
    from ray import serve
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import Response

    path = os.fspath(artifact_path)

    def rows(batch: list[Request]) -> int:
        # a request larger than max_batch_size counts as a full batch: it runs alone, not rejected
        return sum(min(req[0].shape[0] if req and req[0].ndim else 1, max_batch_size) for req in batch)

    class DiscModel:
        def __init__(self) -> None:
            import ray

            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
            os.environ.setdefault("DISC_NUM_THREADS", str(max(1, int(cpus))))
            self.fn = load(path)
            if max_batch_size > 1:
                batch_dim_of(self.fn, batch_dim)

        async def __call__(self, *args: Any) -> Any:
            if len(args) == 1 and isinstance(args[0], HTTPRequest):
                request = args[0]
                as_json = request.headers.get("content-type", "").startswith("application/json")
                try:
                    results = await self.run(decode_body(await request.body(), request.headers.get("content-type", ""), self.fn))
                except (DiscError, ValueError, KeyError) as e:
                    return Response(f"{type(e).__name__}: {e}\n", status_code=400, media_type="text/plain")
                body, media_type = encode_results(results, as_json, self.fn)
                return Response(body, media_type=media_type)
            results = await self.run(tuple(np.asarray(a) for a in args))
            return results[0] if len(results) == 1 else results

        async def run(self, request: Request) -> Result:
            out = await self.infer(request)
            if isinstance(out, Exception):
                raise out
            return out

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s, batch_size_fn=rows)
        async def infer(self, batch: list[Request]) -> list[Result | Exception]:
            # off the event loop: the replica keeps collecting the next batch meanwhile
            return await asyncio.to_thread(run_batched, self.fn, batch)

    return serve.deployment(DiscModel, **options)
