"""PyTorch eager, the same workloads as bench/eager.rs (see there).

`python3 bench/eager_torch.py` prints `name milliseconds` per workload (medians);
`python3 bench/eager_torch.py rss WORKLOAD` runs 20 training steps and prints
`rss_WORKLOAD megabytes` (peak resident set). Threads: OAR_BENCH_THREADS (torch.set_num_threads).
"""
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_models import lenet, median_ms, mlp

BATCH = 64


def per_call(reps, f):
    def many():
        for _ in range(reps):
            f()
    return median_ms(many, 15) / reps


def train_step(name):
    torch.manual_seed(0)
    y = torch.arange(BATCH) % 10
    if name in ("mlp", "lenet"):
        model = mlp() if name == "mlp" else lenet()
        x = torch.randn(BATCH, 784) if name == "mlp" else torch.randn(BATCH, 1, 28, 28)
        loss_fn = nn.CrossEntropyLoss()

        def loss():
            return loss_fn(model(x), y)
    else:
        model = nn.LSTM(64, 128, batch_first=True)
        x = torch.randn(16, 32, 64)

        def loss():
            return model(x)[0].mean()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
    return step


def first_call(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1e3


def ops():
    one, other = torch.randn(1), torch.randn(1)
    print(f"overhead_add_1 {per_call(2000, lambda: torch.add(one, other)):.6f}", flush=True)
    fa, fb = torch.randn(257, 129), torch.randn(257, 129)
    print(f"first_add_257x129 {first_call(lambda: fa + fb):.6f}", flush=True)
    print(f"first_softmax_257x129 {first_call(lambda: F.softmax(fa, -1)):.6f}", flush=True)
    print(f"first_layer_norm_257x129 {first_call(lambda: F.layer_norm(fa, (129,))):.6f}", flush=True)
    for label, shape in [("4k", (4, 1024)), ("64k", (64, 1024)), ("1m", (1024, 1024))]:
        n = shape[0] * shape[1]
        reps = max(2, min(1000, 4_000_000 // n))
        a, b = torch.randn(*shape), torch.randn(*shape)
        for key, f in [("add", lambda: a + b), ("mul", lambda: a * b), ("tanh", lambda: torch.tanh(a)),
                       ("exp", lambda: torch.exp(a)), ("relu", lambda: F.relu(a)),
                       ("sum_rows", lambda: a.sum(1)), ("mean_all", lambda: a.mean())]:
            print(f"{key}_{label} {per_call(reps, f):.6f}", flush=True)
        row, col, mask = torch.randn(1, 1024), torch.randn(shape[0], 1), a > b
        for key, f in [("sigmoid", lambda: torch.sigmoid(a)), ("sin", lambda: torch.sin(a)),
                       ("gelu", lambda: F.gelu(a)), ("maximum", lambda: torch.maximum(a, b)),
                       ("gt", lambda: a > b), ("where", lambda: torch.where(mask, a, b)),
                       ("max_rows", lambda: a.amax(1)), ("add_row", lambda: a + row),
                       ("add_col", lambda: a + col)]:
            print(f"{key}_{label} {per_call(reps, f):.6f}", flush=True)
    for label, dtype in (("f64", torch.float64), ("bf16", torch.bfloat16), ("f16", torch.float16)):
        a, b = torch.randn(1024, 1024).to(dtype), torch.randn(1024, 1024).to(dtype)
        print(f"add_{label}_1m {per_call(4, lambda: a + b):.6f}", flush=True)
        if dtype != torch.float64:
            print(f"gelu_{label}_1m {per_call(4, lambda: F.gelu(a)):.6f}", flush=True)
    a, b, row = torch.randn(1024, 1024), torch.randn(1024, 1024), torch.randn(1, 1024)

    def views():
        a.reshape(-1)
        a.t()
        a[:, 1:513]
        return row.expand(1024, 1024)
    print(f"views_1m {per_call(1000, views):.6f}", flush=True)
    print(f"t_add_1m {per_call(4, lambda: a.t() + b):.6f}", flush=True)
    x = torch.randn(512, 1024)
    w, bias = torch.ones(1024), torch.zeros(1024)
    print(f"softmax_512x1024 {per_call(5, lambda: F.softmax(x, -1)):.6f}")
    print(f"layer_norm_512x1024 {per_call(5, lambda: F.layer_norm(x, (1024,), w, bias, 1e-5)):.6f}")
    q, k, v = (torch.randn(4, 8, 128, 64) for _ in range(3))
    with torch.no_grad():
        print(f"sdpa_4x8x128x64 {per_call(5, lambda: F.scaled_dot_product_attention(q, k, v)):.6f}")
        print(f"sdpa_causal_4x8x128x64 "
              f"{per_call(5, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)):.6f}")
    q, k, v = (torch.randn(4, 8, 128, 64, requires_grad=True) for _ in range(3))

    def sdpa_grad():
        o = F.scaled_dot_product_attention(q, k, v)
        o.sum().backward()
        return o
    print(f"sdpa_grad_4x8x128x64 {per_call(3, sdpa_grad):.6f}")
    for name in ("mlp", "lenet", "lstm"):
        runs = 31 if name == "mlp" else 11
        print(f"{name}_step {median_ms(train_step(name), runs):.6f}", flush=True)


if __name__ == "__main__":
    if os.environ.get("OAR_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["OAR_BENCH_THREADS"]))
    if len(sys.argv) == 3 and sys.argv[1] == "rss":
        step = train_step(sys.argv[2])
        for _ in range(20):
            step()
        print(f"rss_{sys.argv[2]} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}")
    else:
        ops()
