"""Convolutions: ungrouped float ones in PyTorch's layout run on the RAL's convolution (GEMMs over
patch blocks built in cache), in other layouts as patch matrix x kernel on the RAL's GEMM (any
stride, padding, dilation), grouped and depthwise ones as sums of the window's products (large
windows: reduction loops); all compiled once with dynamic batch and image size and checked
against the framework at several shapes."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gemm_calls
from jax import export

import disc_stablehlo as disc


def test_torch_convolutions_in_nchw_run_on_the_ral():
    torch = pytest.importorskip("torch", reason="needs torch (pip install disc_stablehlo[test])")
    from torch.export import Dim

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.Conv2d(32, 32, 1),  # 1x1
        torch.nn.Conv2d(32, 8, (3, 5), stride=(1, 2), padding=(2, 1), dilation=(2, 1)),
        torch.nn.Conv2d(8, 8, 3, groups=8, padding=1),  # depthwise: loops
    ).eval()
    dims = {0: Dim("b", max=16), 2: Dim("h", min=16, max=256), 3: Dim("w", min=16, max=256)}
    f = disc.compile(model, (torch.randn(2, 3, 32, 32),), dynamic_shapes=(dims,))
    for b, h, w in [(1, 16, 16), (3, 40, 24), (2, 64, 48)]:
        x = torch.randn(b, 3, h, w)
        before = gemm_calls(f, "disc_ral_conv")
        with torch.no_grad():
            torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-5)
        assert gemm_calls(f, "disc_ral_conv") - before == 4  # the four ungrouped convolutions; the depthwise one is a loop kernel


def test_convolutions_of_channel_and_row_slices():
    """The RAL's convolution reads its input contiguous: a slice of the channels or rows (a view
    once bufferized) is copied first, and an input that is contiguous is not."""
    torch = pytest.importorskip("torch", reason="needs torch (pip install disc_stablehlo[test])")
    from torch.export import Dim

    class Slices(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 2, 3)

        def forward(self, x):
            return self.conv(x[:, :3]), self.conv(x[:, 1:]), self.conv(x[:, :3, 1:])

    torch.manual_seed(2)
    model = Slices().eval()
    dims = {0: Dim("b"), 2: Dim("h", min=5, max=64), 3: Dim("w", min=4, max=64)}
    f = disc.compile(model, (torch.randn(2, 4, 9, 9),), dynamic_shapes=(dims,))
    whole = disc.compile(model.conv, (torch.randn(2, 3, 9, 9),), dynamic_shapes=(dims,))
    assert not any(k.kind == "copy" for k in whole.kernels), whole.kernels
    for b, h, w in [(1, 5, 4), (3, 10, 11)]:
        x = torch.randn(b, 4, h, w)
        with torch.no_grad():
            for got, want in zip(f(x), model(x)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("conv, shape", [("Conv1d", (3, 4, 37)), ("Conv3d", (2, 4, 9, 10, 7))])
def test_torch_1d_and_3d_convolutions_on_the_ral(conv, shape):
    """Channels-first convolutions of one to three spatial dims: out[b] = kernel x patches[b] (a
    1x1 with unit strides reads the input itself; a 1x1 with stride 2 copies its patches)."""
    torch = pytest.importorskip("torch", reason="needs torch (pip install disc_stablehlo[test])")
    from torch.export import Dim

    torch.manual_seed(1)
    layer = getattr(torch.nn, conv)
    model = torch.nn.Sequential(layer(4, 6, 3, padding=1), layer(6, 5, 1), layer(5, 3, 1, stride=2)).eval()
    dims = {0: Dim("b", max=8), len(shape) - 1: Dim("s", min=4, max=64)}
    f = disc.compile(model, (torch.randn(*shape),), dynamic_shapes=(dims,))
    for b, s in [(1, 4), (2, 23), (5, 40)]:
        x = torch.randn(b, *shape[1:-1], s)
        with torch.no_grad():
            torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-5)


def test_residual_block_is_one_kernel_per_convolution_at_batch_1():
    """A ResNet block (conv, batch norm, ReLU, 1x1 conv, batch norm, residual add, ReLU) from
    PyTorch: torch-mlir's broadcasts (`shape.broadcast` of extent tensors) are resolved, so every
    dim is proven (no run-time broadcast check, no second version of any loop); each chain of
    elementwise ops after a convolution is one loop, which runs behind the convolution's blocks
    (its epilogue); the convolutions pad and copy their patches inside the RAL's call (no
    padding, fill or patch kernels)."""
    torch = pytest.importorskip("torch", reason="needs torch (pip install disc_stablehlo[test])")
    from torch.export import Dim

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.n1 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16)
            self.c2, self.n2 = torch.nn.Conv2d(16, 16, 1, bias=False), torch.nn.BatchNorm2d(16)

        def forward(self, x):
            return torch.relu(self.n2(self.c2(torch.relu(self.n1(self.c1(x))))) + x)

    torch.manual_seed(0)
    model = Block().eval()
    for n in (model.n1, model.n2):
        n.running_mean.normal_()
        n.running_var.uniform_(0.5, 2.0)
        n.weight.data.normal_()
        n.bias.data.normal_()
    dims = {0: Dim("b", max=16), 2: Dim("h", min=8, max=256), 3: Dim("w", min=8, max=256)}
    f = disc.compile(model, (torch.randn(2, 16, 20, 20),), dynamic_shapes=(dims,))
    report = f.shape_report()
    assert re.search(r"result0: \[b, 16, h, w\]", report), report
    assert "checked at run time []" in report and not re.search(r"checked at run time \[\d", report)
    assert not any(k.version for k in f.kernels if "general" in k.version)
    assert _kinds(f) == ["elementwise", "elementwise"], _kinds(f)
    assert all(k.epilogue_of == "disc_ral_conv_f32" for k in f.kernels), f.kernels
    for b, h, w in [(1, 8, 8), (1, 30, 17), (4, 24, 40)]:
        x = torch.randn(b, 16, h, w)
        with torch.no_grad():
            torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_jax_nchw_convolutions_with_input_dilation_and_negative_padding(dtype):
    """The RAL's convolution computes each window's input index itself: input (lhs) dilation as in
    a transposed convolution, negative padding that crops, window dilation and strides, one to
    three spatial dims; images large enough for several patch blocks, and batch 1 (the kernel's
    rows split over the threads instead)."""
    b, h, w = export.symbolic_shape("b, h, w", constraints=["h >= 6", "w >= 6"])
    rng = np.random.default_rng(3)
    k2 = rng.standard_normal((5, 4, 3, 4)).astype(dtype)  # OIHW
    k1 = rng.standard_normal((3, 5, 2)).astype(dtype)
    k3 = rng.standard_normal((2, 3, 1, 2, 3)).astype(dtype)
    nchw = ("NCHW", "OIHW", "NCHW")

    def fn(x):
        y = jax.lax.conv_general_dilated(x, k2, (1, 2), [(2, -1), (-2, 3)], lhs_dilation=(2, 1), rhs_dilation=(1, 2),
                                         dimension_numbers=nchw)
        z = jax.lax.conv_general_dilated(y[:, :, 0], k1, (3,), [(1, 1)], lhs_dilation=(3,),
                                         dimension_numbers=("NCH", "OIH", "NCH"))
        v = jax.lax.conv_general_dilated(y[:, :3, None], k3, (1, 1, 2), [(0, 0), (1, 0), (2, 2)],
                                         dimension_numbers=("NCDHW", "OIDHW", "NCDHW"))
        return y, z, v

    f = disc.compile(fn, jax.ShapeDtypeStruct((b, 4, h, w), dtype))
    for shape in [(1, 4, 6, 6), (2, 4, 11, 7), (1, 4, 150, 130), (3, 4, 40, 64)]:
        x = rng.standard_normal(shape).astype(dtype)
        before = gemm_calls(f, "disc_ral_conv")
        for got, want in zip(f(x), jax.jit(fn)(x)):
            np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-4 if dtype == np.float32 else 1e-10)
        assert gemm_calls(f, "disc_ral_conv") - before == 3


def test_jax_convolutions_in_nhwc_run_as_gemms():
    b, h, w = export.symbolic_shape("b, h, w", constraints=["h >= 8", "w >= 8"])
    rng = np.random.default_rng(0)
    k1 = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)  # HWIO
    k2 = rng.standard_normal((2, 2, 8, 6)).astype(np.float32)

    def fn(x):
        y = jax.lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.lax.conv_general_dilated(jax.nn.relu(y), k2, (2, 1), [(0, 1), (1, 0)], rhs_dilation=(1, 2),
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    f = disc.compile(fn, jax.ShapeDtypeStruct((b, h, w, 4), jnp.float32))
    for shape in [(1, 8, 8, 4), (2, 17, 12, 4), (3, 32, 9, 4)]:
        x = rng.standard_normal(shape).astype(np.float32)
        before = gemm_calls(f)
        np.testing.assert_allclose(f(x), jax.jit(fn)(x), rtol=1e-4, atol=1e-4)
        assert gemm_calls(f) - before == 2


def _kinds(f) -> list[str]:
    return sorted({k.name: k.kind for k in f.kernels}.values())


def test_depthwise_convolution_is_one_elementwise_kernel_with_its_batch_norm():
    """A depthwise convolution (MobileNet's: 3x3, batch norm, hard-swish) is a sum of the
    window's products, one elementwise kernel with what follows it (no reduction loop over
    the window): besides it only the padded input's border fill and copy."""
    torch = pytest.importorskip("torch", reason="needs torch (pip install disc_stablehlo[test])")
    from torch.export import Dim

    torch.manual_seed(0)
    norm = torch.nn.BatchNorm2d(24)
    model = torch.nn.Sequential(torch.nn.Conv2d(24, 24, 3, padding=1, groups=24, bias=False), norm, torch.nn.Hardswish()).eval()
    norm.running_mean.normal_()
    norm.running_var.uniform_(0.5, 2.0)
    dims = {0: Dim("b", max=16), 2: Dim("h", min=2, max=256), 3: Dim("w", min=2, max=256)}
    f = disc.compile(model, (torch.randn(2, 24, 14, 14),), dynamic_shapes=(dims,))
    assert _kinds(f) == ["copy", "elementwise", "fill"], _kinds(f)
    for b, h, w in [(1, 2, 3), (2, 7, 7), (3, 14, 29), (1, 40, 17)]:
        x = torch.randn(b, 24, h, w)
        with torch.no_grad():
            torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-5)


