"""ONNX Runtime and PyTorch inference latency on the models bench/cpu_models.rs times.

ONNX Runtime runs the exported .onnx files; PyTorch runs the same modules rebuilt by
tools/export_torch_models.py (same seeds, hence the same weights). Prints per model one
line: `name ort_ms torch_ms` (medians). Threads: OAR_BENCH_THREADS for both.
"""
import os
import sys
import time

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import export_torch_models as exp  # noqa: E402


def median_ms(f, runs=30):
    for _ in range(3):
        f()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        f()
        t.append((time.perf_counter() - s) * 1e3)
    t.sort()
    return t[runs // 2]


def main():
    d = sys.argv[1]
    names = sys.argv[2:] or ["resnet18", "mobilenet_v2", "transformer_encoder", "lstm", "gru", "resnet18_b16"]
    threads = int(os.environ.get("OAR_BENCH_THREADS", "0"))
    if threads:
        torch.set_num_threads(threads)
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    for name in names:
        sess = ort.InferenceSession(os.path.join(d, f"{name}.onnx"), so, providers=["CPUExecutionProvider"])
        feeds = {i.name: np.load(os.path.join(d, f"{name}.input_{k}.npy")) for k, i in enumerate(sess.get_inputs())}
        ort_ms = median_ms(lambda: sess.run(None, feeds))
        module, inputs = exp.build(name, "full")
        module.eval()
        tin = [torch.from_numpy(np.load(os.path.join(d, f"{name}.input_{k}.npy"))) for k in range(len(inputs))]
        with torch.inference_mode():
            torch_ms = median_ms(lambda: module(*tin))
        print(f"{name} {ort_ms:.4f} {torch_ms:.4f}", flush=True)


if __name__ == "__main__":
    main()
