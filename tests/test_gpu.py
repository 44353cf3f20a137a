"""The GPU targets without a GPU: every JAX test program compiles for sm_80 and sm_90 (ptxas
accepts the PTX) and for gfx90a and gfx942 (ld.lld links the HSACO), and the generated host code runs against a fake CUDA driver and cuBLAS
(ral_runtime/tests/fake_cuda.c: memory is host memory, launches are recorded, not run, GEMMs
are computed) so the grids, the kernel parameters and the library calls are checked at several
shapes. With a GPU (`gpu` marker), programs run on it and match jax.jit."""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import concrete, random_array, specs_for
from test_jax_programs import CASES

import disc_stablehlo as disc
from disc_stablehlo import artifact
from disc_stablehlo.passes.gpu import BLOCK, CHUNK, COLUMN_GROUPS, LANES, REDUCTION_BLOCK, REGISTER_ITERATIONS, UNROLL, WARP, WARP_ROWS
from disc_stablehlo.runtime import CompiledFunction, Executable, Runtime
from disc_stablehlo.targets import cuda

ROOT = Path(__file__).resolve().parents[1]
needs_ptxas = pytest.mark.skipif(cuda.ptxas_path() is None, reason="ptxas (CUDA toolkit) not installed")


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_jax_program_compiles_for_cuda(arch, fake_cuda, monkeypatch, tmp_path):
    """One compilation per program and GPU; ptxas checks each module (a rejected PTX is a
    CompileError). The host code runs on the fake driver at the program's three shapes: it
    returns, or raises the package's error where it reads back a size a kernel computes (the
    fake runs no kernel: its memory stays 0); it never faults (the fake's device memory is not
    the host's) nor divides by zero."""
    rng = np.random.default_rng(0)
    for name, fn, args, dims, envs, _ in CASES:
        f = disc.compile(fn, *specs_for(args, dims), target=f"cuda:{arch}")
        header = f._exe.artifact.header
        assert header["target"]["chip"] == arch, name
        assert (header["info"]["device_code"]["cubin_bytes"] > 0) == bool(f.kernels), name  # a cubin only with kernels
        assert all(k.name.startswith("__disc_gpu_") for k in f.kernels), name
        (tmp_path / name).mkdir()
        on_fake = _on_fake_gpu(f, fake_cuda, monkeypatch, tmp_path / name)
        for env in envs:
            try:
                on_fake(*[random_array(concrete(shape, env), dtype, rng) for shape, dtype in args])
            except disc.ShapeError:
                pass


@needs_ptxas
def test_each_kernel_is_compiled_alone_once_per_structure(monkeypatch):
    """Each kernel is compiled to PTX alone (`codegen.ptx_part`), under a symbol its structure
    decides, and kept (`codegen.kernel_cache`): the same function compiled again compiles no
    kernel and runs no ptxas (the cubin of the same PTX is kept too); another function with the
    same softmax compiles only its other kernel. Kernels of one structure under two names (their
    shared memory named after each) are compiled once, and the PTX holds both under their own
    names, one header, which ptxas accepts as one module."""
    from disc_stablehlo.targets import codegen, get_target

    monkeypatch.setenv("DISC_COMPILE_WORKER", "0")  # this process's kernel cache
    monkeypatch.delenv("DISC_CACHE_DIR", raising=False)
    monkeypatch.setattr(codegen, "kernel_cache", codegen.KernelCache())
    jobs, assembled, device_ir = [], [], []
    compile_parts, run_ptxas, emit_ptx = codegen.compile_parts, cuda._run_ptxas, cuda.emit_ptx
    monkeypatch.setattr(codegen, "compile_parts", lambda js: (jobs.extend(k for k, _ in js if k == "ptx"), compile_parts(js))[1])
    monkeypatch.setattr(cuda, "_run_ptxas", lambda *a: (assembled.append(a), run_ptxas(*a))[1])
    monkeypatch.setattr(cuda, "emit_ptx", lambda text, *a: (device_ir.append(text), emit_ptx(text, *a))[1])
    b = jax.export.symbolic_shape("b")[0]
    spec = jax.ShapeDtypeStruct((b, 256), jnp.float32)
    softmax = disc.compile(lambda x: jax.nn.softmax(x, axis=-1), spec, target="cuda")
    names = list(dict.fromkeys(k.name for k in softmax.kernels))
    assert len(jobs) == len(names) >= 2 and len(assembled) == 1
    jobs.clear(), assembled.clear()
    again = disc.compile(lambda x: jax.nn.softmax(x, axis=-1), spec, target="cuda")
    assert not jobs and not assembled and _ptx_entries(again) == _ptx_entries(softmax)
    both = disc.compile(lambda x, y: (jax.nn.softmax(x, axis=-1), jnp.tanh(y)), spec, jax.ShapeDtypeStruct((3, b), jnp.float32),
                        target="cuda")
    assert len(set(k.name for k in both.kernels)) == len(names) + 1 and len(jobs) == 1
    jobs.clear()
    block = next(k.name for k in softmax.kernels if k.version.startswith("block per row"))
    shared = [line for line in device_ir[0].splitlines() if line.startswith(f"@__wg_{block}_")]
    assert shared  # its shared memory, named after it
    copy = "\n".join([*shared, codegen.Functions(device_ir[0]).definitions[block]]).replace(block, "__disc_gpu_99")
    ptx = cuda.emit_ptx(device_ir[0] + copy, get_target("cuda"), [block, "__disc_gpu_99"])
    assert not jobs and ptx.count(".version") == 1
    assert re.findall(r"\.visible \.entry (\w+)\(", ptx) == [block, "__disc_gpu_99"]
    assert cuda.assemble(ptx, get_target("cuda"))


