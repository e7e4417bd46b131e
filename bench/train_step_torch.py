"""PyTorch eager training step, same models and shapes as bench/train_step.rs.

Prints one line per model: `name torch_ms` (median). Threads: torch.set_num_threads from
OAR_BENCH_THREADS (default: torch's default).
"""
import os
import time

import torch
import torch.nn as nn

BATCH = 64


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def median_ms(f, runs):
    for _ in range(3):
        f()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        f()
        t.append((time.perf_counter() - s) * 1e3)
    t.sort()
    return t[runs // 2]


def bench(name, make, shape, runs):
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(*shape)
    y = torch.arange(BATCH) % 10
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    print(f"{name} {median_ms(step, runs):.4f}", flush=True)


if __name__ == "__main__":
    if os.environ.get("OAR_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["OAR_BENCH_THREADS"]))
    bench("mlp", mlp, (BATCH, 784), 41)
    bench("lenet", lenet, (BATCH, 1, 28, 28), 21)
