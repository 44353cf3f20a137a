"""The pass pipeline: every named piece parses (a wrongly nested pass aborts the process, so this
runs in a subprocess), and failures produce actionable errors and reproducers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import disc_stablehlo as disc


def test_every_pipeline_piece_parses():
    names = ["FLATTEN", "SHAPE_TO_STD", "LEGALIZE_CHLO", "SIMPLIFY", "TO_LINALG", "BUFFERIZE", "FREE_AFTER_LAST_USE", "TO_LOOPS", "TO_LLVM"]
    code = ("import disc_stablehlo.mlir_support as m\nfrom disc_stablehlo.passes import pipeline as p\n"
            "from torch_mlir import passmanager\nwith m.new_context():\n"
            + "".join(f"    passmanager.PassManager.parse('builtin.module(' + p.{n} + ')')\n" for n in names))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_failing_pipeline_saves_a_reproducer(tmp_path, monkeypatch):
    from torch_mlir import ir

    from disc_stablehlo.mlir_support import new_context, run_pipeline

    monkeypatch.setenv("DISC_SAVE_TEMPS", str(tmp_path))
    with new_context():
        module = ir.Module.parse("func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }")
        with pytest.raises(disc.CompileError, match="(?s)reproducer: .*replay: mlir-opt --pass-pipeline=") as err:
            run_pipeline(module, "builtin.module(no-such-pass)", "bogus stage")
    path = str(err.value).split("reproducer: ")[1].split("\n")[0]
    assert os.path.exists(path) and "func.func @main" in open(path).read()


def test_invalid_ir_from_a_rewrite_is_reported_before_the_next_stage():
    """Our own rewrites run between pass pipelines; IR they leave invalid is caught by the
    verifier before upstream passes see it (they assume valid input), named by stage."""
    from torch_mlir import ir

    from disc_stablehlo.mlir_support import new_context, run_pipeline

    with new_context():
        module = ir.Module.parse("func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }")
        block = module.body.operations[0].regions[0].blocks[0]
        block.operations[0].erase()  # a block without its terminator
        with pytest.raises(disc.CompileError, match="(?s)invalid IR before fusion .*terminator"):
            run_pipeline(module, "builtin.module(canonicalize)", "fusion")


def test_save_temps_keeps_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("DISC_SAVE_TEMPS", str(tmp_path))
    f = disc.compile("func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> { %0 = stablehlo.abs %x : tensor<?xf32>  return %0 : tensor<?xf32> }")
    np.testing.assert_array_equal(f(np.array([-1.0, 2.0], np.float32)), [1.0, 2.0])
    saved = sorted(os.listdir(tmp_path))
    assert any(n.startswith("after_bufferization") for n in saved)
    assert any(n.startswith("after_lowering_to_LLVM") for n in saved)


def test_generated_code_calls_the_runtime():
    """GEMMs go to the BLAS and loops to the thread pool through the RAL, not inline loops; the
    tanh of the product runs behind the GEMM (its epilogue), the exp of `a` on its own."""
    f = disc.compile("""func.func @main(%a: tensor<?x64xf32>, %b: tensor<64x32xf32>) -> (tensor<?x32xf32>, tensor<?x64xf32>) {
      %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<?x64xf32>, tensor<64x32xf32>) -> tensor<?x32xf32>
      %1 = stablehlo.tanh %0 : tensor<?x32xf32>
      %2 = stablehlo.exponential %a : tensor<?x64xf32>
      return %1, %2 : tensor<?x32xf32>, tensor<?x64xf32>
    }""")
    assert "call void @disc_ral_gemm_f32_epilogue(" in f.llvm_ir
    assert "call void @disc_ral_parallel_for(" in f.llvm_ir
    a = np.random.default_rng(0).standard_normal((700, 64)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    tanh, exp = f(a, b)
    np.testing.assert_allclose(tanh, np.tanh(a @ b), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(exp, np.exp(a), rtol=1e-5)


def test_a_broadcast_with_several_readers_fuses_into_each(monkeypatch):
    """An attention mask broadcast once and added in two softmaxes (as in a stack of layers) is
    recomputed inside both stitch kernels, not materialised at the scores' size (which is what
    fusion does without the copies made for each reader: a call then needs one more buffer of
    that size)."""
    import jax

    from conftest import specs_for
    from disc_stablehlo.passes import pipeline

    def two_softmaxes(s1, s2, mask):  # a GEMM between them: two kernels either way
        m = mask[:, None, None, :]
        p = jax.nn.softmax(s1 + m, axis=-1)
        return jax.nn.softmax(p @ s2 * 0.5 + m, axis=-1)

    def peak_bytes(f, args):
        f(*args)
        f._exe.runtime.reset_peak()
        base = f._exe.runtime.memory_stats()["bytes_in_use"]
        out = f(*args)
        return f._exe.runtime.memory_stats()["peak_bytes"] - base, out

    shapes = [(("b", 4, "s", "s"), np.float32), (("b", 4, "s", "s"), np.float32), (("b", "s"), np.float32)]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(2, 4, 64, 64), (2, 4, 64, 64), (2, 64)]]
    f = disc.compile(two_softmaxes, *specs_for(shapes, "b, s"))
    assert {k.kind for k in f.kernels} == {"stitch fusion"}
    peak, out = peak_bytes(f, args)
    np.testing.assert_allclose(out, two_softmaxes(*args), rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("DISC_COMPILE_WORKER", "0")  # the patched pass runs in this process
    monkeypatch.setattr(pipeline, "duplicate_broadcasts", lambda module: 0)
    shared_peak, out = peak_bytes(disc.compile(two_softmaxes, *specs_for(shapes, "b, s")), args)
    np.testing.assert_allclose(out, two_softmaxes(*args), rtol=1e-5, atol=1e-6)
    assert shared_peak - peak >= args[0].nbytes


def test_concatenated_parts_are_written_in_place():
    """Rotary-embedding style: two halves computed and concatenated along the last dim. Each
    producer writes straight into its part of the result: no copy kernel and no kernel that
    picks its source per element by comparing the index (which does not vectorise)."""
    import jax.numpy as jnp

    from conftest import specs_for

    def rope_like(x, c, s):
        x1, x2 = x[..., :32], x[..., 32:]
        return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], -1)

    f = disc.compile(rope_like, *specs_for([(("b", "s", 64), np.float32), (("s", 32), np.float32), (("s", 32), np.float32)], "b, s"))
    assert "copy" not in [k.kind for k in f.kernels]
    assert not any("arith.cmpi" in k.ops for k in f.kernels)
    rng = np.random.default_rng(0)
    for b, s in [(1, 3), (2, 17)]:
        args = [rng.standard_normal(shape).astype(np.float32) for shape in [(b, s, 64), (s, 32), (s, 32)]]
        np.testing.assert_allclose(f(*args), rope_like(*args), rtol=1e-6, atol=1e-6)


def test_pooling_is_a_parallel_reduction():
    """A reduce_window whose body is one max / add (here a max pool with JAX's "SAME" padding over
    a dynamic size: window parameters as constant operands, padding computed at run time) is a
    reduction kernel on the thread pool, the window its reduction loops; a body of more than one
    op keeps the general lowering (the body called per window element, no kernel)."""
    import jax
    import jax.numpy as jnp

    from conftest import specs_for

    def max_pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")

    def sum_of_squares(x):  # not a monoid of the two arguments alone
        return jax.lax.reduce_window(x, np.float32(0), lambda a, b: a + b * b, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    specs = specs_for([(("b", "h", "h", 8), np.float32)], "b, h")
    f, g = disc.compile(max_pool, *specs), disc.compile(sum_of_squares, *specs)
    assert any("arith.maximumf" in k.ops for k in f.kernels) and not g.kernels
    rng = np.random.default_rng(0)
    for b, h in [(1, 5), (2, 16)]:
        x = rng.standard_normal((b, h, h, 8)).astype(np.float32)
        np.testing.assert_array_equal(f(x), jax.jit(max_pool)(x))
        np.testing.assert_allclose(g(x), jax.jit(sum_of_squares)(x), rtol=1e-5, atol=1e-6)


def test_invariant_conditional_reads_leave_the_inner_loop():
    """A read under a bounds check that does not depend on the inner loop (a padded input read
    in a convolution's loop over output features) moves before that loop with its index
    arithmetic; the loop's own reads and writes, and a division, stay."""
    from torch_mlir import ir

    from disc_stablehlo.mlir_support import new_context
    from disc_stablehlo.passes.loops import hoist_invariant_loads

    text = """
    func.func @f(%x: memref<?xf32>, %w: memref<16xf32>, %out: memref<?x16xf32>, %n: index, %m: index) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c16 = arith.constant 16 : index
      %zero = arith.constant 0.0 : f32
      scf.parallel (%i) = (%c0) to (%n) step (%c1) {
        scf.for %j = %c0 to %c16 step %c1 {
          %p = arith.subi %i, %c1 : index
          %q = arith.divsi %i, %m : index
          %ok = arith.cmpi sge, %p, %c0 : index
          %v = scf.if %ok -> (f32) {
            %l = memref.load %x[%p] : memref<?xf32>
            scf.yield %l : f32
          } else {
            scf.yield %zero : f32
          }
          %k = memref.load %w[%j] : memref<16xf32>
          %y = arith.mulf %v, %k : f32
          memref.store %y, %out[%q, %j] : memref<?x16xf32>
        }
        scf.reduce
      }
      return
    }"""
    with new_context():
        module = ir.Module.parse(text)
        assert hoist_invariant_loads(module) == 3  # the subtraction, the comparison, the conditional read
        inner = next(op for op in module.body.operations[0].regions[0].blocks[0].operations if op.name == "scf.parallel")
        outer_body = [op.name for op in inner.regions[0].blocks[0].operations]
        assert outer_body[:4] == ["arith.subi", "arith.cmpi", "scf.if", "scf.for"]
        loop = inner.regions[0].blocks[0].operations[3]
        assert [op.name for op in loop.regions[0].blocks[0].operations][:2] == ["arith.divsi", "memref.load"]


def test_kernels_describe_what_they_compute():
    import jax
    import jax.numpy as jnp
    from jax import export

    b, s = export.symbolic_shape("b, s")
    f = disc.compile(lambda x: jax.nn.softmax(x, axis=-1), jax.ShapeDtypeStruct((b, s, 8), jnp.float32))
    [kernel] = f.kernels  # max, exp, sum and divide over each row: one stitch kernel
    assert kernel.kind == "stitch fusion" and kernel.parallel_dims == 1  # (b, s) collapsed into one
    assert {"arith.maximumf", "math.exp", "arith.addf", "arith.divf"} <= set(kernel.ops)
    assert str(kernel).startswith("__disc_par_")
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(f(x), jax.nn.softmax(x, axis=-1), rtol=1e-5, atol=1e-6)


def test_vector_math_maps_to_libmvec_within_the_target_width():
    from disc_stablehlo.targets.codegen import _libmvec, _libmvec_name

    if _libmvec() is None:
        pytest.skip("this system's C library has no libmvec")
    assert _libmvec_name("llvm.exp.v16f32", 512) == "_ZGVeN16v_expf"
    assert _libmvec_name("llvm.pow.v4f64", 256) == "_ZGVdN4vv_pow"
    assert _libmvec_name("llvm.exp.v16f32", 256) is None  # no AVX-512: stays an intrinsic
    assert _libmvec_name("llvm.atan2.v8f32", 512) is None  # too inaccurate in libmvec
    assert _libmvec_name("llvm.fabs.v16f32", 512) is None  # not a libm function


def test_division_by_a_row_invariant_is_a_multiplication_by_its_reciprocal():
    """Softmax divides each row by its sum: `arcp` lets LLVM compute the reciprocal once per row
    and multiply (a vector division per element is among the slowest instructions). A division by
    a value that changes with the element stays a correctly rounded division."""
    import jax
    from conftest import specs_for

    soft = disc.compile(lambda x: jax.nn.softmax(x, axis=-1), *specs_for([(("b", "s"), np.float32)], "b, s"))
    div = disc.compile(lambda x, y: x / y, *specs_for([(("b", "s"), np.float32)] * 2, "b, s"))
    assert "fdiv arcp" in soft.llvm_ir and "fdiv arcp" not in div.llvm_ir
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((3, 37)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(soft(x), jax.nn.softmax(x, axis=-1), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(div(x, y), x / y)


def test_loops_vectorise_at_the_full_avx512_width(tmp_path):
    """On an AVX-512 host the loop vectoriser uses 512-bit vectors (LLVM's tuning for these cores
    prefers 256): a tanh loop calls libmvec's 16-lane tanhf."""
    import jax
    import jax.numpy as jnp

    from disc_stablehlo import artifact
    from disc_stablehlo.targets import host_target
    from disc_stablehlo.targets.codegen import _libmvec

    if host_target().vector_bits < 512 or _libmvec() is None:
        pytest.skip("needs an AVX-512 host whose C library has libmvec")
    f = disc.compile(jnp.tanh, jax.ShapeDtypeStruct((jax.export.symbolic_shape("n")[0],), jnp.float32))
    f.save(tmp_path / "tanh.disc")
    code = bytes(artifact.read(tmp_path / "tanh.disc").section("object"))
    assert b"_ZGVeN16v_tanhf" in code and b"_ZGVdN8v_tanhf" not in code


def test_stats_are_collected_only_when_asked_for():
    """Off, calls write no shared statistics and stats() says how to turn them on."""
    import jax

    f = disc.compile(lambda x: x * 2, jax.ShapeDtypeStruct((4096, 64), np.float32))
    x = np.ones((4096, 64), np.float32)
    before = f.stats()[f.kernels[0].name]["calls"]
    disc.collect_stats(False)
    try:
        f(x)
        with pytest.raises(disc.DiscError, match=r"kernel statistics are off: call disc.collect_stats\(\)"):
            f.stats()
    finally:
        disc.collect_stats()
    assert f.stats()[f.kernels[0].name]["calls"] == before  # the call while off was not counted
    f(x)
    assert f.stats()[f.kernels[0].name]["calls"] == before + 1


def test_stats_count_kernel_versions_and_library_calls():
    """Per kernel: calls, which version ran (thread pool, behind the GEMM's row blocks, or inline:
    chosen from the real sizes) and time; GEMM calls are counted too."""
    import jax
    import jax.numpy as jnp
    from conftest import gemm_epilogue_behind
    from jax import export

    n, = export.symbolic_shape("n")
    f = disc.compile(lambda x, w: jnp.tanh(x @ w), jax.ShapeDtypeStruct((n, 64), jnp.float32),
                     jax.ShapeDtypeStruct((64, 64), jnp.float32))
    [kernel] = f.kernels
    w = np.ones((64, 64), np.float32)
    before = f.stats()
    f(np.ones((2, 64), np.float32), w)      # 128 elements: inline
    # 262144 elements: behind the GEMM's row blocks where it has enough of them, else on the pool after it
    f(np.ones((4096, 64), np.float32), w)
    after = f.stats()
    delta = {k: after[kernel.name][k] - before[kernel.name][k] for k in ("calls", "pool", "fused", "inline")}
    behind = gemm_epilogue_behind(4096)
    assert delta == {"calls": 2, "pool": int(not behind), "fused": int(behind), "inline": 1}
    assert after[kernel.name]["seconds"] > before[kernel.name]["seconds"]
    assert after["disc_ral_gemm_f32"]["calls"] - before["disc_ral_gemm_f32"]["calls"] == 2


def _two_layers(x, w1, b1, w2, b2, w3):
    import jax
    import jax.numpy as jnp

    h = jax.nn.gelu(x @ w1 + b1, approximate=False)
    h = jax.nn.gelu(h @ w2 + b2, approximate=False)
    return jnp.tanh(h @ w3)


def _compile_two_layers():
    import jax
    import jax.numpy as jnp
    from jax import export

    n, = export.symbolic_shape("n")
    mat, vec = jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float32)
    return disc.compile(_two_layers, jax.ShapeDtypeStruct((n, 64), jnp.float32), mat, vec, mat, vec, mat)


def _two_layer_args():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) / 8 for s in [(300, 64), (64, 64), (64,), (64, 64), (64,), (64, 64)]]


