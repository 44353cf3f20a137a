"""FFTs compiled by disc_stablehlo (the RAL's FFT) against numpy's pocketfft, one thread each
(DISC_NUM_THREADS=1; numpy's FFT is single-threaded), on large sizes: powers of two, a smooth
length (2^6 * 5^6), a prime (Bluestein), the real transform, a batch of lines, a 2-D transform.
Then PyTorch's `torch.fft` through the torch frontend (compiled once for any length) against torch
eager, one thread each: a Hyena-style FFT convolution (rfft of input and filter at twice the
length, product, irfft) at three lengths.

    python benchmarks/fft.py

Best of 7 calls each after one warm-up call, the peers alternating; the machine's load printed."""

from __future__ import annotations

import os
import sys
import time

os.environ["DISC_NUM_THREADS"] = "1"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import export  # noqa: E402

jax.config.update("jax_enable_x64", True)

CASES = [  # name, jax function, numpy function, shape (the first dim is the dynamic batch), dtype
    ("fft complex128 2^20", jnp.fft.fft, np.fft.fft, (1, 1 << 20), np.complex128),
    ("fft complex64 2^20", jnp.fft.fft, np.fft.fft, (1, 1 << 20), np.complex64),
    ("fft complex128 10^6 (2^6 5^6)", jnp.fft.fft, np.fft.fft, (1, 10 ** 6), np.complex128),
    ("fft complex128 1000003 (prime)", jnp.fft.fft, np.fft.fft, (1, 1000003), np.complex128),
    ("rfft float64 2^20", jnp.fft.rfft, np.fft.rfft, (1, 1 << 20), np.float64),
    ("irfft complex128 2^20", jnp.fft.irfft, np.fft.irfft, (1, (1 << 19) + 1), np.complex128),
    ("fft complex64 256 x 4096", jnp.fft.fft, np.fft.fft, (256, 4096), np.complex64),
    ("fft2 complex128 1024 x 1024", jnp.fft.fft2, np.fft.fft2, (1, 1024, 1024), np.complex128),
]


def _best(fn, x, reps: int = 7) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    import disc_stablehlo as disc

    print(f"load {os.getloadavg()[0]:.2f}, one thread each")
    print(f"{'transform':<32} {'disc ms':>9} {'numpy ms':>9} {'ratio':>7}")
    worst = 0.0
    for name, jfn, nfn, shape, dtype in CASES:
        b = export.symbolic_shape("b")[0]
        f = disc.compile(jfn, jax.ShapeDtypeStruct((b, *shape[1:]), dtype))
        rng = np.random.default_rng(0)
        x = rng.standard_normal(shape)
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.standard_normal(shape)
        x = x.astype(dtype)
        f(x), nfn(x)
        times = {"disc": float("inf"), "numpy": float("inf")}
        for _ in range(7):  # alternating, the best of each
            times["disc"] = min(times["disc"], _best(f, x, 1))
            times["numpy"] = min(times["numpy"], _best(nfn, x, 1))
        ratio = times["disc"] / times["numpy"]
        worst = max(worst, ratio)
        print(f"{name:<32} {1e3 * times['disc']:>9.2f} {1e3 * times['numpy']:>9.2f} {ratio:>6.2f}x")
    print(f"slowest against numpy: {worst:.2f}x; load {os.getloadavg()[0]:.2f} at the end")
    _torch_convolution(disc)
    return 0


def _torch_convolution(disc) -> None:
    import torch

    torch.set_num_threads(1)

    class LongConvolution(torch.nn.Module):
        def forward(self, u, k):
            n = u.shape[-1]
            return torch.fft.irfft(torch.fft.rfft(u, n=2 * n) * torch.fft.rfft(k, n=2 * n), n=2 * n)[..., :n]

    model, n = LongConvolution(), torch.export.Dim("n")
    f = disc.compile(model, (torch.randn(4, 32, 64), torch.randn(32, 64)), dynamic_shapes=({2: n}, {1: n}))
    print(f"\ntorch.fft, one thread each; load {os.getloadavg()[0]:.2f}")
    print(f"{'FFT convolution (4, 32, L)':<32} {'disc ms':>9} {'torch ms':>9} {'ratio':>7}")
    for length in (256, 1024, 4096):
        u, k = torch.randn(4, 32, length), torch.randn(32, length)
        f(u, k), model(u, k)
        times = {"disc": float("inf"), "torch": float("inf")}
        for _ in range(7):
            times["disc"] = min(times["disc"], _best(lambda a: f(*a), (u, k), 1))
            times["torch"] = min(times["torch"], _best(lambda a: model(*a), (u, k), 1))
        print(f"{'L = ' + str(length):<32} {1e3 * times['disc']:>9.2f} {1e3 * times['torch']:>9.2f} {times['disc'] / times['torch']:>6.2f}x")


if __name__ == "__main__":
    sys.exit(main())
