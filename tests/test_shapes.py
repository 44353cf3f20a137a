"""Bounded dynamism: symbolic dims, the relations the analysis derives per op family (checked
against real output shapes at 1, 2, 5 and 10 for every dimension variable), constraints as
facts and as guards, and the consumers of the facts."""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import specs_for

import disc_stablehlo as disc
from disc_stablehlo.bounded_dynamism.symbolic import Dim, parse, parse_constraint

VALUES = (1, 2, 5, 10)


@pytest.mark.parametrize("text, fn", [
    ("b", lambda b, s: b),
    ("2*b + 1", lambda b, s: 2 * b + 1),
    ("b*s - 3", lambda b, s: b * s - 3),
    ("(b + 1)*(s - 1)", lambda b, s: (b + 1) * (s - 1)),
    ("mod(s, 3) + b", lambda b, s: s % 3 + b),
    ("floordiv(s, 4)", lambda b, s: s // 4),
    ("floordiv(2*s + 4, 2)", lambda b, s: s + 2),
    ("max(b, s) - min(b, s)", lambda b, s: abs(b - s)),
])
def test_symbolic_dims_evaluate(text, fn):
    d = parse(text)
    for b, s in itertools.product(VALUES, VALUES):
        assert d.evaluate({"b": b, "s": s}) == fn(b, s), (text, b, s)


def test_symbolic_arithmetic_normalises():
    b, s = Dim.var("b"), Dim.var("s")
    assert (b + s) * 2 == parse("2*s + 2*b")
    assert b * s == s * b
    assert (b * 4).floordiv(2) == b * 2
    assert (b + 1 - 1) == b
    assert parse_constraint("mod(s, 8) == 0")[1] == "=="


def test_equal_products_cancel_a_common_constant():
    """768*x == 768*b*s (a reshape's element count) makes x the dim b*s; a variable factor does
    not cancel (b*x == b*s holds for any x when b is 0)."""
    from disc_stablehlo.bounded_dynamism.analysis import ShapeFacts

    b, s, x, y = (Dim.var(n) for n in ("b", "s", "#x", "#y"))
    facts = ShapeFacts()
    facts.union(x * 768, b * s * 768, "reshape")
    assert facts.equal(x, b * s) and facts.canon(x * 2 + 1) == b * s * 2 + 1
    facts.union(y * b, s * b, "reshape")
    assert not facts.equal(y, s) and facts.facts[-1].text == "#y*b == b*s"


# programs whose result dims the analysis must express over b and s
PROGRAMS = [
    ("elementwise", lambda x: jnp.tanh(x) * 2, [(("b", "s"), np.float32)]),
    ("concatenate", lambda x, y: jnp.concatenate([x, y, x], axis=1), [(("b", "s"), np.float32), (("b", 3), np.float32)]),
    ("reshape_merge", lambda x: x.reshape(x.shape[0], -1), [(("b", "s", 4), np.float32)]),
    ("reshape_flatten", lambda x: x.reshape(-1), [(("b", "s"), np.float32)]),
    ("transpose", lambda x: x.T, [(("b", "s"), np.float32)]),
    ("reduce", lambda x: x.sum(0), [(("b", "s"), np.float32)]),
    ("matmul", lambda x, y: x @ y, [(("b", "s"), np.float32), (("s", 5), np.float32)]),
    ("broadcast_outer", lambda x, y: x[:, None] * y[None, :], [(("b",), np.float32), (("s",), np.float32)]),
    ("iota", lambda x: jnp.arange(2 * x.shape[0], dtype=np.float32), [(("b",), np.float32)]),
    ("keepdims_broadcast", lambda x: x - x.mean(-1, keepdims=True), [(("b", "s"), np.float32)]),
    ("pad", lambda x: jnp.pad(x, ((1, 2), (3, 0))), [(("b", "s"), np.float32)]),
    ("reduce_window", lambda x: jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 3), (1, 2), "VALID"), [(("b", "s"), np.float32)]),
    ("conv_strided", lambda x, w: jax.lax.conv_general_dilated(x, w, (2,), "VALID"), [(("b", 3, "s"), np.float32), ((4, 3, 3), np.float32)]),
    ("cumsum_dynamic_window", lambda x: jnp.cumsum(x, axis=1), [(("b", "s"), np.float32)]),
]