def test_identical_loops_share_one_kernel():
    """Two layers of the same shape: their bias + GELU loops are the same code over other
    buffers, generated and compiled once (one definition in the LLVM IR) and listed at both
    places under one name, whose counters count both; a loop that differs gets its own kernel."""
    f = _compile_two_layers()
    first, second, last = f.kernels
    assert first.name == second.name != last.name
    assert "math.tanh" in last.ops and "math.tanh" not in first.ops
    assert f.llvm_ir.count(f"define void @{first.name}(") == 1
    args = _two_layer_args()
    before = f.stats()[first.name]["calls"]
    np.testing.assert_allclose(f(*args), _two_layers(*args), rtol=2e-4, atol=2e-5)
    assert f.stats()[first.name]["calls"] - before == 2


def _uncached(monkeypatch):
    """This process's kernel cache emptied for the test (and no cache folder)."""
    from disc_stablehlo.targets import codegen

    monkeypatch.delenv("DISC_CACHE_DIR", raising=False)
    monkeypatch.setattr(codegen, "kernel_cache", codegen.KernelCache())


def test_code_generation_is_split_with_a_helper_process(monkeypatch):
    """Kernels are compiled partly in a helper process, at the same time as the rest here: one
    object per part (the host code, each kernel), one shared object, the same results as code
    generation in this process alone. A helper that dies mid-request leaves its parts to this
    process (and is not started again)."""
    from disc_stablehlo.targets import codegen, get_target
    from disc_stablehlo.targets.codegen import classic_float_literals

    f = _compile_two_layers()
    t = get_target("x86")
    spec, llvm_ir = (t.triple, t.cpu, t.features, t.vector_bits), classic_float_literals(f.llvm_ir)
    kernels = [k.name for k in f.kernels]
    parts = 1 + len(set(kernels))
    codegen.start_helper()
    for _ in range(200):  # it loads llvmlite in the background
        if codegen.ready_helper():
            break
        time.sleep(0.05)
    asked, ask = [], codegen._ask

    def counted(helper, request):
        asked.append(request)
        return ask(helper, request)

    monkeypatch.setattr(codegen, "_ask", counted)
    _uncached(monkeypatch)
    assert len(codegen.emit_objects(llvm_ir, spec, kernels, b"")[0]) == parts
    assert asked  # the helper took a part
    monkeypatch.setenv("DISC_COMPILE_HELPER", "0")
    _uncached(monkeypatch)
    asked.clear()
    assert len(codegen.emit_objects(llvm_ir, spec, kernels, b"")[0]) == parts and not asked
    alone = _compile_two_layers()
    args = _two_layer_args()
    np.testing.assert_array_equal(f(*args), alone(*args))
    monkeypatch.delenv("DISC_COMPILE_HELPER")

    def dies(self, request):
        raise EOFError("the code generation helper exited")

    monkeypatch.setattr(codegen._Helper, "call", dies)
    monkeypatch.setattr(codegen, "_helper_failed", False)
    _uncached(monkeypatch)
    assert len(codegen.emit_objects(llvm_ir, spec, kernels, b"")[0]) == parts  # its part compiled here
    assert codegen._helper_failed and codegen.ready_helper() is None