def test_small_window_convolutions_fused_into_a_reduction():
    """Depthwise with stride and dilation, grouped (36 products per output) and a 9x9 depthwise
    window (81 products: a reduction loop instead), each followed by a mean over the image as
    in squeeze-excitation, so the sum of products is computed inside the reduction's loops:
    their extent is the output's, not the padded input's."""
    torch = pytest.importorskip("torch", reason="needs torch (pip install disc_stablehlo[test])")
    from torch.export import Dim

    class Convs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([
                torch.nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8),
                torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8, bias=False),
                torch.nn.Conv2d(8, 6, 3, padding=1, groups=2),
                torch.nn.Conv2d(8, 8, 9, padding=4, groups=8)])

        def forward(self, x):
            outs = [conv(x) for conv in self.convs]
            return tuple(outs) + tuple(y.mean((2, 3)) for y in outs)

    torch.manual_seed(1)
    model = Convs().eval()
    dims = {0: Dim("b", max=16), 2: Dim("h", min=4, max=256), 3: Dim("w", min=4, max=256)}
    f = disc.compile(model, (torch.randn(2, 8, 12, 12),), dynamic_shapes=(dims,))
    for b, h, w in [(1, 4, 5), (2, 12, 12), (3, 23, 9)]:
        x = torch.randn(b, 8, h, w)
        with torch.no_grad():
            for got, want in zip(f(x), model(x)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_jax_grouped_convolution_in_nhwc():
    b, h, w = export.symbolic_shape("b, h, w", constraints=["h >= 3", "w >= 3"])
    rng = np.random.default_rng(2)
    k = rng.standard_normal((3, 3, 2, 12)).astype(np.float32)  # HWIO, 3 groups of 2 input features

    def fn(x):
        y = jax.lax.conv_general_dilated(x, k, (1, 2), [(1, 1), (0, 2)], rhs_dilation=(1, 2), feature_group_count=3,
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y, y.sum((1, 2))

    f = disc.compile(fn, jax.ShapeDtypeStruct((b, h, w, 6), jnp.float32))
    for shape in [(1, 3, 3, 6), (2, 9, 14, 6), (3, 16, 5, 6)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for got, want in zip(f(x), jax.jit(fn)(x)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert gemm_calls(f) == 0 and "reduction" not in " ".join(_kinds(f))


@pytest.mark.parametrize("layout, kernel, groups", [
    (("NCHW", "OIHW", "NCHW"), (8, 4, 3, 3), 1),   # the RAL's convolution, its padding from the shapes
    (("NHWC", "HWIO", "NHWC"), (3, 3, 4, 8), 1),   # patches x kernel
    (("NHWC", "HWIO", "NHWC"), (5, 5, 1, 4), 4),   # depthwise: the window's products summed
])
def test_same_padding_over_dynamic_image_sizes(layout, kernel, groups):
    """JAX's "SAME" padding with strides over symbolic image sizes is a dynamic_conv: the padding
    is computed from the sizes at run time (odd and even sizes pad differently)."""
    h, w_ = export.symbolic_shape("h, w")
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(kernel).astype(np.float32)
    shape = (2, 4, h, w_) if layout[0] == "NCHW" else (2, h, w_, 4)

    def fn(x):
        return jax.lax.conv_general_dilated(x, weights, (2, 3), "SAME", dimension_numbers=layout, feature_group_count=groups)

    assert "dynamic_conv" in export.export(jax.jit(fn))(jax.ShapeDtypeStruct(shape, jnp.float32)).mlir_module()
    f = disc.compile(fn, jax.ShapeDtypeStruct(shape, jnp.float32))
    for size in [(7, 9), (8, 8), (1, 2), (16, 31)]:
        x = rng.standard_normal([2, 4, *size] if layout[0] == "NCHW" else [2, *size, 4]).astype(np.float32)
        np.testing.assert_allclose(f(x), jax.jit(fn)(x), rtol=1e-4, atol=1e-4, err_msg=str(size))


@pytest.mark.parametrize("dtype, accumulate, layout", [(np.int8, jnp.int32, ("NCHW", "OIHW", "NCHW")),
                                                       (np.float16, jnp.float32, ("NCHW", "OIHW", "NCHW")),
                                                       (jnp.bfloat16, jnp.float32, ("NHWC", "HWIO", "NHWC"))])
def test_mixed_element_types_with_dynamic_dims(dtype, accumulate, layout):
    """int8 inputs accumulated in int32 (quantised models), float16 and bfloat16 in float32: the
    elements are widened before their products, with a dynamic batch and image size."""
    b, h = export.symbolic_shape("b, h")
    nchw = layout[0] == "NCHW"

    def fn(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 2), "SAME", dimension_numbers=layout, feature_group_count=2,
                                            preferred_element_type=accumulate)
    x_shape, w_shape = ((b, 6, h, 9), (4, 3, 3, 3)) if nchw else ((b, h, 9, 6), (3, 3, 3, 4))
    f = disc.compile(fn, jax.ShapeDtypeStruct(x_shape, dtype), jax.ShapeDtypeStruct(w_shape, dtype))
    rng = np.random.default_rng(0)
    for batch, height in [(1, 5), (3, 8)]:
        shape = tuple(batch if d is b else height if d is h else d for d in x_shape)
        x = (rng.integers(-100, 100, shape) if np.dtype(dtype).kind == "i" else rng.standard_normal(shape)).astype(dtype)
        w = (rng.integers(-100, 100, w_shape) if np.dtype(dtype).kind == "i" else rng.standard_normal(w_shape)).astype(dtype)
        got, want = f(x, w), np.asarray(jax.jit(fn)(x, w))
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_kernels_with_dynamic_dims():
    """A kernel whose features and window sizes are known at run time only; an input whose
    features differ from the kernel's is a ShapeError before the convolution runs."""
    b, k = export.symbolic_shape("b, k")

    def fn(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", rhs_dilation=(2, 1))
    f = disc.compile(fn, jax.ShapeDtypeStruct((2, b, 9, 9), np.float32), jax.ShapeDtypeStruct((k, b, k, 2), np.float32))
    rng = np.random.default_rng(0)
    for features, kernel in [(3, 2), (5, 3)]:
        x = rng.standard_normal((2, features, 9, 9)).astype(np.float32)
        w = rng.standard_normal((kernel, features, kernel, 2)).astype(np.float32)
        np.testing.assert_allclose(f(x, w), np.asarray(jax.jit(fn)(x, w)), rtol=1e-4, atol=1e-4)
    g = disc.compile("""func.func @main(%x: tensor<2x?x8x8xf32>, %w: tensor<4x?x3x3xf32>) -> tensor<2x4x6x6xf32> {
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {}
          {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x?x8x8xf32>, tensor<4x?x3x3xf32>) -> tensor<2x4x6x6xf32>
      return %0 : tensor<2x4x6x6xf32>
    }""")
    with pytest.raises(disc.ShapeError, match=r"stablehlo.convolution at .*: the input has 3 features, the kernel's 1 group\(s\) read 5"):
        g(np.ones((2, 3, 8, 8), np.float32), np.ones((4, 5, 3, 3), np.float32))


@pytest.mark.parametrize("layout, groups", [(("NCHW", "OIHW", "NCHW"), 2), (("NHWC", "HWIO", "NHWC"), 3)])
def test_batch_groups_with_dynamic_dims(layout, groups):
    """batch_group_count > 1 (the weight gradient of a grouped convolution): each group of output
    features reads its own group of the batch; a batch that does not split evenly is a ShapeError."""
    b, h = export.symbolic_shape("b, h")
    nchw = layout[0] == "NCHW"

    def fn(x, w):
        return jax.lax.conv_general_dilated(x, w, (2, 1), "SAME", dimension_numbers=layout, batch_group_count=groups)
    x_shape = (groups * b, 3, h, 7) if nchw else (groups * b, h, 7, 3)
    w_shape = (2 * groups, 3, 3, 3) if nchw else (3, 3, 3, 2 * groups)
    f = disc.compile(fn, jax.ShapeDtypeStruct(x_shape, np.float32), jax.ShapeDtypeStruct(w_shape, np.float32))
    rng = np.random.default_rng(0)
    w = rng.standard_normal(w_shape).astype(np.float32)
    for batch, height in [(1, 5), (2, 8)]:
        x = rng.standard_normal(tuple(groups * batch if i == 0 else height if d is h else d for i, d in enumerate(x_shape))).astype(np.float32)
        np.testing.assert_allclose(f(x, w), np.asarray(jax.jit(fn)(x, w)), rtol=1e-4, atol=1e-4)
    g = disc.compile("""func.func @main(%x: tensor<?x3x8x8xf32>, %w: tensor<4x3x3x3xf32>) -> tensor<?x4x6x6xf32> {
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {}
          {batch_group_count = 2 : i64, feature_group_count = 1 : i64} : (tensor<?x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<?x4x6x6xf32>
      return %0 : tensor<?x4x6x6xf32>
    }""")
    assert g(np.ones((4, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32)).shape == (2, 4, 6, 6)
    with pytest.raises(disc.ShapeError, match=r"the input's batch of 3 is not 2 groups of equal size"):
        g(np.ones((3, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32))


@pytest.mark.parametrize("kernel", ["4x?x?x3", "4x2x3x3"])
def test_window_reversal(kernel):
    """window_reversal (the kernel read back to front along those spatial dims), with a kernel of
    static and of dynamic dims: the convolution of the reversed kernel."""
    f = disc.compile(f"""func.func @main(%x: tensor<?x2x7x7xf32>, %w: tensor<{kernel}xf32>) -> tensor<?x4x?x5xf32> {{
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1],
          window = {{stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [true, false]}}
          {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<?x2x7x7xf32>, tensor<{kernel}xf32>) -> tensor<?x4x?x5xf32>
      return %0 : tensor<?x4x?x5xf32>
    }}""")
    rng = np.random.default_rng(0)
    for batch, window in [(1, 3), (3, 2)] if "?" in kernel else [(1, 3), (2, 3)]:
        x = rng.standard_normal((batch, 2, 7, 7)).astype(np.float32)
        w = rng.standard_normal((4, 2, window, 3)).astype(np.float32)
        want = jax.lax.conv_general_dilated(x, np.flip(w, axis=2), (1, 1), "VALID")
        np.testing.assert_allclose(f(x, w), np.asarray(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", [("NCHW", "OIHW", "NCHW"), ("NHWC", "HWIO", "NHWC")])
def test_grouped_convolutions_with_dynamic_kernels(layout):
    """feature_group_count > 1 with a kernel whose window and features are dynamic; features
    that do not split into the groups are a ShapeError."""
    k, c = export.symbolic_shape("k, c")
    nchw = layout[0] == "NCHW"

    def fn(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=layout, feature_group_count=3)
    x_shape = (2, 3 * c, 9, 8) if nchw else (2, 9, 8, 3 * c)
    w_shape = (6, c, k, 3) if nchw else (k, 3, c, 6)
    f = disc.compile(fn, jax.ShapeDtypeStruct(x_shape, np.float32), jax.ShapeDtypeStruct(w_shape, np.float32))
    rng = np.random.default_rng(0)
    for window, per_group in [(2, 1), (4, 2)]:
        sub = {k: window, c: per_group}
        x = rng.standard_normal(tuple(3 * per_group if d is not None and not isinstance(d, int) else d for d in x_shape)).astype(np.float32)
        w = rng.standard_normal(tuple(sub.get(d, d) for d in w_shape)).astype(np.float32)
        np.testing.assert_allclose(f(x, w), np.asarray(jax.jit(fn)(x, w)), rtol=1e-4, atol=1e-4)


def test_grouped_dynamic_kernel_features_are_checked():
    g = disc.compile("""func.func @main(%x: tensor<1x?x6x6xf32>, %w: tensor<?x?x3x3xf32>) -> tensor<1x?x4x4xf32> {
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {}
          {batch_group_count = 1 : i64, feature_group_count = 2 : i64} : (tensor<1x?x6x6xf32>, tensor<?x?x3x3xf32>) -> tensor<1x?x4x4xf32>
      return %0 : tensor<1x?x4x4xf32>
    }""")
    x, w = np.ones((1, 4, 6, 6), np.float32), np.ones((4, 2, 3, 3), np.float32)
    np.testing.assert_allclose(g(x, w), np.full((1, 4, 4, 4), 18, np.float32))
    with pytest.raises(disc.ShapeError, match=r"the kernel's 3 output features are not 2 groups of equal size"):
        g(np.ones((1, 4, 6, 6), np.float32), np.ones((3, 2, 3, 3), np.float32))
    with pytest.raises(disc.ShapeError, match=r"the input has 6 features, the kernel's 2 group\(s\) read 4"):
        g(np.ones((1, 6, 6, 6), np.float32), w)
