"""numpy on the shapes of bench/kernels.rs (single-threaded BLAS), same output format."""
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402


def median_secs(runs, f):
    f()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        f()
        t.append(time.perf_counter() - s)
    return sorted(t)[len(t) // 2]


rng = np.random.default_rng(0)
for n in (256, 512, 1024):
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    s = median_secs(7, lambda: a @ b)
    print(f"matmul f32 {n}x{n}x{n}: {s * 1e3:.3f} ms, {2 * n**3 / s / 1e9:.1f} GFLOP/s")
