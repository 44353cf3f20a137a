"""PyTorch programs whose sizes the data decides (boolean masks, `nonzero`, `masked_select`,
`repeat_interleave` by a tensor, `unique`, `bincount`, a length read by `.item()`): compiled once, each such size computed at run time by the
generated code, checked against eager PyTorch at several shapes and masks (none selected, all
selected); torch.export's assumptions about those sizes are checked where they are computed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch (pip install disc_stablehlo[torch])")
import disc_stablehlo as disc  # noqa: E402

Dim = torch.export.Dim


class KeepConfident(torch.nn.Module):
    """A detector's filtering: the boxes whose score passes a threshold, their scores renormalised."""

    def forward(self, boxes, scores):
        keep = scores > 0.5
        kept = boxes[keep]
        return kept * torch.tensor([2.0, 2.0, 3.0, 3.0]), scores[keep].softmax(0), keep.sum()


class Positions(torch.nn.Module):
    def forward(self, ids, x):
        rows, cols = torch.where(x > 0)
        return torch.nonzero(ids), rows * 100 + cols, torch.masked_select(x, ids[:, :1] > 0)


class MaskedWrites(torch.nn.Module):
    """`x[mask] = v`: one value for all, a value per selected element, and accumulated."""

    def forward(self, x, y):
        x = x.clone()
        x[x < -1] = 0.0
        x[y > 0] = y[y > 0] * 2
        return torch.index_put(x, (x > 1,), torch.tensor(0.5), accumulate=True)


class RaggedSum(torch.nn.Module):
    """A recommender's variable-length lists: values of every list in a row, pooled per list by
    lengths (the segment of each value: `repeat_interleave`)."""

    def forward(self, values, lengths):
        segment = torch.repeat_interleave(torch.arange(lengths.shape[0]), lengths)
        return torch.zeros(lengths.shape[0], values.shape[1]).index_add(0, segment, values)


class Distinct(torch.nn.Module):
    """Distinct ids with each id's place among them and their counts (sorted, and of runs as they
    come), and a weighted histogram of as many bins as the largest id needs."""

    def forward(self, ids, weights):
        distinct, place, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        runs, run_counts = torch.unique_consecutive(ids, return_counts=True)
        return distinct, place, counts, runs, run_counts, torch.bincount(ids, weights, minlength=3)


class TrimToLongest(torch.nn.Module):
    """A batch of padded sequences cut to its longest (a length `.item()` reads from the mask)."""

    def forward(self, ids, mask):
        return ids[:, :mask.sum(1).max().item()] * 2


def _distinct(n: int, rng) -> tuple:
    return rng.integers(0, 6, n), rng.random(n).astype(np.float32)


def _trim(n: int, rng) -> tuple:
    lengths = rng.integers(0, 8, n)
    return rng.integers(0, 100, (n, 7)), (np.arange(7)[None] < lengths[:, None]).astype(np.int64)


def _keep(n: int, rng) -> tuple:
    return rng.standard_normal((n, 4)).astype(np.float32), rng.random(n).astype(np.float32)


def _positions(n: int, rng) -> tuple:
    return rng.integers(0, 2, (n, 3)), rng.standard_normal((n, 5)).astype(np.float32)


def _writes(n: int, rng) -> tuple:
    return rng.standard_normal((n, 6)).astype(np.float32), rng.standard_normal((n, 6)).astype(np.float32)


def _ragged(n: int, rng) -> tuple:
    lengths = rng.integers(0, 4, n)
    return rng.standard_normal((int(lengths.sum()), 3)).astype(np.float32), lengths


CASES = [
    ("keep_confident", KeepConfident, _keep, ({0: "n"}, {0: "n"})),
    ("positions", Positions, _positions, ({0: "n"}, {0: "n"})),
    ("masked_writes", MaskedWrites, _writes, ({0: "n"}, {0: "n"})),
    ("ragged_sum", RaggedSum, _ragged, ({0: "total"}, {0: "n"})),
    ("distinct", Distinct, _distinct, ({0: "n"}, {0: "n"})),
    ("trim_to_longest", TrimToLongest, _trim, ({0: "n", 1: "s"}, {0: "n", 1: "s"})),
]


def _compile(model, example, spec):
    dims: dict = {}
    dynamic = tuple({axis: dims.setdefault(name, Dim(name)) for axis, name in s.items()} for s in spec)
    return disc.compile(model, tuple(torch.from_numpy(a) for a in example), dynamic_shapes=dynamic)


def _check(f, model, args) -> None:
    got = f(*args)
    want = model(*(torch.from_numpy(a) for a in args))
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert np.asarray(g).shape == tuple(w.shape)
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, make, inputs, spec", CASES, ids=[c[0] for c in CASES])
def test_sizes_the_data_decides_match_eager(name, make, inputs, spec):
    rng = np.random.default_rng(0)
    model = make().eval()
    f = _compile(model, inputs(8, rng), spec)
    for n in (1, 5, 13, 40):
        _check(f, model, inputs(n, rng))
    assert f.compile_count == 1