@pytest.mark.parametrize("name, fn, args", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_analysis_result_dims_match_real_shapes(name, fn, args):
    f = disc.compile(fn, *specs_for(args, "b, s"))
    dims = f.symbolic_result_shapes[0]
    assert all("#" not in d for d in dims), f"result dims not derived: {dims}"
    for b, s in itertools.product(VALUES, VALUES):
        if name in ("reduce_window", "conv_strided") and s < 3:
            continue  # the window needs s >= 3 (JAX asserts it)
        inputs = [np.ones(tuple({"b": b, "s": s}.get(d, d) for d in shape), dt) for shape, dt in args]
        out = f(*inputs)
        assert out.shape == tuple(parse(d).evaluate({"b": b, "s": s}) for d in dims), (name, dims, b, s)


BROADCAST = """func.func @main(%x: tensor<?x?xf32>, %y: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %d0 = stablehlo.get_dimension_size %x, dim = 0 : (tensor<?x?xf32>) -> tensor<i32>
  %d1 = stablehlo.get_dimension_size %x, dim = 1 : (tensor<?x?xf32>) -> tensor<i32>
  %r0 = stablehlo.reshape %d0 : (tensor<i32>) -> tensor<1xi32>
  %r1 = stablehlo.reshape %d1 : (tensor<i32>) -> tensor<1xi32>
  %shape = stablehlo.concatenate %r0, %r1, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
  %yb = stablehlo.dynamic_broadcast_in_dim %y, %shape, dims = [0, 1] : (tensor<?x?xf32>, tensor<2xi32>) -> tensor<?x?xf32>
  %s = stablehlo.add %x, %yb : tensor<?x?xf32>
  return %s : tensor<?x?xf32>
}"""


def test_unproven_broadcast_is_checked_at_run_time():
    f = disc.compile(BROADCAST)
    assert "checked at run time [0, 1]" in f.shape_report()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    y1 = np.random.default_rng(1).standard_normal((1, 4)).astype(np.float32)
    np.testing.assert_allclose(f(x, y1), x + y1, rtol=1e-6)  # expands at run time


def test_unproven_broadcast_is_speculated_broadcast_free():
    """Two versions of the loop; host code picks the broadcast-free one when no dim of y
    expands (is 1 where the result's is not; statistics say which ran), the general one
    otherwise; both are right."""
    f = disc.compile(BROADCAST)
    versions = {k.version: k.name for k in f.kernels}
    assert set(versions) == {"broadcast-free", "general"}
    rng = np.random.default_rng(0)
    # a dim of y that is 1 where the result's is 1 too does not expand: broadcast-free
    for xs, ys, ran in [((3, 4), (3, 4), "broadcast-free"), ((3, 4), (1, 4), "general"), ((3, 4), (3, 1), "general"),
                        ((1, 4), (1, 4), "broadcast-free"), ((1, 1), (1, 1), "broadcast-free"), ((2, 1), (1, 1), "general")]:
        x, y = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ys).astype(np.float32)
        before = f.stats()
        np.testing.assert_allclose(f(x, y), x + y, rtol=1e-6)
        after = f.stats()
        calls = {v: after[name]["calls"] - before[name]["calls"] for v, name in versions.items()}
        assert calls == {ran: 1, ({"broadcast-free", "general"} - {ran}).pop(): 0}


def test_constraint_proves_broadcast_and_is_guarded():
    f = disc.compile(BROADCAST, constraints=["arg0.0 == arg1.0", "arg0.1 == arg1.1"])
    report = f.shape_report()
    assert "non-expanding [0, 1]" in report and "checked at run time []" in report
    x, y = (np.random.default_rng(i).standard_normal((3, 4)).astype(np.float32) for i in (0, 1))
    np.testing.assert_allclose(f(x, y), x + y, rtol=1e-6)
    with pytest.raises(disc.ShapeError, match=r"constraint 'arg0.0 == arg1.0' \(user\) violated: arg0.0 = 3, arg1.0 = 1 "
                                              r"\(arg0.0 is argument 'arg0' dim 0; arg1.0 is argument 'arg1' dim 0\)"):
        f(x, y[:1])


@pytest.fixture(scope="module")
def constrained():
    return disc.compile(lambda x: x * 2, *specs_for([(("b", "s"), np.float32)], "b, s"),
                        constraints=["s >= 8", "mod(s, 4) == 0", "b <= 16"])