def test_a_part_llvm_rejects_stops_the_split_compilation(monkeypatch):
    """A part LLVM rejects here (a compiler bug; `x86.emit_objects` makes it a CompileError) raises
    LLVMRejected once the helper's part in flight is done: the parts still queued are not compiled."""
    from disc_stablehlo.targets import codegen, get_target
    from disc_stablehlo.targets.codegen import classic_float_literals

    f = _compile_two_layers()
    t = get_target("x86")
    spec, llvm_ir = (t.triple, t.cpu, t.features, t.vector_bits), classic_float_literals(f.llvm_ir)
    codegen.start_helper()
    for _ in range(200):
        if codegen.ready_helper():
            break
        time.sleep(0.05)
    compiled, plain = [], codegen.compile_part

    def rejects(text, *args):
        compiled.append(text)
        raise codegen.LLVMRejected("rejected here")

    asked, ask = [], codegen._ask

    def counted(helper, request):
        asked.append(request)
        return ask(helper, request)

    monkeypatch.setattr(codegen, "compile_part", rejects)
    monkeypatch.setattr(codegen, "_ask", counted)
    _uncached(monkeypatch)
    with pytest.raises(codegen.LLVMRejected, match="rejected here"):
        codegen.emit_objects(llvm_ir, spec, [k.name for k in f.kernels], b"")
    assert len(compiled) == 1  # this process stopped at its first part
    assert len(asked) <= 1  # and the helper at the one in flight (of the 2 left: the host code and 2 kernels)
    monkeypatch.setattr(codegen, "compile_part", plain)
    assert codegen.ready_helper() is not None  # the helper is free again


def test_unoptimised_host_code_gets_the_quick_code_generator():
    """A module whose defined functions are all `optnone` is generated at level 0; any function
    LLVM optimises keeps level 3."""
    import llvmlite.binding as llvm

    from disc_stablehlo.targets import codegen

    host = "define void @main() #0 {\n  call void @k()\n  ret void\n}\ndeclare void @k()\nattributes #0 = { noinline optnone }\n"
    assert codegen.codegen_level(llvm.parse_assembly(host)) == 0
    kernel = host + "define void @k2() {\n  ret void\n}\n"
    assert codegen.codegen_level(llvm.parse_assembly(kernel)) == 3
    assert codegen.codegen_level(llvm.parse_assembly("declare void @k()\n")) == 3


def test_the_host_codes_part_gets_the_quick_code_generator():
    """Everything but the kernels (the entry, the guard, their C interfaces and the packed entry
    points artifacts are called through) is straight-line code left unoptimised, so the host
    code's part of the compilation is generated at level 0."""
    import llvmlite.binding as llvm

    from disc_stablehlo.targets import codegen
    from disc_stablehlo.targets.codegen import classic_float_literals

    f = _compile_two_layers()
    functions = codegen.Functions(classic_float_literals(f.llvm_ir))
    host = functions.text(frozenset(k.name for k in f.kernels))
    assert "define void @disc_call_entry(" in host
    assert codegen.codegen_level(llvm.parse_assembly(host)) == 0


