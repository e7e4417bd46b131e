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
    y = torch.arange(shape[0]) % 10
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
    if os.environ.get("OAR_BENCH_RESNET") != "0":
        # torchvision's ResNet-18 is oar's (basic blocks, 1×1 downsample + batch norm, no conv bias).
        import torchvision
        bench("resnet18", lambda: torchvision.models.resnet18(num_classes=10), (32, 3, 32, 32), 5)