@pytest.mark.parametrize("shape, match", [
    ((2, 4), r"constraint 's >= 8' \(user\) violated: s = 4 \(s is argument 'args\[0\]' dim 1\)"),
    ((2, 10), r"constraint 'mod\(s, 4\) == 0' \(user\) violated: s = 10"),
    ((17, 8), r"constraint 'b <= 16' \(user\) violated: b = 17 \(b is argument 'args\[0\]' dim 0\)"),
])
def test_user_constraints_are_guards(constrained, shape, match):
    with pytest.raises(disc.ShapeError, match=match):
        constrained(np.ones(shape, np.float32))
    np.testing.assert_array_equal(constrained(np.ones((16, 12), np.float32)), np.full((16, 12), 2, np.float32))


def test_constraints_divide_by_dims_and_a_zero_divisor_counts_as_one():
    """`mod` and `floordiv` by an expression of dims (torch.export's guards have them): computed on
    every call; a divisor below 1 counts as 1, as the compiler evaluates it, instead of trapping."""
    f = disc.compile(lambda x: x * 2, *specs_for([(("b", "s"), np.float32)], "b, s"),
                     constraints=["mod(s, b - 1) == 0", "floordiv(s, max(b - 1, 2)) <= 4"])
    np.testing.assert_array_equal(f(np.ones((3, 6), np.float32)), np.full((3, 6), 2, np.float32))
    assert f(np.ones((1, 6), np.float32)).shape == (1, 6)  # mod(6, 1) == 0, floordiv(6, 2) <= 4
    with pytest.raises(disc.ShapeError, match=r"'mod\(s, b - 1\) == 0' \(user\) violated: b = 5, s = 6"):
        f(np.ones((5, 6), np.float32))
    with pytest.raises(disc.ShapeError, match=r"'floordiv\(s, max\(b - 1, 2\)\) <= 4' \(user\) violated: b = 2, s = 10"):
        f(np.ones((2, 10), np.float32))


def test_user_constraints_become_facts(constrained):
    report = constrained.shape_report()
    assert "s (>= 8, divisible by 4)" in report and "b (<= 16)" in report


def test_jax_constraints_become_facts():
    from jax import export

    b, s = export.symbolic_shape("b, s", constraints=["s >= 2", "b <= 64"])
    f = disc.compile(lambda x: x + 1, jax.ShapeDtypeStruct((b, s), jnp.float32))
    assert "s (>= 2)" in f.shape_report() and "[jax export]" in f.shape_report()


def test_stablehlo_bounds_are_guards():
    f = disc.compile("""func.func @main(%x: tensor<?x4xf32, #stablehlo.bounds<16, ?>>) -> tensor<?x4xf32> {
      %0 = stablehlo.negate %x : tensor<?x4xf32, #stablehlo.bounds<16, ?>>
      %1 = stablehlo.convert %0 : (tensor<?x4xf32, #stablehlo.bounds<16, ?>>) -> tensor<?x4xf32>
      return %1 : tensor<?x4xf32>
    }""")
    np.testing.assert_array_equal(f(np.ones((16, 4), np.float32)), -np.ones((16, 4), np.float32))
    with pytest.raises(disc.ShapeError, match=r"'arg0.0 <= 16' \(#stablehlo.bounds\) violated: arg0.0 = 17"):
        f(np.ones((17, 4), np.float32))


def test_unknown_constraint_variable_is_a_compile_error():
    with pytest.raises(disc.CompileError, match="'t', which is not a dimension variable"):
        disc.compile(lambda x: x, *specs_for([(("b",), np.float32)], "b"), constraints=["t >= 2"])


def test_disc_log_shapes_prints_the_report(monkeypatch, capsys):
    monkeypatch.setenv("DISC_LOG", "shapes")
    disc.compile(lambda x: x.sum(-1), *specs_for([(("b", "s"), np.float32)], "b, s"))
    err = capsys.readouterr().err
    assert "dimension variables:" in err and "args[0]: [b, s]" in err


