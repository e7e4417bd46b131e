"""PyTorch eager training step, same models and shapes as bench/train_step.rs.

Prints one line per model: `name torch_ms` (median). Threads: torch.set_num_threads from
OAR_BENCH_THREADS (default: torch's default).
"""
import os

import torch
import torch.nn as nn
from torch_models import lenet, median_ms, mlp

BATCH = 64


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