def test_long_blocks_of_host_code_are_cut_for_instruction_selection():
    """Host code LLVM does not optimise comes in blocks of at most HOST_BLOCK_OPS ops (LLVM's
    instruction selection is quadratic in a block's length: EfficientNetV2-S's entry block of 7500
    instructions took 43 s); the function still computes the same."""
    from conftest import specs_for

    from disc_stablehlo.passes import pipeline

    def many(*xs):
        return sum(x * (i + 1) for i, x in enumerate(xs))
    f = disc.compile(many, *specs_for([(("n",), np.float32)] * 60, "n"))
    host = f.llvm_ir[f.llvm_ir.index("@main("):]
    host = host[:host.index("\n}\n")]
    blocks = re.split(r"\n\S+:", host)
    assert len(blocks) > 2 and max(b.count("\n  ") for b in blocks) <= pipeline.HOST_BLOCK_OPS
    xs = [np.full(5, i, np.float32) for i in range(60)]
    np.testing.assert_allclose(f(*xs), sum(x * (i + 1) for i, x in enumerate(xs)))


def test_the_other_parts_functions_are_declarations():
    """Each part of a split compilation declares the functions the other part defines (a
    definition kept as `available_externally` went through this part's optimisation passes
    before being dropped); local functions and the rest stay defined, and the result parses."""
    import llvmlite.binding as llvm

    from disc_stablehlo.targets import codegen

    text = ("define void @k1(ptr %0, i64 %1) #0 {\n  call void @helper()\n  ret void\n}\n"
            "define internal void @helper() {\n  ret void\n}\n"
            "define void @k2(ptr %0, i64 %1) {\n  ret void\n}\n"
            "define void @main() {\n  call void @k1(ptr null, i64 0)\n  call void @k2(ptr null, i64 1)\n  ret void\n}\n"
            "attributes #0 = { noinline }\n")
    functions = codegen.Functions(text)
    assert {name: text.count("\n") for name, text in functions.definitions.items()} == {"k1": 4, "k2": 3, "main": 5}  # local functions are in every part
    out = functions.text(frozenset({"k1", "main"}))
    mod = llvm.parse_assembly(out)
    mod.verify()
    declared = {f.name for f in mod.functions if f.is_declaration}
    assert declared == {"k1", "main"}
    assert "define void @k2(" in out and "define internal void @helper()" in out


def _epilogue_models():
    import jax
    import jax.numpy as jnp

    def mlp(x, w, b):  # bias and GELU behind [b*s, 64] x [64, 96]
        return jax.nn.gelu(x @ w + b, approximate=False)

    def attention(q, k):  # scale and softmax behind the batched [b, s, s] scores
        return jax.nn.softmax(jnp.einsum("bsd,btd->bst", q, k) * 0.125, axis=-1)

    def residual_norm(x, w):  # residual and layer norm behind the product
        h = x + x @ w
        m = h.mean(-1, keepdims=True)
        return (h - m) * jax.lax.rsqrt(((h - m) ** 2).mean(-1, keepdims=True) + 1e-5)

    def transposed(x, w):  # reads the product across rows: not an epilogue
        return jnp.swapaxes(x @ w, 1, 2) + 1.0

    def written_transposed(x, w):  # the product goes straight into [s, b, n]: its rows are not C's
        return jnp.tanh(jnp.transpose(jnp.einsum("bsk,bkn->bsn", x, w), (1, 0, 2)))

    return [("mlp", mlp, [(("b", "s", 64), np.float32), ((64, 96), np.float32), ((96,), np.float32)], True),
            ("attention", attention, [(("b", "s", 32), np.float32), (("b", "s", 32), np.float32)], True),
            ("residual_norm", residual_norm, [(("b", "s", 64), np.float32), ((64, 64), np.float32)], True),
            ("transposed", transposed, [(("b", "s", 64), np.float32), ((64, 48), np.float32)], False),
            ("written_transposed", written_transposed, [(("b", "s", 8), np.float32), (("b", 8, 16), np.float32)], False)]


@pytest.mark.parametrize("name, fn, shapes, fused", _epilogue_models(), ids=lambda v: v if isinstance(v, str) else "")
def test_gemm_epilogues_run_behind_the_gemm(name, fn, shapes, fused, monkeypatch):
    """A loop that consumes a GEMM's rows (bias, GELU, scale + softmax, residual + layer norm)
    runs as the GEMM's epilogue: behind each block as it is computed (stats: "fused") when the
    product has enough whole-row blocks for the pool to balance, else right after it; results
    equal the unfused compilation's and jax.jit's at shapes that take each path. A loop that
    reads the product across rows stays on its own."""
    from conftest import gemm_epilogue_behind, specs_for
    from disc_stablehlo.passes import pipeline

    f = disc.compile(fn, *specs_for(shapes, "b, s"))
    behind = [k for k in f.kernels if k.epilogue_of]
    assert [k.epilogue_of for k in behind] == (["disc_ral_gemm_f32"] if fused else [])
    monkeypatch.setenv("DISC_COMPILE_WORKER", "0")  # the patched pass runs in this process
    monkeypatch.setattr(pipeline, "fuse_epilogues", lambda module: 0)
    unfused = disc.compile(fn, *specs_for(shapes, "b, s"))
    assert not any(k.epilogue_of for k in unfused.kernels)
    before = f.stats()
    for b, s in [(1, 3), (2, 200), (16, 64)]:
        rng = np.random.default_rng(b * s)
        args = [rng.standard_normal(tuple(b if d == "b" else s if d == "s" else d for d in shape)).astype(dtype)
                for shape, dtype in shapes]
        out = f(*args)
        np.testing.assert_allclose(out, unfused(*args), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out, fn(*args), rtol=2e-4, atol=2e-5)
    if fused:
        after = {k: f.stats()[behind[0].name][k] - before[behind[0].name][k] for k in ("calls", "fused")}
        # behind the blocks only with at least 4 whole-row tasks per thread: the 16 score matrices,
        # or the products of 16 x 64 rows split into blocks that share B packed once
        rows = [b * s for b, s in [(1, 3), (2, 200), (16, 64)]]
        expected = 1 if name == "attention" else sum(gemm_epilogue_behind(r) for r in rows)
        assert after == {"calls": 3, "fused": expected}


def test_broadcast_bias_does_not_stop_fusion_across_a_reshape():
    """[b*s, n] = x @ w + bias, viewed as [b, s, n], then GELU-tanh: the bias is read through a
    unit dim ([1, n] at index 0), which upstream fusion cannot move a reshape across until unit
    dims fold; then bias and GELU are one loop, run behind the GEMM."""
    import jax

    from conftest import specs_for

    def fn(x, w, bias):
        b, s, k = x.shape
        y = (x.reshape(b * s, k) @ w + bias).reshape(b, s, w.shape[1])
        return jax.nn.gelu(y, approximate=True)

    shapes = [(("b", "s", 16), np.float32), ((16, 40), np.float32), ((40,), np.float32)]
    f = disc.compile(fn, *specs_for(shapes, "b, s"))
    [kernel] = f.kernels
    assert kernel.epilogue_of == "disc_ral_gemm_f32" and {"arith.addf", "math.tanh"} <= set(kernel.ops), kernel
    rng = np.random.default_rng(0)
    w, bias = rng.standard_normal((16, 40), dtype=np.float32), rng.standard_normal(40, dtype=np.float32)
    for b, s in [(1, 1), (2, 9), (5, 31)]:
        x = rng.standard_normal((b, s, 16), dtype=np.float32)
        np.testing.assert_allclose(f(x, w, bias), fn(x, w, bias), rtol=2e-5, atol=2e-5)