def test_facts_are_saved_in_and_loaded_from_the_ir(tmp_path, monkeypatch):
    """Facts over the arguments' dims are shape-dialect constraints (cstr_eq, cstr_require under
    one assuming) in a function of their own; a module that carries that function gets the facts
    back, guarded, without being told the constraints again. Facts on intermediates are an
    attribute."""
    import glob

    body = """func.func @main(%x: tensor<?x?xf32>, %y: tensor<?x?xf32>) -> tensor<?x?xf32> {
      %0 = stablehlo.add %x, %y : tensor<?x?xf32>
      return %0 : tensor<?x?xf32>
    }"""
    monkeypatch.setenv("DISC_SAVE_TEMPS", str(tmp_path))
    disc.compile(body, constraints=["arg0.0 >= 2", "mod(arg0.1, 8) == 0"])
    saved = open(glob.glob(str(tmp_path / "after_guard_clean-up*.mlir"))[0]).read()
    function = re.search(r"  func.func @disc_shape_constraints.*?\n  }\n", saved, re.S).group(0)
    assert 'shape.cstr_require %3, "arg0.0 >= 2" {disc.source = "user"}' in function
    assert re.search(r"arith.remsi %\d+, %c8 : index", function) and "shape.cstr_eq" in function
    assert re.search(r"shape.assuming_all( %\d+,){3} %\d+\n", function)  # 2 user facts, 2 from the add's operands
    assert 'disc.symbolic_dims = ["arg0.0", "arg0.1"]' in function
    monkeypatch.delenv("DISC_SAVE_TEMPS")
    reloaded = disc.compile("module {\n" + function + body + "\n}")
    report = reloaded.shape_report()
    assert "arg0.0 >= 2  [user]" in report and "mod(arg0.1, 8) == 0  [user]" in report
    assert "arg0.1 (divisible by 8): read from arg0 dim 1" in report
    for bad, message in (((1, 8), "'arg0.0 >= 2' (user) violated: arg0.0 = 1"),
                         ((3, 7), "'mod(arg0.1, 8) == 0' (user) violated: arg0.1 = 7")):
        with pytest.raises(disc.ShapeError, match=re.escape(message)):
            reloaded(np.ones(bad, np.float32), np.ones(bad, np.float32))
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_array_equal(reloaded(x, x), 2 * x)
    f = disc.compile("""module attributes {disc.shape_facts = ["arg0.0 >= 3 [an earlier compile]"]} {
      func.func @main(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
        %0 = stablehlo.negate %x : tensor<?x4xf32>
        return %0 : tensor<?x4xf32>
      }
    }""")
    assert "arg0.0 >= 3  [an earlier compile]" in f.shape_report()
    assert "arg0.0 (>= 3)" in f.shape_report()


def _two_softmaxes(x, y):
    return jax.nn.softmax(x, axis=1) * jax.nn.softmax(y, axis=1)


def test_proven_equal_dims_merge_kernels(monkeypatch):
    """x and y share the symbol n: with the facts, the loops over x's rows and y's rows have the
    same bounds and the product fuses into a softmax's kernel; without the two consumers of the
    facts that make equal dims one SSA value, the product stays a kernel of its own."""
    from disc_stablehlo.bounded_dynamism import analysis
    from disc_stablehlo.passes import pipeline

    specs = specs_for([(("n", 8), np.float32), (("n", 8), np.float32)], "n")
    with_facts = disc.compile(_two_softmaxes, *specs)
    monkeypatch.setenv("DISC_COMPILE_WORKER", "0")  # the patched pass runs in this process
    monkeypatch.setattr(pipeline, "unify_argument_dims", lambda *a: 0)
    monkeypatch.setattr(analysis, "_rebuild_shape_operands", lambda *a: None)
    without = disc.compile(_two_softmaxes, *specs)
    assert [k.kind for k in with_facts.kernels].count("elementwise") == 0
    assert [k.kind for k in without.kernels].count("elementwise") == 1
    x, y = (np.random.default_rng(i).standard_normal((5, 8)).astype(np.float32) for i in (0, 1))
    np.testing.assert_allclose(with_facts(x, y), _two_softmaxes(x, y), rtol=1e-5)


def _gemm_then_gemm(x, y, w):
    return (y @ w) * jnp.sum(x @ w)


def _allocations_per_call(f, *args) -> int:
    f(*args)
    before = f.memory_stats()["allocations"]
    f(*args)
    return f.memory_stats()["allocations"] - before


def test_buffers_of_provably_equal_size_share_storage(monkeypatch):
    """x @ w and the result have provably equal sizes (x and y share n): the result is written
    into x @ w's buffer, freed after the sum, with no allocator call."""
    from disc_stablehlo.passes import pipeline

    specs = specs_for([(("n", 8), np.float32), (("n", 8), np.float32), ((8, 8), np.float32)], "n")
    args = [np.random.default_rng(i).standard_normal(s).astype(np.float32) for i, s in enumerate([(5, 8), (5, 8), (8, 8)])]
    planned = disc.compile(_gemm_then_gemm, *specs)
    np.testing.assert_allclose(planned(*args), _gemm_then_gemm(*args), rtol=1e-5)
    assert "1 dynamically sized buffer(s) take the storage" in planned.shape_report()
    monkeypatch.setenv("DISC_COMPILE_WORKER", "0")  # the patched pass runs in this process
    monkeypatch.setattr(pipeline, "unify_argument_dims", lambda *a: 0)
    unplanned = disc.compile(_gemm_then_gemm, *specs)
    assert _allocations_per_call(planned, *args) == _allocations_per_call(unplanned, *args) - 1


