"""PyTorch side of bench/gpu.sh: the same workloads as bench/gpu.rs on the same GPU.

Prints `name value` lines: copy_gbs, fused_gbs (eager PyTorch: three kernels for
tanh(2x + 1) * x; bytes counted as one read and one write per element, as for oar),
fused_compiled_gbs (torch.compile, when it works), resnet18_b64_ms, mlp_train_ms.
Medians of CUDA-event timings after warm-ups. `--device cpu` runs it on the CPU (a smoke test).
"""

import argparse
import statistics

import torch

ELEMENTS = 64 << 20
BATCH = 64


def median_ms(fn, warm, runs, device):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(runs):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            import time

            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--elements", type=int, default=ELEMENTS)
    args = ap.parse_args()
    dev = args.device
    torch.manual_seed(0)
    n = args.elements
    nbytes = 2 * 4 * n

    x = torch.randn(n, device=dev)
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), 3, 20, dev)
    print(f"copy_gbs {nbytes / (ms * 1e-3) / 1e9:.1f}")
    ms = median_ms(lambda: torch.tanh(x * 2 + 1) * x, 3, 20, dev)
    print(f"fused_gbs {nbytes / (ms * 1e-3) / 1e9:.1f}")
    try:
        f = torch.compile(lambda t: torch.tanh(t * 2 + 1) * t)
        ms = median_ms(lambda: f(x), 3, 20, dev)
        print(f"fused_compiled_gbs {nbytes / (ms * 1e-3) / 1e9:.1f}")
    except Exception as e:  # torch.compile needs a working Triton/compiler toolchain
        print(f"# torch.compile unavailable: {type(e).__name__}: {e}".splitlines()[0])
    del x, y

    import torchvision

    model = torchvision.models.resnet18(num_classes=1000).to(dev).eval()
    img = torch.randn(BATCH, 3, 224, 224, device=dev)
    with torch.no_grad():
        ms = median_ms(lambda: model(img), 2, 10, dev)
    print(f"resnet18_b64_ms {ms:.3f}")

    mlp = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to(dev)
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
    xb = torch.randn(BATCH, 784, device=dev)
    yb = (torch.arange(BATCH, device=dev) % 10).long()

    def step():
        loss = torch.nn.functional.cross_entropy(mlp(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()

    ms = median_ms(step, 3, 30, dev)
    print(f"mlp_train_ms {ms:.3f}")


if __name__ == "__main__":
    main()