@pytest.mark.parametrize("chip", ["gfx90a", "gfx942"])
def test_every_jax_program_compiles_for_rocm(chip):
    """ROCm code objects: llvmlite's AMDGPU back end, linked by ld.lld into an HSACO with no
    undefined symbol (the device-library functions the kernels call are the compiler's own)."""
    for name, fn, args, dims, _, _ in CASES:
        f = disc.compile(fn, *specs_for(args, dims), target=f"rocm:{chip}")
        header = f._exe.artifact.header
        assert header["target"]["chip"] == chip and header["info"]["device_code"]["hsaco_bytes"] > 0, name


@needs_ptxas
@pytest.mark.parametrize("target", ["cuda:sm_90", "rocm:gfx942"])
def test_bit_counts_of_every_integer_width_compile(target):
    """popcnt and count_leading_zeros, which the GPU lowerings leave to the caller: LLVM's
    intrinsics, narrow integers counted in 32 bits."""
    for dtype in (jnp.int8, jnp.uint16, jnp.int32, jnp.int64):
        f = disc.compile(lambda x: (jax.lax.population_count(x), jax.lax.clz(x)), jax.ShapeDtypeStruct((16,), dtype), target=target)
        assert any({"math.ctpop", "math.ctlz"} <= set(k.ops) for k in f.kernels), (dtype, f.kernels)


def test_rocm_math_comes_from_the_device_library_or_is_named_missing(monkeypatch):
    """Without ROCm's device library, f32 math is the compiler's own (expanded, or AMDGPU
    intrinsics) and f64 math a CompileError naming the functions and where the library is looked
    for; with it (ocml.bc: $DISC_ROCM_DEVICE_LIBS, set by dev.py's test run), every math function
    links in and the code object has no undefined symbol."""
    import jax

    from disc_stablehlo.targets import rocm_math_library

    library = rocm_math_library()
    specs = [jax.ShapeDtypeStruct((8,), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float64)]

    def fn(x, y):
        return jnp.exp(x) * jnp.arctan2(x, x), jnp.log1p(y) + jnp.sin(y)

    monkeypatch.setenv("DISC_ROCM_DEVICE_LIBS", "")
    monkeypatch.setenv("ROCM_PATH", "/nonexistent")
    if rocm_math_library():
        pytest.skip("this machine has ROCm at /opt/rocm: the library is always found")
    disc.compile(lambda x: jnp.exp(x) * jnp.tanh(x), specs[0], target="rocm:gfx942")
    with pytest.raises(disc.CompileError, match="__ocml_log1p_f64.*DISC_ROCM_DEVICE_LIBS"):
        disc.compile(fn, *specs, target="rocm:gfx942")
    if not library:
        pytest.skip("no ocml.bc (dev.py test fetches one into build/rocm-device-libs)")
    monkeypatch.setenv("DISC_ROCM_DEVICE_LIBS", str(Path(library).parent))
    f = disc.compile(fn, *specs, target="rocm:gfx942")
    assert f._exe.artifact.header["info"]["device_code"]["hsaco_bytes"] > 0


def _fake(folder: Path, api: str) -> str:
    path = folder / f"libfake_{api}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", *(["-DFAKE_HIP"] if api == "hip" else []), "-o", str(path),
                    str(ROOT / "ral_runtime" / "tests" / "fake_cuda.c"), "-lpthread"], check=True)
    return str(path)


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory) -> str:
    return _fake(tmp_path_factory.mktemp("fake"), "cuda")


@pytest.fixture(scope="module")
def fake_hip(tmp_path_factory) -> str:
    return _fake(tmp_path_factory.mktemp("fake"), "hip")


def _on_fake_gpu(f: CompiledFunction, fake: str, monkeypatch, tmp_path) -> CompiledFunction:
    """`f`'s artifact loaded on a runtime of its own whose GPU is the fake driver (CUDA's or HIP's,
    as the artifact's target is)."""
    for var in ("DISC_CUDA_DRIVER", "DISC_CUBLAS", "DISC_HIP_RUNTIME", "DISC_HIPBLAS"):
        monkeypatch.setenv(var, fake)
    f.save(tmp_path / "f.disc")
    return CompiledFunction(Executable(artifact.read(str(tmp_path / "f.disc")), Runtime(1)), compile_count=0)


class Launches:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.lib.fake_cuda_count.restype = ctypes.c_int64
        self.lib.fake_cuda_count.argtypes = [ctypes.c_char_p]
        self.lib.fake_cuda_host.restype = ctypes.c_void_p

    def reset(self) -> None:
        self.lib.fake_cuda_reset()

    def count(self, what: str) -> int:
        return self.lib.fake_cuda_count(what.encode())

    def host(self, device: int) -> int:
        """The host address of the fake's device memory (a device address is no host address)."""
        return self.lib.fake_cuda_host(ctypes.c_void_p(device))

    def __iter__(self):
        name, grid, block, params = ctypes.create_string_buffer(64), (ctypes.c_int64 * 3)(), (ctypes.c_int64 * 3)(), (ctypes.c_int64 * 16)()
        for i in range(self.lib.fake_cuda_launch_count()):
            n = self.lib.fake_cuda_launch(i, name, 64, grid, block, params)
            yield name.value.decode(), list(grid), list(block), list(params)[:n]