def test_layer_norm_is_one_kernel():
    """Layer norm: shape vectors are host scalars, the broadcast 1/n is read as a scalar, and the
    two reductions with their producers and consumers fuse over the rows: one stitch kernel."""
    def layer_norm(x):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5)

    f = disc.compile(layer_norm, *specs_for([(("b", "s", 16), np.float32)], "b, s"))
    assert [k.kind for k in f.kernels] == ["stitch fusion"]
    for shape in [(3, 5, 16), (1, 1, 16), (2, 70, 16)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(f(x), layer_norm(x), rtol=1e-4, atol=1e-5)


def test_bounded_dims_get_an_arena_planned_once():
    """With n <= 64 every intermediate has an upper bound: they live at fixed offsets in one
    arena (one allocation per call, served by the RAL's cache), the result is still allocated."""
    specs = specs_for([(("n", 8), np.float32), (("n", 8), np.float32), ((8, 8), np.float32)], "n")
    bounded = disc.compile(_gemm_then_gemm, *specs, constraints=["n <= 64"])
    unbounded = disc.compile(_gemm_then_gemm, *specs)
    assert re.search(r"@main: [1-9]\d* buffer\(s\) of bounded size placed in an arena", bounded.shape_report())
    assert re.search(r"@main: buffer memref<1x\?x8xf32> at arena offset \d+ \(2048 bytes at most\) relies on n <= 64",
                     bounded.shape_report())
    for n in (1, 7, 64):
        args = [np.random.default_rng(i).standard_normal(s).astype(np.float32) for i, s in enumerate([(n, 8), (n, 8), (8, 8)])]
        np.testing.assert_allclose(bounded(*args), _gemm_then_gemm(*args), rtol=1e-4)  # two GEMMs: the BLAS blocks sums by the vector width
        assert _allocations_per_call(bounded, *args) < _allocations_per_call(unbounded, *args)
    with pytest.raises(disc.ShapeError, match="'n <= 64'"):
        bounded(*[np.ones(s, np.float32) for s in [(65, 8), (65, 8), (8, 8)]])


def test_kernels_say_which_facts_they_rely_on(tmp_path, monkeypatch):
    """y's dim equals x's dim 1 only by a user constraint: the broadcast is proven non-expanding
    and the fused kernel says it relies on that fact; without the fact the broadcast is checked
    at run time (two versions) and no kernel relies on anything."""
    text = """func.func @main(%x: tensor<?x?xf32>, %y: tensor<?xf32>) -> tensor<?x?xf32> {
      %s = shape.shape_of %x : tensor<?x?xf32> -> tensor<2xindex>
      %b = stablehlo.dynamic_broadcast_in_dim %y, %s, dims = [1] : (tensor<?xf32>, tensor<2xindex>) -> tensor<?x?xf32>
      %0 = stablehlo.add %x, %b : tensor<?x?xf32>
      %1 = stablehlo.exponential %0 : tensor<?x?xf32>
      return %1 : tensor<?x?xf32>
    }"""
    proven = disc.compile(text, constraints=["arg1.0 == arg0.1"])
    assert [(k.kind, k.relies_on) for k in proven.kernels] == [("elementwise", ("arg1.0 == arg0.1",))]
    assert "non-expanding [0], expanding [], checked at run time []; relies on arg1.0 == arg0.1" in proven.shape_report()
    monkeypatch.setenv("DISC_SAVE_TEMPS", str(tmp_path))
    checked = disc.compile(text)
    monkeypatch.delenv("DISC_SAVE_TEMPS")
    saved = next(tmp_path.glob("after_guard_clean-up*.mlir")).read_text()
    assert re.search(r'shape.cstr_broadcastable %\d+, %\d+ \{disc.source = "broadcast at .*, checked at run time"\}', saved)
    assert sorted(k.version for k in checked.kernels) == ["broadcast-free", "general"]
    assert all(k.relies_on == () for k in checked.kernels)
    x, y = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), np.arange(4, dtype=np.float32)
    for f in (proven, checked):
        np.testing.assert_allclose(f(x, y), np.exp(x + y), rtol=1e-6)
    with pytest.raises(disc.ShapeError, match=re.escape("'arg1.0 == arg0.1' (user) violated")):
        proven(x, np.ones(3, np.float32))