def test_gather_by_iota_indices_is_a_plain_read():
    """`mask[arange(b)[:, None], arange(s)]` (how transformers' vmap'd masks read the padding
    mask) is a gather whose start indices are iotas: the analysis proves them in bounds, so the
    gather reads mask[b, j] directly, without loading or clamping indices, and fuses into the
    softmax as one kernel. Reversed indices stay a general gather; both match jax.jit."""
    import jax
    import jax.numpy as jnp

    from conftest import specs_for

    def masked_softmax(scores, mask, reverse=False):
        b, s = mask.shape
        j = jnp.arange(s)[::-1] if reverse else jnp.arange(s)
        m = mask[jnp.broadcast_to(jnp.arange(b)[:, None], (b, s)), jnp.broadcast_to(j[None, :], (b, s))]
        return jax.nn.softmax(jnp.where(m[:, None, None, :], scores, -1e9), axis=-1)

    shapes = [(("b", 2, "s", "s"), np.float32), (("b", "s"), np.bool_)]
    plain = disc.compile(masked_softmax, *specs_for(shapes, "b, s"))
    assert {k.kind for k in plain.kernels} == {"stitch fusion"}, plain.kernels
    assert not any({"arith.extsi", "arith.addi"} & set(k.ops) for k in plain.kernels), plain.kernels
    general = disc.compile(lambda x, m: masked_softmax(x, m, reverse=True), *specs_for(shapes, "b, s"))
    rng = np.random.default_rng(0)
    for b, s in [(1, 1), (2, 5), (3, 17)]:
        x, m = rng.standard_normal((b, 2, s, s), dtype=np.float32), rng.random((b, s)) > 0.3
        np.testing.assert_allclose(plain(x, m), masked_softmax(x, m), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(general(x, m), masked_softmax(x, m, reverse=True), rtol=1e-5, atol=1e-6)


def test_column_reductions_get_a_column_schedule_chosen_at_run_time():
    """A reduction over a non-innermost dim runs, when the innermost extent is at least a vector,
    as blocks of columns with the reduction loop outside a contiguous loop (the "column"
    versions: narrow blocks, or, where the loop reads more than the caches hold, the reduced rows
    split into chunks whose partial results a second loop combines ("split": at least 128 rows),
    or wide blocks), otherwise each column on its own (the "row" version); the statistics say
    which ran. With a static innermost extent the row version is left out at compile time."""
    import jax.numpy as jnp
    from conftest import specs_for

    from disc_stablehlo.passes import loops

    def fn(x, y):
        return x.max(0), jnp.tanh(y.mean(1))  # over rows of [r, c]; over the sequence of [b, s, 64]

    f = disc.compile(fn, *specs_for([(("r", "c"), np.float32), (("b", "s", 64), np.float32)], "r, c, b, s"))
    versions = sorted(k.version for k in f.kernels)
    assert versions == ["column, narrow"] * 2 + ["column, wide, split"] * 2 + ["column, wide, split, partial"] * 2 + [
        "column, wide, wide"] * 2 + ["row"], [str(k) for k in f.kernels]
    name: dict[str, str] = {}
    for k in f.kernels:  # x.max(0)'s kernels come first
        if k.version in ("row", "column, wide, wide", "column, wide, split, partial"):
            name.setdefault(k.version, k.name)
    split_rows, wide_columns = loops.WIDE_BYTES // 4 // 1000 + 1, loops.WIDE_BYTES // 4 // 100 + 1
    for (r, c), (b, s) in [((4096, 5), (2, 3)), ((3, 300), (7, 40)), ((1, 16), (1, 1)), ((split_rows, 1000), (3, 40)),
                           ((100, wide_columns), (1, 1))]:
        rng = np.random.default_rng(r * c)
        x, y = rng.standard_normal((r, c)).astype(np.float32), rng.standard_normal((b, s, 64)).astype(np.float32)
        before = f.stats()
        mx, mean = f(x, y)
        np.testing.assert_array_equal(mx, x.max(0))
        np.testing.assert_allclose(mean, np.tanh(y.mean(1)), rtol=1e-5, atol=1e-6)
        after = f.stats()
        ran = {v for v, k in name.items() if after[k]["calls"] > before[k]["calls"]}
        expected = {"row"} if c < 16 else {"column, wide, split, partial"} if r == split_rows else {"column, wide, wide"} if r == 100 else set()
        assert ran == expected, ran


def test_split_column_reductions_combine_their_chunks_exactly():
    """The "split" column schedule: a sum, mean, product, maximum or minimum over the rows of a
    tall matrix, or over the middle dim of [b, s, h], with row counts the chunks do not divide,
    in float32 and float64, matches numpy; NaN stays NaN; the partial kernel ran on the pool."""
    import jax.numpy as jnp
    from conftest import specs_for

    from disc_stablehlo.passes import loops

    tall = [(loops.WIDE_BYTES // 4 // 300 + 37, 300), (loops.SPLIT_CHUNKS * 1000 + 3, 170)]
    cases = [(lambda x: x.sum(0), np.float32, tall), (lambda x: x.mean(0), np.float32, tall[:1]),
             (lambda x: (x * 0.001 + 1).prod(0), np.float32, tall[:1]), (lambda x: x.max(0), np.float32, tall[:1]),
             (lambda x: x.min(0), np.float64, tall[:1]), (lambda x: jnp.sum(x, 1), np.float64, [(2, 1401, 1000), (3, 129, 9000)])]
    for fn, dtype, shapes in cases:
        dims = ("r", "c") if len(shapes[0]) == 2 else ("b", "s", "h")
        f = disc.compile(fn, *specs_for([(dims, dtype)], ", ".join(dims)))
        (partial,) = [k.name for k in f.kernels if k.version.endswith("split, partial")]
        for shape in shapes:
            x = np.random.default_rng(shape[0]).standard_normal(shape).astype(dtype)
            x.flat[shape[-1] + 3] = np.nan
            before = f.stats()[partial]["pool"]
            exact = np.asarray(fn(x.astype(np.float64)))
            scale = np.max(np.asarray(fn(np.nan_to_num(np.abs(x)).astype(np.float64))))  # rounding grows with the |x| summed
            np.testing.assert_allclose(f(x), exact, rtol=1e-3 if dtype == np.float32 else 1e-9, atol=8 * np.finfo(dtype).eps * scale)
            assert f.stats()[partial]["pool"] == before + 1, (shape, dtype)


def test_fused_column_reductions_keep_the_column_schedule():
    """Several column reductions fused over the same columns (a mean, then the variance around it,
    and a maximum) run in column blocks too (each reduction loop outside the block's loop), not one
    column at a time down the rows; independent ones (a sum, a maximum, a minimum) become one
    loop, which the split schedule takes, and on large inputs dependent ones run one loop after
    the other, each split; every version gives numpy's values."""
    from conftest import specs_for

    from disc_stablehlo.passes import loops

    def stats(x):
        return x.mean(0), x.var(0), x.max(0)

    def extrema(x):  # independent of each other: one reduction loop, read once, and split
        return x.sum(0), x.max(0), x.min(0)

    f = disc.compile(stats, *specs_for([(("r", "c"), np.float32)], "r, c"))
    split = ["column, wide, split", "column, wide, split, partial", "column, wide, wide"]
    # large: the mean's loop, the variance's (which reads the mean), the maximum's, each split
    assert sorted(k.version for k in f.kernels) == sorted(["column, narrow", "row"] + split * 3), [str(k) for k in f.kernels]
    g = disc.compile(extrema, *specs_for([(("r", "c"), np.float32)], "r, c"))
    assert sorted(k.version for k in g.kernels) == sorted(["column, narrow", "row"] + split), [str(k) for k in g.kernels]
    for r, c in ((5, 3), (100, 40), (loops.WIDE_BYTES // 4 // 500 + 1, 500), (100, loops.WIDE_BYTES // 4 // 100 + 1)):
        x = np.random.default_rng(r).standard_normal((r, c)).astype(np.float32) + 3
        for fn, compiled in ((stats, f), (extrema, g)):
            for got, want in zip(compiled(x), fn(x)):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-7 * r * 4)


def test_transposed_gemm_operands_are_read_in_place():
    """Attention heads: q, k and v are [b, s, heads, dim] buffers read per head at their strides
    (two batch levels), and the context is written per head straight into [b, s, heads, dim],
    so the head transposes cost no copy: the whole function is two GEMM calls and no loop. Queries
    scaled after their transpose are scaled before it (one elementwise loop, not a copy). A
    transpose that reorders a product's free dims is still copied."""
    import jax.numpy as jnp
    from conftest import gemm_call_args, specs_for

    def heads(q, k, v):
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        return ((q @ k.transpose(0, 1, 3, 2)) @ v).transpose(0, 2, 1, 3)

    def scaled(q, k, v):
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        return (((q * 0.125) @ k.transpose(0, 1, 3, 2)) @ v).transpose(0, 2, 1, 3)

    def reordered(x, w):  # [b, s, n] -> [b, n, s] @ ...: the free dims change order
        return jnp.swapaxes(x, 1, 2) @ w

    f = disc.compile(heads, *specs_for([(("b", "s", 4, 16), np.float32)] * 3, "b, s"))
    assert f.kernels == [] and f.llvm_ir.count("call void @disc_ral_gemm_f32(") == 2
    h = disc.compile(scaled, *specs_for([(("b", "s", 4, 16), np.float32)] * 3, "b, s"))
    assert [(k.kind, k.ops) for k in h.kernels] == [("elementwise", ("arith.mulf",))], h.kernels
    scores, context = gemm_call_args(h)
    # the scaled queries and the keys at their strides in [b, s, 4, 16]: a head 16 floats on, a row 64
    assert scores[7:11] == ["i64 16", "i64 1", "i64 64", "i64 1"] and scores[13:17] == ["i64 16", "i64 1", "i64 1", "i64 64"], scores
    assert context[13:17] == ["i64 16", "i64 1", "i64 64", "i64 1"] and context[19:] == ["i64 16", "i64 64"], context
    g = disc.compile(reordered, *specs_for([(("b", "s", 8), np.float32), (("s", 5), np.float32)], "b, s"))
    assert {k.kind for k in g.kernels} == {"copy"}
    for b, s in [(1, 1), (2, 7), (3, 33)]:
        rng = np.random.default_rng(b + s)
        q, k, v = (rng.standard_normal((b, s, 4, 16)).astype(np.float32) for _ in range(3))
        np.testing.assert_allclose(f(q, k, v), heads(q, k, v), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(h(q, k, v), scaled(q, k, v), rtol=1e-4, atol=1e-4)
        x, w = rng.standard_normal((b, s, 8)).astype(np.float32), rng.standard_normal((s, 5)).astype(np.float32)
        np.testing.assert_allclose(g(x, w), reordered(x, w), rtol=1e-5, atol=1e-5)


def test_an_op_with_attributes_on_a_transposed_tensor_moves_above_the_transpose():
    """A comparison (an elementwise op with an attribute, its direction) of a transposed tensor
    with a scalar runs before the transpose, attributes and all."""
    import jax.numpy as jnp
    from conftest import specs_for

    def masked(x):
        return jnp.where(jnp.swapaxes(x, 0, 1) > 0.5, 1.0, 0.0)

    f = disc.compile(masked, *specs_for([(("b", "s"), np.float32)], "b, s"))
    for b, s in [(1, 1), (3, 5)]:
        x = np.random.default_rng(b + s).random((b, s)).astype(np.float32)
        np.testing.assert_array_equal(f(x), masked(x))


def test_grouped_query_attention_reads_each_key_value_head_once_per_group():
    """Keys and values with 2 heads repeated for 8 query heads (`jnp.repeat`: a new dim broadcast
    to 4 and merged with the heads) are read where they are, each head serving 4 query heads
    (the GEMM's group of the operand): no copy, no loop. JAX puts the values first in the
    context's product ([b, heads, dim, q]); transposed to [b, q, heads, dim] the GEMM swaps its
    operands to write it in place. A broadcast that also expands another dim, or whose repeats
    are the outer part of the heads (`jnp.tile`), is not a group and is still copied."""
    import jax.numpy as jnp
    from conftest import gemm_call_args, specs_for

    def attention(q, k, v, tile=False, context="bqhd"):
        k, v = ((jnp.tile(t, (1, 1, 4, 1)) if tile else jnp.repeat(t, 4, axis=2)) for t in (k, v))
        p = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        return jnp.einsum(f"bhqk,bkhd->{context}", p, v)

    def shared(q, k, v):  # the batch broadcast too: one key/value sequence for every batch entry
        b = q.shape[0]
        return attention(q, jnp.broadcast_to(k, (b, *k.shape[1:])), jnp.broadcast_to(v, (b, *v.shape[1:])))

    def groups(f):  # each GEMM's groups of A and of B
        return [(c[8], c[14]) for c in gemm_call_args(f)]

    specs = specs_for([(("b", "s", 8, 16), np.float32), (("b", "s", 2, 16), np.float32), (("b", "s", 2, 16), np.float32)], "b, s")
    f = disc.compile(attention, *specs)
    values_first = disc.compile(lambda q, k, v: attention(q, k, v, context="bhdq"), *specs)
    assert f.kernels == [] and values_first.kernels == [], (f.kernels, values_first.kernels)
    assert groups(f) == [("i64 1", "i64 4")] * 2, groups(f)  # the values are B: swapped
    assert groups(values_first) == [("i64 1", "i64 4"), ("i64 4", "i64 1")], groups(values_first)
    tiled = disc.compile(lambda q, k, v: attention(q, k, v, tile=True), *specs)
    shared_specs = specs_for([(("b", "s", 8, 16), np.float32), ((1, "s", 2, 16), np.float32), ((1, "s", 2, 16), np.float32)], "b, s")
    g = disc.compile(shared, *shared_specs)
    for h in (tiled, g):
        assert h.kernels, "the repeated keys and values are materialised"
        assert groups(h) == [("i64 1", "i64 1")] * 2, groups(h)
    for b, s in [(1, 1), (2, 7), (3, 33)]:
        rng = np.random.default_rng(b + s)
        q = rng.standard_normal((b, s, 8, 16)).astype(np.float32)
        k, v = (rng.standard_normal((b, s, 2, 16)).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(f(q, k, v), attention(q, k, v), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(values_first(q, k, v), attention(q, k, v, context="bhdq"), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(tiled(q, k, v), attention(q, k, v, tile=True), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(g(q, k[:1], v[:1]), shared(q, k[:1], v[:1]), rtol=1e-4, atol=1e-4)


def test_a_gemm_operand_read_again_later_is_not_overwritten_in_between():
    """Two products read `a`; between them `b`, of `a`'s shape, is computed. Its buffer must not
    be `a`'s (the second product's read of `a` is at its call, not at the first one's)."""
    from conftest import specs_for

    def fn(q, k, k2):
        a = q * 0.35
        first = a @ k.T
        b = q * 0.3
        return first, b @ k.T, a @ k2.T

    f = disc.compile(fn, *specs_for([(("n", 8), np.float32), (("m", 8), np.float32), (("m", 8), np.float32)], "n, m"))
    for n, m in [(1, 2), (5, 3), (17, 9)]:
        rng = np.random.default_rng(n)
        q, k, k2 = (rng.standard_normal((d, 8)).astype(np.float32) for d in (n, m, m))
        for got, want in zip(f(q, k, k2), fn(q, k, k2)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_weight_broadcast_along_the_batch_is_read_once():
    """A batched product whose right operand is a weight broadcast along the batch (torch-mlir's
    `matmul` of [b, s, k] by [k, n]) reads the weight as it is, batch stride 0, instead of
    copying it per batch entry; when the left operand's entries follow each other in memory
    the batch becomes rows of one GEMM. Either way: no loop kernel, one GEMM call."""
    import jax.numpy as jnp
    from conftest import gemm_calls, specs_for

    def rows(x, w):  # [b, s, k] x broadcast [k, n]: one GEMM of b * s rows
        return jnp.einsum("bsk,bkn->bsn", x, jnp.broadcast_to(w, (x.shape[0],) + w.shape))

    def transposed(x, w):  # [b, k, s]: each batch entry transposed, b GEMMs reading the same weight
        return jnp.einsum("bks,bkn->bsn", x, jnp.broadcast_to(w, (x.shape[0],) + w.shape))

    for fn, x_dims in ((rows, (6, 24)), (transposed, (24, 6))):
        f = disc.compile(fn, *specs_for([(("b", *x_dims), np.float32), ((24, 40), np.float32)], "b"))
        assert f.kernels == [] and f.llvm_ir.count("call void @disc_ral_gemm_f32(") == 1, fn.__name__
        for b in (1, 3, 8):
            rng = np.random.default_rng(b)
            x, w = rng.standard_normal((b, *x_dims)).astype(np.float32), rng.standard_normal((24, 40)).astype(np.float32)
            before = gemm_calls(f)
            np.testing.assert_allclose(f(x, w), fn(x, w), rtol=1e-4, atol=1e-4)
            assert gemm_calls(f) - before == 1


def test_seq_first_projection_runs_as_long_gemms():
    """torch-mlir's linear on a seq-first view ([s, b, k], nn.MultiheadAttention's layout) is a
    product batched over s with the weight broadcast: s GEMMs of b rows each. The RAL swaps
    entries and rows when there are more entries (b GEMMs of s rows), with the epilogue after."""
    import jax.numpy as jnp
    from conftest import gemm_calls, specs_for

    def fn(x, w, bias):
        xs = x.transpose(1, 0, 2)
        return jnp.maximum(jnp.matmul(xs, jnp.broadcast_to(w, (xs.shape[0],) + w.shape)) + bias, 0.0)

    f = disc.compile(fn, *specs_for([(("b", "s", 16), np.float32), ((16, 24), np.float32), ((24,), np.float32)], "b, s"))
    assert f.llvm_ir.count("call void @disc_ral_gemm_f32") == 1
    for b, s in [(1, 37), (3, 5), (2, 1), (6, 2)]:
        rng = np.random.default_rng(b * s)
        x, w, bias = (rng.standard_normal(shape).astype(np.float32) for shape in ((b, s, 16), (16, 24), (24,)))
        before = gemm_calls(f)
        np.testing.assert_allclose(f(x, w, bias), fn(x, w, bias), rtol=1e-5, atol=1e-5)
        assert gemm_calls(f) - before == 1


def test_constant_whole_powers_are_products():
    """`x ** 3.0` (GELU-tanh's cube, a `stablehlo.power` by a constant) is multiplications, not a
    scalar libm `powf` per element; other exponents keep `powf`."""
    import jax.numpy as jnp
    from conftest import specs_for

    cube = disc.compile(lambda x: jnp.power(x, 3.0) + jnp.power(x, 2.0), *specs_for([(("n",), np.float32)], "n"))
    other = disc.compile(lambda x: jnp.power(x, 2.5), *specs_for([(("n",), np.float32)], "n"))
    assert "@llvm.pow." not in cube.llvm_ir and "@llvm.pow." in other.llvm_ir  # becomes a call of powf
    x = np.random.default_rng(0).uniform(-3, 3, 37).astype(np.float32)
    np.testing.assert_allclose(cube(x), x ** 3 + x ** 2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(other(np.abs(x)), np.abs(x) ** 2.5, rtol=1e-6)


def test_elementwise_loops_over_contiguous_dims_run_as_one():
    """An elementwise loop whose buffers are walked as one run of memory over its trailing dims
    (`loops.flatten_contiguous_loops`) vectorises over all of them, not row by row: over [m, n]
    one dim, and a per-channel operand of [n, c, h, w] leaves h and w merged. A transposed read,
    or an operand broadcast along the rows or the columns, keeps the dims apart. Every shape
    gives jax.jit's values (rows of 1, 3, 24, 1000 elements; one element)."""
    import jax
    import jax.numpy as jnp
    from conftest import specs_for
    from jax import export

    def axpy(x, y):
        return x * 1.5 + y

    def channels(x, s, b):
        return jnp.maximum(x * s[None, :, None, None] + b[None, :, None, None], 0)

    def transposed(x, y):
        return x.T + y

    def rows(x, y):
        return x + y[:, None]

    def columns(x, y):
        return x * y[None, :]

    cases = [(axpy, [(("m", "n"), np.float32)] * 2, 1, [[(m, n)] * 2 for m, n in [(1, 1), (5, 3), (7, 24), (3, 1), (1000, 1)]]),
             (transposed, [(("n", "m"), np.float32), (("m", "n"), np.float32)], 2, [[(3, 5), (5, 3)], [(24, 7), (7, 24)]]),
             (rows, [(("m", "n"), np.float32), (("m",), np.float32)], 2, [[(5, 3), (5,)], [(7, 24), (7,)]]),
             (columns, [(("m", "n"), np.float32), (("n",), np.float32)], 2, [[(5, 3), (3,)], [(7, 24), (24,)]])]
    for fn, shapes, dims, runs in cases:
        f = disc.compile(fn, *specs_for(shapes, "m, n"))
        [kernel] = f.kernels
        assert kernel.parallel_dims == dims, (fn.__name__, str(kernel))
        for run in runs:
            args = [np.random.default_rng(len(run) + i).standard_normal(shape).astype(np.float32) for i, shape in enumerate(run)]
            np.testing.assert_allclose(f(*args), fn(*args), rtol=1e-6, atol=1e-6)
    n, h, w = export.symbolic_shape("n, h, w")
    spec = jax.ShapeDtypeStruct((n, 64, h, w), jnp.float32)
    vec = jax.ShapeDtypeStruct((64,), jnp.float32)
    f = disc.compile(channels, spec, vec, vec)
    for shape in [(2, 64, 7, 7), (1, 64, 1, 1), (3, 64, 5, 9)]:
        x, s, b = (np.random.default_rng(i).standard_normal(sh).astype(np.float32) for i, sh in enumerate([shape, (64,), (64,)]))
        np.testing.assert_allclose(f(x, s, b), channels(x, s, b), rtol=1e-6, atol=1e-6)


def test_long_loop_bodies_are_interleaved_and_every_row_length_is_computed():
    """Innermost float32 loops with long bodies (exact GELU's erfc, tanh's call) get LLVM's
    interleave count 4 (`loops.interleave_long_loops`); a short body (x * y + x) and float64 loops
    are left to LLVM's own choice.
    Every row length gives the right values: the interleaved vector loop (32 elements per
    iteration with AVX2), its full-width remainder loop and the scalar rest."""
    import jax
    from conftest import specs_for

    def erf_gelu(x, y):
        return jax.nn.gelu(x * 1.5 + y, approximate=False)

    def tanh_gelu(x, y):
        return jax.nn.gelu(x + y, approximate=True)

    def short(x, y):
        return x * y + x

    interleaved = re.compile(r'!(\d+) = !\{!"llvm.loop.interleave.count", i32 4\}')
    for fn, dtype in ((erf_gelu, np.float32), (tanh_gelu, np.float32), (short, np.float32), (erf_gelu, np.float64)):
        f = disc.compile(fn, *specs_for([(("b", "s"), dtype), (("b", "s"), dtype)], "b, s"))
        # float64 loops are not interleaved: the remainders' forced vector width is float32's
        assert bool(interleaved.search(f.llvm_ir)) == (fn is not short and dtype == np.float32), (fn.__name__, dtype)
        for s in (1, 7, 8, 15, 31, 32, 33, 40, 64, 100, 1000):
            x, y = (np.random.default_rng(s + i).standard_normal((3, s)).astype(dtype) for i in range(2))
            np.testing.assert_allclose(f(x, y), fn(x, y), rtol=2e-6, atol=1e-6, err_msg=f"{fn.__name__}, row length {s}")


def test_heavy_row_passes_prefetch_the_next_row_and_every_row_is_computed():
    """Softmax and log-softmax (a heavy exp pass after the max) prefetch the next row's input in
    strips of their exp pass, in rows of PREFETCH_MIN_ROW elements or more
    (`loops.prefetch_next_rows`); layer norm (light passes) does not. Every row length and row
    count gives the right values: strips and their remainders, the last row (whose next row is
    itself), leading dims collapsed into rows."""
    import jax
    from conftest import specs_for

    from disc_stablehlo.passes import loops

    def softmax(x):
        return jax.nn.softmax(x, axis=-1)

    def log_softmax(x):
        return jax.nn.log_softmax(x, axis=-1)

    def layer_norm(x):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    for fn in (softmax, log_softmax, layer_norm):
        f = disc.compile(fn, *specs_for([(("b", "h", "s"), np.float32)], "b, h, s"))
        assert ("@llvm.prefetch" in f.llvm_ir) == (fn is not layer_norm), fn.__name__
        for b, h, s in ((1, 1, 1), (1, 3, 7), (2, 1, 255), (1, 2, 1023), (3, 1, 1024), (1, 3, 1025), (2, 2, 2000)):
            x = np.random.default_rng(s).standard_normal((b, h, s)).astype(np.float32) * 3
            np.testing.assert_allclose(f(x), fn(x), rtol=2e-5, atol=2e-6, err_msg=f"{fn.__name__} {(b, h, s)}")
    assert loops.PREFETCH_MIN_ROW <= 1025 and loops.PREFETCH_STRIP < 2000


def test_booleans_in_memory_are_accessed_as_bytes():
    """LLVM vectorises no loop that loads or stores an i1, so booleans in memory are read and
    written as their bytes; any nonzero byte is true, as numpy reads a bool."""
    import jax
    import jax.numpy as jnp
    from jax import export

    (n,) = export.symbolic_shape("n")
    f = disc.compile(lambda m, x: (jnp.where(m, x, -jnp.inf), ~m), jax.ShapeDtypeStruct((n,), jnp.bool_),
                     jax.ShapeDtypeStruct((n,), jnp.float32))
    assert " load i1," not in f.llvm_ir and " store i1 " not in f.llvm_ir
    raw = np.array([0, 1, 2, 255, 0, 7, 1, 0, 16] * 5, np.uint8)
    x = np.arange(raw.size, dtype=np.float32)
    selected, negated = f(raw.view(np.bool_), x)
    np.testing.assert_array_equal(selected, np.where(raw != 0, x, -np.inf))
    np.testing.assert_array_equal(negated, raw == 0)


def test_converted_scalar_constants_fold():
    """Converts (then reshapes) of splat constants, as torch-mlir emits for a model's Python
    scalars, fold as `stablehlo.convert` converts: float to float rounds, integers wrap, floats
    truncate toward zero, nonzero is true (test_torch_models checks the kernels it saves)."""
    f = disc.compile("""func.func @main(%x: tensor<?xf32>) -> (tensor<?xf32>, tensor<i8>, tensor<i32>, tensor<i1>) {
      %lo64 = arith.constant dense<-1.5> : tensor<1xf64>
      %lo1 = stablehlo.convert %lo64 : (tensor<1xf64>) -> tensor<1xf32>
      %lo = stablehlo.reshape %lo1 : (tensor<1xf32>) -> tensor<f32>
      %hi64 = arith.constant dense<3> : tensor<1xi64>
      %hi1 = stablehlo.convert %hi64 : (tensor<1xi64>) -> tensor<1xf32>
      %hi = stablehlo.reshape %hi1 : (tensor<1xf32>) -> tensor<f32>
      %y = stablehlo.clamp %lo, %x, %hi : (tensor<f32>, tensor<?xf32>, tensor<f32>) -> tensor<?xf32>
      %w = stablehlo.constant dense<300> : tensor<i32>
      %w8 = stablehlo.convert %w : (tensor<i32>) -> tensor<i8>
      %t = stablehlo.constant dense<-2.7> : tensor<f32>
      %ti = stablehlo.convert %t : (tensor<f32>) -> tensor<i32>
      %tb = stablehlo.convert %t : (tensor<f32>) -> tensor<i1>
      return %y, %w8, %ti, %tb : tensor<?xf32>, tensor<i8>, tensor<i32>, tensor<i1>
    }""")
    x = np.linspace(-4, 4, 17, dtype=np.float32)
    y, w8, ti, tb = f(x)
    np.testing.assert_array_equal(y, np.clip(x, -1.5, 3))
    assert (w8, ti, tb) == (44, -2, True)


def test_loops_capturing_complex_values_run_on_the_thread_pool():
    """A loop that uses a complex value defined before it (the zero a complex product starts
    from) is a kernel like any other (the value passed as its two parts): it runs on the thread
    pool, with the right result."""
    import jax
    import jax.numpy as jnp

    b = jax.export.symbolic_shape("b")[0]
    rng = np.random.default_rng(0)
    for dt in (jnp.complex64, jnp.complex128):
        def fn(a, w):
            return a.astype(dt) @ w

        f = disc.compile(fn, jax.ShapeDtypeStruct((b, 3), jnp.int8), jax.ShapeDtypeStruct((3, 6), dt))
        product = next(k for k in f.kernels if "complex.mul" in k.ops)
        a = rng.integers(-100, 100, (5000, 3)).astype(np.int8)
        w = (rng.standard_normal((3, 6)) + 1j * rng.standard_normal((3, 6))).astype(dt)
        before = f.stats()[product.name]["pool"]
        np.testing.assert_allclose(f(a, w), a.astype(dt) @ w, rtol=1e-5 if dt == jnp.complex64 else 1e-12)
        assert f.stats()[product.name]["pool"] == before + 1
