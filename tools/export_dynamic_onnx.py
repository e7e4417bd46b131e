#!/usr/bin/env python3
"""Export a small CNN with a dynamic batch axis to ONNX, for oar's symbolic-shape import test.

    python3 tools/export_dynamic_onnx.py      # writes onnx/tests/models/dynamic/

The model computes its reshape targets from the input's shape at run time, as PyTorch code
does (`x.view(x.size(0), -1)`, `x.reshape(n * c, h * w)`), so the TorchScript exporter writes
Shape → Gather → Unsqueeze → Concat (and Mul) → Reshape chains on the symbolic `batch` dim.
Writes dyn_cnn.onnx, and for batch sizes 2 and 5 dyn_cnn.input_B.npy and onnxruntime's
dyn_cnn.output_B.npy. Needs torch, onnx and onnxruntime (torch 2.15 and onnxruntime 1.32 made
the committed files). Weights are random with a fixed seed.
"""

import os

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "onnx", "tests", "models", "dynamic")


class DynCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        n, c, h, w = y.shape
        # Batch merged with channels: a softmax over each channel's pixels.
        y = torch.softmax(y.reshape(n * c, h * w), dim=1).reshape(n, c, h, w)
        return self.fc(y.view(y.size(0), -1))


def main():
    torch.manual_seed(7)
    model = DynCnn().eval()
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "dyn_cnn.onnx")
    x = torch.randn(2, 2, 6, 6)
    torch.onnx.export(
        model,
        (x,),
        path,
        dynamo=False,
        opset_version=17,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
    )
    onnx.checker.check_model(onnx.load(path))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ops = sorted({n.op_type for n in onnx.load(path).graph.node})
    print(f"{path}: ops {ops}")
    rng = np.random.default_rng(3)
    for b in (2, 5):
        xb = rng.standard_normal((b, 2, 6, 6)).astype(np.float32)
        (y,) = sess.run(None, {"x": xb})
        with torch.no_grad():
            diff = np.abs(model(torch.from_numpy(xb)).numpy() - y).max()
        np.save(os.path.join(OUT, f"dyn_cnn.input_{b}.npy"), xb)
        np.save(os.path.join(OUT, f"dyn_cnn.output_{b}.npy"), y)
        print(f"batch {b}: max |torch - ort| = {diff:.2e}")


if __name__ == "__main__":
    main()