def test_masks_selecting_nothing_and_everything():
    model = KeepConfident().eval()
    f = _compile(model, _keep(8, np.random.default_rng(1)), ({0: "n"}, {0: "n"}))
    boxes = np.ones((6, 4), np.float32)
    for scores in (np.zeros(6, np.float32), np.ones(6, np.float32)):
        _check(f, model, (boxes, scores))
    kept, _, count = f(boxes, np.zeros(6, np.float32))
    assert kept.shape == (0, 4) and int(count) == 0
    trim = _compile(TrimToLongest().eval(), _trim(4, np.random.default_rng(1)), ({0: "n", 1: "s"}, {0: "n", 1: "s"}))
    assert trim(np.ones((3, 5), np.int64), np.zeros((3, 5), np.int64)).shape == (3, 0)  # torch-mlir's slice took an end of 0 for the whole dim


class PairsOfSelected(torch.nn.Module):
    def forward(self, x):
        return x[x > 0].reshape(-1, 2)


def test_an_assumption_about_a_size_from_the_data_is_checked_where_it_is_computed():
    """torch.export assumes the selected elements pair up (the reshape): an odd count is a
    ShapeError naming the user's line, and the function keeps working."""
    f = _compile(PairsOfSelected().eval(), (np.arange(-3, 5, dtype=np.float32),), ({0: "n"},))
    np.testing.assert_array_equal(f(np.array([1, -1, 2, 3, -4, 4], np.float32)), [[1, 2], [3, 4]])
    with pytest.raises(disc.ShapeError, match=r"Mod\(u\d+, 2\).*x\[x > 0\]"):
        f(np.array([1, -1, 2, 3, -4, -5], np.float32))
    np.testing.assert_array_equal(f(np.array([5, 6], np.float32)), [[5, 6]])


class EvenPrefix(torch.nn.Module):
    def forward(self, x, k):
        n = k.item()
        torch._check(n % 2 == 0)
        return x[:n] + 1


def test_a_check_on_a_value_read_from_the_data_holds_at_run_time():
    f = disc.compile(EvenPrefix().eval(), (torch.randn(6), torch.tensor(2)), dynamic_shapes=({0: Dim("n")}, None))
    np.testing.assert_array_equal(f(np.zeros(6, np.float32), np.array(4)), np.ones(4, np.float32))
    with pytest.raises(disc.ShapeError, match=r"value that aten._local_scalar_dense.* n = k.item\(\)"):
        f(np.zeros(6, np.float32), np.array(3))


def test_lists_whose_lengths_do_not_add_up_are_refused():
    f = _compile(RaggedSum().eval(), _ragged(8, np.random.default_rng(2)), ({0: "total"}, {0: "n"}))
    with pytest.raises(disc.ShapeError):
        f(np.ones((5, 3), np.float32), np.array([1, 2, 1]))
    with pytest.raises(disc.ShapeError, match="a count of repeats is negative"):  # (their sum matches: torch refuses it too)
        f(np.ones((2, 3), np.float32), np.array([2, -1, 1]))


def test_bincount_of_a_negative_value_is_refused():
    """torch.bincount raises for a negative value; the compiled function refuses it too (its
    scatter would skip the value and count the rest)."""
    f = _compile(Distinct().eval(), _distinct(8, np.random.default_rng(3)), ({0: "n"}, {0: "n"}))
    np.testing.assert_array_equal(f(np.array([0, 2, 2]), np.ones(3, np.float32))[-1], [1, 0, 2])
    with pytest.raises(disc.ShapeError, match="bincount: a value is negative"):
        f(np.array([0, -2, 2]), np.ones(3, np.float32))


def test_through_torch_compile_when_dynamo_captures_them(monkeypatch):
    """Told to capture ops whose sizes the data decides (else it breaks the graph there), dynamo
    gives the backend one graph, compiled once for every shape and mask."""
    import disc_stablehlo.compiler as compiler

    calls = []
    real = compiler.compile_source
    monkeypatch.setattr(compiler, "compile_source", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch._dynamo.reset()
    model = Distinct().eval()
    rng = np.random.default_rng(3)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True), warnings.catch_warnings():
        warnings.filterwarnings("error", message="disc_stablehlo")  # no graph left to PyTorch
        compiled = torch.compile(model, backend="disc_stablehlo", dynamic=True)
        for n in (4, 9, 17):
            args = [torch.from_numpy(a) for a in _distinct(n, rng)]
            for got, want in zip(compiled(*args), model(*args)):
                torch.testing.assert_close(got, want)
    assert len(calls) == 1