def _lanes(inner: int) -> int:
    """The threads of a per-element kernel along an innermost dim of `inner` iterations: tiles of
    LANES threads (fewer where the dim is narrower), CHUNK iterations each."""
    lanes = min(LANES, -(-inner // CHUNK))
    return -(-inner // (lanes * CHUNK)) * lanes


@pytest.mark.parametrize("target", ["cuda", "rocm:gfx942"])
def test_host_code_launches_grids_computed_from_the_run_time_dims(target, fake_cuda, fake_hip, monkeypatch, tmp_path):
    """A GEMM (through cuBLAS) and elementwise and reduction kernels after it, at four batch
    sizes: one launch per kernel, one thread per CHUNK iterations of the loop's innermost dim (in
    tiles of LANES threads, blocks of BLOCK; for the row sum a block per row, or on CUDA a warp per
    row from WARP_ROWS rows; for the column mean a block per LANES columns), and the kernel
    parameters carry the run-time dims."""
    b = jax.export.symbolic_shape("b")[0]

    def fn(x, w):
        return jnp.tanh(x @ w) * 2 + x.sum(-1, keepdims=True), x.mean(0)

    fake = fake_cuda if target == "cuda" else fake_hip
    f = _on_fake_gpu(disc.compile(fn, jax.ShapeDtypeStruct((b, 64), jnp.float32), jax.ShapeDtypeStruct((64, 32), jnp.float32),
                                  target=target), fake, monkeypatch, tmp_path)
    launches = Launches(fake)
    kinds = {k.name: k.kind for k in f.kernels}
    versions = {k.name: k.version for k in f.kernels}
    rows = {"block per row", "warp per row"} if target == "cuda" else {"block per row"}  # CUDA: a version for many rows
    assert rows | {"column tiles"} <= set(versions.values())
    for n in (1, 5, 1000, WARP_ROWS + 5):
        launches.reset()
        f(np.ones((n, 64), np.float32), np.ones((64, 32), np.float32))
        seen = list(launches)
        assert [kinds[name] for name, *_ in seen] == [k.kind for k in f.kernels if k.version != "warp per row"]
        assert launches.count("gemms") == 1
        for name, grid, block, params in seen:
            if versions[name] == "block per row":  # the row sum: a block of threads per row
                assert block == [REDUCTION_BLOCK, 1, 1] and grid == [n, 1, 1] and (n < WARP_ROWS or target != "cuda"), (name, n)
            elif versions[name] == "warp per row":  # ... or a warp per row, BLOCK // WARP rows a block
                assert block == [BLOCK, 1, 1] and grid == [-(-n * WARP // BLOCK), 1, 1] and n >= WARP_ROWS, (name, n)
            elif versions[name] == "column tiles":  # the column mean: a block of COLUMN_GROUPS warps per LANES columns
                assert block == [LANES * COLUMN_GROUPS, 1, 1] and grid == [64 // LANES, 1, 1], (name, n)
            else:  # a thread per CHUNK elements of the innermost dim (of the result, or of the rows), in tiles of LANES threads
                threads = n * _lanes(32) if kinds[name] == "elementwise" else _lanes(n)
                assert block == [BLOCK, 1, 1] and grid == [-(-threads // BLOCK), 1, 1], (name, n)
            assert n in params, (name, n, params)  # the loop bound, a dim of a buffer


def test_gemms_run_through_cublas_on_device_buffers(fake_cuda, monkeypatch, tmp_path):
    """The fake cuBLAS computes on its (host) memory: the strided and batched layouts the
    compiler passes come out right, and results come back through device-to-host copies."""
    s = jax.export.symbolic_shape("s")[0]

    def fn(q, k):  # [2, s, 3, 8] x [2, s, 3, 8] -> heads in the middle: strided batch views
        return jnp.einsum("bqhd,bkhd->bhqk", q, k)

    f = _on_fake_gpu(disc.compile(fn, *[jax.ShapeDtypeStruct((2, s, 3, 8), jnp.float32)] * 2, target="cuda"),
                     fake_cuda, monkeypatch, tmp_path)
    rng = np.random.default_rng(0)
    for n in (1, 7):
        q, k = (rng.standard_normal((2, n, 3, 8)).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(f(q, k), np.einsum("bqhd,bkhd->bhqk", q, k), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target, api", [("cuda:sm_90", "cuda"), ("rocm:gfx942", "hip")])
def test_the_grouped_gemm_reads_its_offsets_back_and_runs_a_product_per_group(target, api, fake_cuda, fake_hip, monkeypatch, tmp_path):
    """A mixture-of-experts layer's grouped GEMM (transformers' `grouped_mm_fallback`, the
    experts' weights [G, N, K] read transposed) on the GPU: the offsets copied back to the host,
    one BLAS product per group that has rows, the rows past the last offset zeroed on the device;
    offsets that decrease fail the call before any product."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers.integrations.moe", reason="transformers registers its grouped GEMM there")

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 8, 16))

        def forward(self, x, offs):
            return torch.ops.transformers.grouped_mm_fallback(x, self.w.transpose(-2, -1), offs)

    model = Experts().eval()
    offs = torch.tensor([2, 2, 6])  # int64: the fake driver does not run kernels, so none may widen them
    compiled = disc.compile(model, (torch.randn(6, 16), offs), dynamic_shapes={"x": {0: torch.export.Dim("rows")}, "offs": None},
                            target=target)
    assert not compiled.kernels
    fake = fake_cuda if api == "cuda" else fake_hip
    f, launches = _on_fake_gpu(compiled, fake, monkeypatch, tmp_path), Launches(fake)
    for n, groups in [(6, [2, 2, 6]), (9, [0, 4, 6]), (3, [0, 0, 0])]:
        x, offs = torch.randn(n, 16), torch.tensor(groups)
        launches.reset()
        with torch.no_grad():
            torch.testing.assert_close(f(x, offs), model(x, offs))
        assert launches.count("gemms") == sum(b > a for a, b in zip([0] + groups, groups))
        assert launches.count("memsets") == (groups[-1] < n)
    launches.reset()
    with pytest.raises(disc.RuntimeFailure, match="grouped GEMM: offset 1 is 2, after 3"):
        f(torch.randn(6, 16), torch.tensor([3, 2, 6]))
    assert launches.count("gemms") == 0


def test_constants_the_kernels_read_are_copied_to_the_device_once(fake_cuda, monkeypatch, tmp_path):
    """A constant array read by a kernel (and one only the host reads: a reshape's shape) in a
    module compiled for the GPU: the first call copies the kernel's constant to the device, later
    calls reuse the copy."""
    b = jax.export.symbolic_shape("b")[0]
    table = np.array([1.5, -2.0, 3.0, 0.25], np.float32)
    f = _on_fake_gpu(disc.compile(lambda x: (x * table).reshape(-1, 2), jax.ShapeDtypeStruct((b, 4), jnp.float32), target="cuda"),
                     fake_cuda, monkeypatch, tmp_path)
    launches = Launches(fake_cuda)
    copies = []
    for n in (3, 3, 5):
        launches.reset()
        assert f(np.ones((n, 4), np.float32)).shape == (2 * n, 2)
        copies.append(launches.count("h2d"))  # the argument, and the constant the first time
    assert copies == [2, 1, 1]


def test_a_failed_device_allocation_ends_the_call_and_the_next_call_works(fake_cuda, monkeypatch, tmp_path):
    b = jax.export.symbolic_shape("b")[0]
    f = _on_fake_gpu(disc.compile(lambda x, w: x @ w, jax.ShapeDtypeStruct((b, 4), jnp.float32), jax.ShapeDtypeStruct((4, 4), jnp.float32),
                                  target="cuda"), fake_cuda, monkeypatch, tmp_path)
    launches = Launches(fake_cuda)
    x, w = np.arange(12, dtype=np.float32).reshape(3, 4), np.eye(4, dtype=np.float32)[::-1].copy()
    np.testing.assert_array_equal(f(x, w), x[:, ::-1])  # the GPU attached
    exe = f._exe
    big, dw = exe.runtime.to_device(np.ones((5000, 4), np.float32)), exe.runtime.to_device(w)  # arguments in device memory
    launches.reset()
    for _ in range(2):  # the RAL retries once after emptying its cache
        launches.lib.fake_cuda_fail_next_alloc()
    with pytest.raises(disc.RuntimeFailure, match="out of memory allocating 80000 bytes on the GPU"):
        exe.run([big, dw])  # the result is larger than any cached block: the driver is asked
    assert launches.count("gemms") == 0  # nothing ran after the failed allocation
    np.testing.assert_array_equal(f(x, w), x[:, ::-1])


def test_a_reshape_to_sizes_the_host_computes_reads_them_on_the_host(fake_cuda, monkeypatch, tmp_path):
    """A dynamic_reshape of an argument to sizes built from scalar arguments (a shape tensor only
    the host code touches, on its stack): the host reads the sizes and passes them to the copy's
    kernel as values. (The kernel used to rebuild the reshape and read the host's stack: an
    illegal address on a GPU. A kernel that would read host memory is now a CompileError.)"""
    program = """func.func public @main(%n: tensor<i64>, %m: tensor<i64>, %x: tensor<?x?x5x7xf32>) -> tensor<?x?x7xf32> {
      %0 = stablehlo.convert %n : (tensor<i64>) -> tensor<i32>
      %1 = stablehlo.reshape %0 : (tensor<i32>) -> tensor<1xi32>
      %five = stablehlo.constant dense<5> : tensor<i64>
      %m5 = stablehlo.multiply %m, %five : tensor<i64>
      %2 = stablehlo.convert %m5 : (tensor<i64>) -> tensor<i32>
      %3 = stablehlo.reshape %2 : (tensor<i32>) -> tensor<1xi32>
      %4 = stablehlo.constant dense<7> : tensor<1xi32>
      %5 = stablehlo.concatenate %1, %3, %4, dim = 0 : (tensor<1xi32>, tensor<1xi32>, tensor<1xi32>) -> tensor<3xi32>
      %6 = stablehlo.dynamic_reshape %x, %5 : (tensor<?x?x5x7xf32>, tensor<3xi32>) -> tensor<?x?x7xf32>
      return %6 : tensor<?x?x7xf32>
    }"""
    f = _on_fake_gpu(disc.compile(program, target="cuda"), fake_cuda, monkeypatch, tmp_path)
    launches = Launches(fake_cuda)
    for n, m in ((2, 3), (3, 4)):
        launches.reset()
        f(np.int64(n), np.int64(m), np.ones((n, m, 5, 7), np.float32))
        (_, _, _, params), = launches
        assert n in params and 5 * m in params, params  # the result's sizes, as the host read them


def _ptx_entries(f: CompiledFunction) -> dict[str, str]:
    """Each kernel's PTX (the module the shared object carries), by name."""
    data = bytes(f._exe.artifact.section("object"))
    start = data.index(b"// Generated by LLVM NVPTX")
    ptx = data[start:data.index(b"\0", start)].decode()
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)
    return dict(zip(parts[1::2], parts[2::2]))


def test_rows_and_columns_share_their_reductions_through_shuffles_and_shared_memory():
    """A softmax's rows: a block per row (`gpu.all_reduce`: shared memory and barriers) and a
    warp per row (xor shuffles; no barrier at all: a thread reads back only the elements it
    wrote, and the row's max and sum are kept, not stored and read back); a column sum: a block
    per tile of columns, its warps' parts through shared memory between two barriers. Each
    thread's loops are unrolled: UNROLL loads between two labels."""
    b = jax.export.symbolic_shape("b")[0]
    f = disc.compile(lambda x: (jax.nn.softmax(x, axis=-1), x.sum(0)), jax.ShapeDtypeStruct((b, 256), jnp.float32), target="cuda")
    names = {k.version.split(",")[0]: k.name for k in f.kernels}  # rows of 256: held in registers
    ptx = _ptx_entries(f)
    warp, block, column = ptx[names["warp per row"]], ptx[names["block per row"]], ptx[names["column tiles"]]
    assert "shfl.sync.bfly" in warp and "bar.warp.sync" not in warp and "bar.sync" not in warp
    assert "bar.sync" in block and "bar.warp.sync" not in block
    assert "st.shared" in column and "ld.shared" in column and column.count("bar.sync") >= 2
    for kernel in (warp, column):
        assert max(part.count("ld.global") for part in re.split(r"\n\$L\w+:", kernel)) >= UNROLL


def test_rows_that_fit_are_held_in_registers_in_the_kernel_the_host_code_picks(fake_cuda, monkeypatch, tmp_path):
    """A softmax over rows of any length: besides the loops' kernels, one per count of elements
    a thread holds in registers (REGISTER_ITERATIONS), each reading its row once and writing it
    once (the loops' kernels read the scores twice and the exponentials back); the host code
    launches the fewest that hold the row, the loops' kernel for longer rows. A row of a length
    known at compile time gets the one version it needs."""
    b, n = jax.export.symbolic_shape("b, n")
    f = disc.compile(lambda x: jax.nn.softmax(x, axis=-1), jax.ShapeDtypeStruct((b, n), jnp.float32), target="cuda")
    ptx = _ptx_entries(f)
    versions = {k.name: k.version for k in f.kernels}
    for schedule in ("warp", "block"):
        assert f"{schedule} per row" in versions.values()
        for count in REGISTER_ITERATIONS[schedule]:
            (name,) = [k for k, v in versions.items() if v == f"{schedule} per row, {count} a thread in registers"]
            # twice each: the grid-stride loop's 32-bit and 64-bit index versions; besides the row,
            # one thread stores its max and sum (their initial values and their totals: 4 stores)
            assert ptx[name].count("ld.global") == 2 * count and ptx[name].count("st.global") == 2 * (count + 4), (name, count)
    f = _on_fake_gpu(f, fake_cuda, monkeypatch, tmp_path)
    launches = Launches(fake_cuda)
    for rows, length, want in [(5, 100, "block per row, 8 a thread in registers"), (5, 1000, "block per row, 8 a thread in registers"),
                               (5, 1025, "block per row"), (WARP_ROWS, 100, "warp per row, 4 a thread in registers"),
                               (WARP_ROWS, 200, "warp per row, 8 a thread in registers"), (WARP_ROWS, 257, "warp per row")]:
        launches.reset()
        f(np.zeros((rows, length), np.float32))
        assert [versions[name] for name, *_ in launches] == [want], (rows, length)
    g = disc.compile(lambda x: jax.nn.softmax(x, axis=-1), jax.ShapeDtypeStruct((b, 768), jnp.float32), target="cuda")
    assert sorted(k.version for k in g.kernels) == ["block per row, 8 a thread in registers", "warp per row"]  # 768: 24 a warp's thread


@pytest.mark.parametrize("read", ["own", "reversed", "view"])
def test_a_row_phase_reading_what_other_threads_wrote_keeps_its_barrier(read):
    """Between a row's phases, a barrier only where a later phase may touch an element another
    thread wrote: a loop reading the row backwards after one that wrote it forwards needs one,
    and so does one reading it through a view of the buffer (views of one buffer may overlap);
    the same loop reading forwards (each thread its own elements) does not."""
    from torch_mlir import ir

    from disc_stablehlo.mlir_support import new_context
    from disc_stablehlo.passes import gpu

    index = {"own": "%i", "reversed": "%j", "view": "%i"}[read]
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(f"""
        func.func private @body(%r: index, %n: index, %x: memref<?x?xf32>, %y: memref<?x?xf32>, %s: memref<?xf32>) {{
          %c0 = arith.constant 0 : index
          %c1 = arith.constant 1 : index
          %zero = arith.constant 0.0 : f32
          %last = arith.subi %n, %c1 : index
          %yv = memref.cast %y : memref<?x?xf32> to memref<?x?xf32>
          scf.parallel (%i) = (%c0) to (%n) step (%c1) {{
            %v = memref.load %x[%r, %i] : memref<?x?xf32>
            memref.store %v, %y[%r, %i] : memref<?x?xf32>
            scf.reduce
          }}
          %sum = scf.for %i = %c0 to %n step %c1 iter_args(%a = %zero) -> f32 {{
            %j = arith.subi %last, %i : index
            %v = memref.load {"%yv" if read == "view" else "%y"}[%r, {index}] : memref<?x?xf32>
            %w = memref.load %x[%r, %i] : memref<?x?xf32>
            %p = arith.mulf %v, %w : f32
            %t = arith.addf %a, %p : f32
            scf.yield %t : f32
          }}
          memref.store %sum, %s[%r] : memref<?xf32>
          return
        }}""")
        func = module.body.operations[0]
        gpu._cooperative_rows(func, gpu._row_phases(func), "warp")
        assert (str(func).count("nvvm.bar.warp.sync") == 1) == (read != "own"), str(func)


@pytest.mark.parametrize("through", ["other", "same"])
def test_a_rows_stored_value_is_used_where_it_is_read_back(through):
    """A row's value stored between phases and loaded again (in a loop too) is the value itself,
    also where the loop stores through a view of another buffer (the arena's); a store through a
    view of the value's own buffer keeps the load."""
    from torch_mlir import ir

    from disc_stablehlo.mlir_support import new_context
    from disc_stablehlo.passes import gpu

    target = "%o" if through == "other" else "%m"
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(f"""
        func.func private @body(%r: index, %n: index, %x: memref<?x?xf32>, %m: memref<?xf32>, %o: memref<?xf32>) {{
          %c0 = arith.constant 0 : index
          %c1 = arith.constant 1 : index
          %zero = arith.constant 0.0 : f32
          %v = memref.cast {target} : memref<?xf32> to memref<?xf32>
          %sum = scf.for %i = %c0 to %n step %c1 iter_args(%a = %zero) -> f32 {{
            %e = memref.load %x[%r, %i] : memref<?x?xf32>
            %t = arith.addf %a, %e : f32
            scf.yield %t : f32
          }}
          memref.store %sum, %m[%r] : memref<?xf32>
          scf.parallel (%i) = (%c0) to (%n) step (%c1) {{
            %e = memref.load %x[%r, %i] : memref<?x?xf32>
            %s = memref.load %m[%r] : memref<?xf32>
            %q = arith.divf %e, %s : f32
            memref.store %q, %v[%r] : memref<?xf32>
            scf.reduce
          }}
          return
        }}""")
        func = module.body.operations[0]
        gpu._forward_stored_values(func)
        assert ("memref.load %arg3" in str(func)) == (through == "same"), str(func)


@pytest.mark.parametrize("case", ["sum", "read_reversed", "not_overwritten", "exp"])
def test_a_rows_elements_read_back_are_computed_again(case):
    """A layer norm's row: the loop storing x - m goes, the sum and the last loop compute it
    again from x (one store of the row). Not where a later loop reads another thread's element
    (the row read backwards), nor where no later loop overwrites every element (the stored values
    are the kernel's result), nor where the element is a math function's (a softmax's exp: read
    back, not computed again)."""
    from torch_mlir import ir

    from disc_stablehlo.mlir_support import new_context
    from disc_stablehlo.passes import gpu

    read = "%j" if case == "read_reversed" else "%i"
    last = ("memref.store %q, %y[%r, %i] : memref<?x?xf32>" if case != "not_overwritten"
            else "memref.store %q, %z[%r, %i] : memref<?x?xf32>")
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(f"""
        func.func private @body(%r: index, %n: index, %x: memref<?x?xf32>, %y: memref<?x?xf32>, %z: memref<?x?xf32>,
                                %m: f32) {{
          %c0 = arith.constant 0 : index
          %c1 = arith.constant 1 : index
          %zero = arith.constant 0.0 : f32
          %last = arith.subi %n, %c1 : index
          scf.parallel (%i) = (%c0) to (%n) step (%c1) {{
            %v = memref.load %x[%r, %i] : memref<?x?xf32>
            %d = arith.subf %v, %m : f32
            %e = {"math.exp %d" if case == "exp" else "arith.addf %d, %d"} : f32
            memref.store %e, %y[%r, %i] : memref<?x?xf32>
            scf.reduce
          }}
          %sum = scf.for %i = %c0 to %n step %c1 iter_args(%a = %zero) -> f32 {{
            %j = arith.subi %last, %i : index
            %e = memref.load %y[%r, {read}] : memref<?x?xf32>
            %t = arith.addf %a, %e : f32
            scf.yield %t : f32
          }}
          scf.parallel (%i) = (%c0) to (%n) step (%c1) {{
            %e = memref.load %y[%r, %i] : memref<?x?xf32>
            %q = arith.divf %e, %sum : f32
            {last}
            scf.reduce
          }}
          return
        }}""")
        func = module.body.operations[0]
        assert gpu._recompute_read_back(func) == (case == "sum")
        text = str(func)
        if case == "sum":
            assert text.count("scf.parallel") == 1 and text.count("arith.subf") == 2 and "memref.load %arg3" not in text, text
        else:
            assert text.count("scf.parallel") == 2 and text.count("arith.subf") == 1, text


@pytest.mark.parametrize("reads", ["own", "previous"])
def test_a_row_loop_whose_iterations_read_each_others_elements_stays_in_one_thread(reads):
    """A serial loop over a row that reads what its previous iteration wrote (a scan: PyTorch's
    cumsum of a histogram, a mixture-of-experts layer's offsets) is no row for a block or a warp
    to share: its threads would read elements before they are written (on an H200: offsets of
    stale memory). The same loop reading only its own elements is one."""
    from torch_mlir import ir

    from disc_stablehlo.mlir_support import new_context
    from disc_stablehlo.passes import gpu

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(f"""
        func.func private @body(%r: index, %n: index, %x: memref<?x?xi32>, %y: memref<?x?xi32>) {{
          %c0 = arith.constant 0 : index
          %c1 = arith.constant 1 : index
          scf.for %i = %c0 to %n step %c1 {{
            %j = arith.subi %i, %c1 : index
            %k = arith.maxsi %j, %c0 : index
            %p = memref.load %y[%r, {"%i" if reads == "own" else "%k"}] : memref<?x?xi32>
            %v = memref.load %x[%r, %i] : memref<?x?xi32>
            %s = arith.addi %p, %v : i32
            memref.store %s, %y[%r, %i] : memref<?x?xi32>
          }}
          return
        }}""")
        assert (gpu._row_phases(module.body.operations[0]) is not None) == (reads == "own")


def test_checks_of_the_data_stay_out_of_the_guard():
    """A check of values the data decides (repeat_interleave's counts must not be negative) runs
    in the entry, where the data is; the guard, which the host runs on host memory, keeps only
    shape arithmetic (it read the counts from device memory on the host: a segfault on an H200;
    a guard that would is a CompileError). The refusal still comes from the entry's check."""
    torch = pytest.importorskip("torch")
    from test_torch_data_dependent import RaggedSum

    f = disc.compile(RaggedSum().eval(), (torch.randn(6, 3), torch.tensor([1, 2, 3])),
                     dynamic_shapes=({0: torch.export.Dim("total")}, {0: torch.export.Dim("n")}), target="cuda")
    guard = f._exe.artifact.llvm_ir.split("@disc_guard(", 1)[1].split("\n}\n", 1)[0]
    assert "disc_ral_gpu_launch" not in guard and " load " not in guard.replace("load ptr", "")
    cpu = disc.compile(RaggedSum().eval(), (torch.randn(6, 3), torch.tensor([1, 2, 3])),
                       dynamic_shapes=({0: torch.export.Dim("total")}, {0: torch.export.Dim("n")}))
    with pytest.raises(disc.ShapeError, match="a count of repeats is negative"):
        cpu(np.ones((2, 3), np.float32), np.array([2, -1, 1]))


def test_sizes_the_data_decides_run_on_the_host_without_touching_device_memory(fake_cuda, monkeypatch, tmp_path):
    """PyTorch's programs whose sizes the data decides, on the fake driver, whose device memory
    the host cannot address (and is zero: kernels do not run, so every size read back is 0):
    every call returns or raises a ShapeError; the host code reads what it needs through
    the RAL (the guard read the data itself: a segfault on an H200)."""
    torch = pytest.importorskip("torch")
    from test_torch_data_dependent import CASES as DATA_CASES

    rng = np.random.default_rng(0)
    for name, make, inputs, spec in DATA_CASES:
        dims: dict = {}
        dynamic = tuple({axis: dims.setdefault(d, torch.export.Dim(d)) for axis, d in s.items()} for s in spec)
        compiled = disc.compile(make().eval(), tuple(torch.from_numpy(a) for a in inputs(8, rng)), dynamic_shapes=dynamic, target="cuda")
        (tmp_path / name).mkdir()
        f = _on_fake_gpu(compiled, fake_cuda, monkeypatch, tmp_path / name)
        for n in (1, 5):
            try:
                f(*inputs(n, rng))
            except disc.ShapeError:  # a size from the zeros breaks an assumption
                pass


def test_an_empty_innermost_dim_launches_nothing(fake_cuda, monkeypatch, tmp_path):
    """Elementwise kernels over a dim that is 0 at run time (a mask that selected nothing):
    nothing is launched, and the host's launch arithmetic divides by no zero (it ended the
    process with SIGFPE on an H200)."""
    b, n = jax.export.symbolic_shape("b, n")  # JAX's dims are at least 1: the slice's is 0 at n = 1
    f = _on_fake_gpu(disc.compile(lambda x: jnp.exp(x[:, 1:]) * 2, jax.ShapeDtypeStruct((b, n), jnp.float32), target="cuda"),
                     fake_cuda, monkeypatch, tmp_path)
    launches = Launches(fake_cuda)
    for b in (3, 1):
        launches.reset()
        assert np.asarray(f(np.ones((b, 1), np.float32))).shape == (b, 0)
        assert not list(launches)


def test_a_reduction_to_a_scalar_is_a_kernel_not_host_reads(fake_cuda, monkeypatch, tmp_path):
    """A loop nest the host code would otherwise run over device memory (a sum of everything)
    is a kernel of one thread: one launch, and the only device-to-host copy is the result's."""
    b = jax.export.symbolic_shape("b")[0]
    f = _on_fake_gpu(disc.compile(lambda x: x * jnp.sum(x), jax.ShapeDtypeStruct((b, 100), jnp.float32), target="cuda"),
                     fake_cuda, monkeypatch, tmp_path)
    assert [k.version for k in f.kernels] == ["one thread", ""]
    launches = Launches(fake_cuda)
    for n in (1, 7):
        launches.reset()
        f(np.ones((n, 100), np.float32))
        assert [grid for _, grid, _, _ in launches][0] == [1, 1, 1] and launches.count("d2h") == 1


def test_host_code_reads_complex_elements_in_a_long_loop(fake_cuda, monkeypatch, tmp_path):
    """A loop the host code runs (a while loop carrying a complex scalar) reads an element of a
    device buffer per iteration through the RAL: complex elements as their two parts, each
    read's stack slot made once per call (a million iterations do not overflow the stack)."""
    def fn(n, z):
        return jax.lax.fori_loop(0, n[0], lambda i, c: c * z[i % 2] + 1, jnp.complex64(1))

    f = _on_fake_gpu(disc.compile(fn, jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.complex64), target="cuda"),
                     fake_cuda, monkeypatch, tmp_path)
    z = np.array([0.5 + 0.25j, -0.3 + 0.5j], np.complex64)
    for n in (5, 1_000_000):
        np.testing.assert_allclose(f(np.array([n], np.int32), z), jax.jit(fn)(np.array([n], np.int32), z), rtol=1e-5)


def test_host_arguments_are_copied_on_the_calls_stream_and_freed_to_it(fake_cuda, monkeypatch, tmp_path):
    """A numpy argument of a call on a stream of the caller's (numpy mixed with CUDA tensors) is
    copied into device memory of that stream's pool and given back to it when the call returns:
    nothing on another stream can take the block while the call's kernels may still read it."""
    b = jax.export.symbolic_shape("b")[0]
    f = _on_fake_gpu(disc.compile(lambda x: x * 2, jax.ShapeDtypeStruct((b, 64), jnp.float32), target="cuda"),
                     fake_cuda, monkeypatch, tmp_path)
    launches = Launches(fake_cuda)
    exe, x, stream = f._exe, np.ones((5, 64), np.float32), 0x5A

    def buffers() -> set[int]:  # the device addresses the kernel was given (the argument's copy, the result)
        launches.reset()
        exe.run([x], stream=stream)
        (_, _, _, params), = launches
        return {p for p in params if p > 1 << 16}

    first = buffers()
    assert exe.runtime.to_device(x).address not in first  # the default stream's pool has neither
    assert buffers() == first  # both reused on the same stream


class _DLTensor(ctypes.Structure):  # dlpack.h's DLManagedTensor
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


def _take_capsule(exported) -> tuple[int, _DLTensor]:
    """What a framework's from_dlpack does with a result: takes the capsule's tensor (renaming the
    capsule, so that its destructor leaves it alone)."""
    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))
    rename = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", ctypes.pythonapi))
    assert exported.__dlpack_device__() == (2, 0)  # kDLCUDA, the first GPU
    capsule = exported.__dlpack__(stream=None)
    address = get(capsule, b"dltensor")
    rename(capsule, b"used_dltensor")
    return address, _DLTensor.from_address(address)


def test_device_results_are_handed_over_through_dlpack(fake_cuda, monkeypatch, tmp_path):
    """Results for a framework's DLPack import (torch CUDA tensors, JAX GPU arrays in): the
    call's own buffer without a copy, or a copy of an argument returned as it is; each described
    by its capsule (device, type, shape, strides) and given back to the runtime when the
    framework's deleter runs, or when nobody takes it."""
    from disc_stablehlo.runtime import ral

    b = jax.export.symbolic_shape("b")[0]
    f = _on_fake_gpu(disc.compile(lambda x, w: (x @ w, x), jax.ShapeDtypeStruct((b, 3), jnp.float32),
                                  jax.ShapeDtypeStruct((3, 4), jnp.float32), target="cuda"), fake_cuda, monkeypatch, tmp_path)
    exe = f._exe
    x, w = np.arange(15, dtype=np.float32).reshape(5, 3), np.ones((3, 4), np.float32)
    exe.run([x, w])  # the GPU attached
    rt = exe.runtime
    dx = rt.to_device(x)  # a caller's device array (a torch CUDA tensor)
    base = rt.memory_stats("gpu")["bytes_in_use"]
    (a, ta), (c, tc) = exe.run([dx, w], consume=_take_capsule)
    assert (ta.device_type, ta.ndim, ta.code, ta.bits, ta.lanes, ta.byte_offset) == (2, 2, 2, 32, 1, 0)  # float32
    assert [ta.shape[i] for i in range(2)] == [5, 4] and [ta.strides[i] for i in range(2)] == [4, 1]
    got = np.ctypeslib.as_array(ctypes.cast(Launches(fake_cuda).host(ta.data), ctypes.POINTER(ctypes.c_float)), (5, 4))
    np.testing.assert_array_equal(got, x @ w)  # what the (fake) cuBLAS wrote, in place
    assert tc.data != dx.address and [tc.shape[i] for i in range(2)] == [5, 3]  # the argument returned: a copy
    assert bytes((ctypes.c_char * 60).from_address(Launches(fake_cuda).host(tc.data))) == x.tobytes()
    assert rt.memory_stats("gpu")["bytes_in_use"] > base  # held by their consumers
    for address in (a, c):
        ral().ral_dlpack_delete(address)  # the consumers' deleters
    assert rt.memory_stats("gpu")["bytes_in_use"] == base
    exe.run([dx, w], consume=lambda exported: exported.__dlpack__())  # capsules nobody takes
    import gc

    gc.collect()
    assert rt.memory_stats("gpu")["bytes_in_use"] == base


def _cuda_gpu() -> bool:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int()
        return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except OSError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_gpu(), reason="no CUDA GPU on this machine (benchmarks/gpu/ has the runs on one)")
def test_programs_on_the_gpu_match_jax():
    for name, fn, args, dims, envs, tol in CASES:
        f = disc.compile(fn, *specs_for(args, dims), target="cuda")
        rng = np.random.default_rng(0)
        for env in envs:
            inputs = [random_array(concrete(shape, env), dtype, rng) for shape, dtype in args]
            for g, w in zip(jax.tree_util.tree_leaves(f(*inputs)), jax.tree_util.tree_leaves(jax.jit(fn)(*inputs))):
                np.testing.assert_allclose(np.asarray(g, dtype=np.asarray(w).dtype), np.asarray(w), rtol=tol, atol=tol,
                                           err_msg=f"{name} at {env}")