def test_reshape_segments_pair_runs_of_equal_product():
    """A reshape is cut into the shortest runs of its operand's dims and its result's dims with
    equal products, in order (a collapse of each run, then an expand); size-1 dims at the end
    join the last run; no cut exists where the products never meet."""
    from disc_stablehlo.bounded_dynamism.analysis import ShapeFacts, find_segments

    b, s = Dim.var("b"), Dim.var("s")
    c = Dim.const
    facts = ShapeFacts()
    # nn.MultiheadAttention's queries: [1, s, b, 768] -> [s, 12 b, 64]
    assert find_segments(facts, [c(1), s, b, c(768)], [s, c(12) * b, c(64)]) == [([0, 1], [0]), ([2, 3], [1, 2])]
    assert find_segments(facts, [b, s, c(8)], [b, s, c(4), c(2)]) == [([0], [0]), ([1], [1]), ([2], [2, 3])]
    assert find_segments(facts, [b, s, c(4), c(2)], [b * s, c(8)]) == [([0, 1], [0]), ([2, 3], [1])]
    assert find_segments(facts, [b, s, c(1)], [b, s]) == [([0], [0]), ([1, 2], [1])]
    assert find_segments(facts, [b, s], [s, b]) == [([0, 1], [0, 1])]  # merged, then split again
    assert find_segments(facts, [b, s], [b, s, c(2)]) is None


def test_proven_reshapes_are_expand_and_collapse(monkeypatch):
    """[b, s, 8] -> [b, s, 4, 2] and back: the analysis proves each reshape only splits or merges
    dims, so they lower to expand/collapse_shape (no shape buffer, dims fold): one kernel and one
    allocation fewer than through generic reshapes by shape vectors."""
    from disc_stablehlo.bounded_dynamism import analysis

    def fn(x):
        return jnp.tanh(x.reshape(x.shape[0], x.shape[1], 4, 2)).sum(-1).reshape(x.shape[0], -1)

    specs = specs_for([(("b", "s", 8), np.float32)], "b, s")
    proven = disc.compile(fn, *specs)
    monkeypatch.setenv("DISC_COMPILE_WORKER", "0")  # the patched pass runs in this process
    monkeypatch.setattr(analysis, "find_segments", lambda *a: None)
    generic = disc.compile(fn, *specs)
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(proven(x), fn(x), rtol=1e-5, atol=1e-6)
    assert (len(proven.kernels), len(generic.kernels)) == (1, 2)
    assert _allocations_per_call(proven, x) == _allocations_per_call(generic, x) - 1


def test_sizes_computed_at_run_time_are_checked_before_anything_is_allocated():
    """A size the program computes from a value (an iota of n rows): a negative one and one
    whose byte count overflows are ShapeErrors naming the buffer, an allocation the machine
    cannot make is a DiscError with the size asked for, and nothing runs after any of them (no
    kernel writes past a wrapped-around size); the next call works."""
    f = disc.compile("""func.func @main(%n: tensor<i64>) -> tensor<?x4xf32> {
      %s = stablehlo.reshape %n : (tensor<i64>) -> tensor<1xi64>
      %f = stablehlo.constant dense<4> : tensor<1xi64>
      %sh = stablehlo.concatenate %s, %f, dim = 0 : (tensor<1xi64>, tensor<1xi64>) -> tensor<2xi64>
      %0 = stablehlo.dynamic_iota %sh, dim = 0 : (tensor<2xi64>) -> tensor<?x4xf32>
      return %0 : tensor<?x4xf32>
    }""")
    with pytest.raises(disc.ShapeError, match=r"a dim is negative \(-1\)"):
        f(np.array(-1, np.int64))
    with pytest.raises(disc.ShapeError, match="overflows 63 bits"):
        f(np.array(2 ** 62, np.int64))
    with pytest.raises(disc.DiscError, match=r"out of memory allocating \d+ bytes"):
        f(np.array(2 ** 45, np.int64))  # 128 TiB: more than any address space gives
    np.testing.assert_array_equal(f(np.array(3, np.int64)), np.repeat(np.arange(3, dtype=np.float32)[:, None], 4, 1))
