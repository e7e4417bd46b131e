"""PyTorch on the shapes of bench/norm.rs (one thread), same output format."""
import time

import torch


def median_secs(runs, f):
    f()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        f()
        t.append(time.perf_counter() - s)
    return sorted(t)[len(t) // 2]


torch.set_num_threads(1)
torch.manual_seed(0)
with torch.no_grad():
    for rows, d in ((4096, 768), (16384, 128)):
        x = torch.randn(rows, d)
        g, b = torch.randn(d), torch.randn(d)
        for what, f in (
            ("add", lambda: x + 1),
            ("layer_norm", lambda: torch.nn.functional.layer_norm(x, (d,), g, b, 1e-5)),
            ("softmax", lambda: torch.softmax(x, 1)),
            ("gelu", lambda: torch.nn.functional.gelu(x)),
            ("tanh", lambda: torch.tanh(x)),
        ):
            s = median_secs(15, f)
            print(f"{what} f32 {rows}x{d}: {s * 1e3:.3f} ms, {2 * rows * d * 4 / s / 1e9:.1f} GB/s")
