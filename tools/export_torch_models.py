#!/usr/bin/env python3
"""Export four PyTorch models to ONNX with inputs and onnxruntime's outputs, for oar's import tests.

    python3 tools/export_torch_models.py --size small --out onnx/tests/models   # committed fixtures
    python3 tools/export_torch_models.py --size full  --out target/models       # benchmark sizes
    python3 tools/export_torch_models.py --size small --out onnx/tests/models/dynamo --exporter dynamo

For each model NAME in (resnet18, mobilenet_v2, transformer_encoder, lstm; at full size also
gru and resnet18_b16) this writes
    DIR/NAME.onnx           the model (weights inside the file)
    DIR/NAME.input_0.npy    its input (float32)
    DIR/NAME.output_0.npy   onnxruntime's output on that input (CPUExecutionProvider)
and DIR/manifest.json (sizes, op types, max |torch - ort| per model).

Exporter: by default torch.onnx.export(dynamo=False), the TorchScript-based exporter, at
opset 17 with constant folding (it needs nothing beyond torch); `--exporter dynamo` uses the
torch.export-based exporter (torch's default since 2.9) at opset 18, which needs
`pip install onnxscript` (0.7.2 made the committed dynamo fixtures). Static shapes (no dynamic
axes). Weights are random (fixed seeds), models are in eval mode, BatchNorm statistics are
randomized (both exporters fold BatchNorm into the preceding Conv).

Sizes:
  full   resnet18 (torchvision, 224x224, batch 1); mobilenet_v2 (torchvision, width 1.0, 224x224,
         batch 1); transformer encoder (4 layers, d_model 256, 4 heads, ffn 1024, gelu, seq 128,
         batch 1); LSTM (2 layers, input 64, hidden 256, seq 64, batch 1) + Linear head (10); GRU
         (same sizes) + Linear head; resnet18_b16: resnet18 at batch 16.
  small  resnet18 structure from torchvision BasicBlocks with widths 16/32/64/128 (64x64, batch 2);
         mobilenet_v2 (torchvision, width_mult 0.25, 100 classes, 64x64, batch 1); transformer
         encoder (2 layers, d_model 64, 4 heads, ffn 128, seq 16, batch 2); LSTM (2 layers, input 16,
         hidden 32, seq 12, batch 2) + Linear head (5). Both small sets together are under 10 MB.

Needs torch and torchvision (CPU use only), onnx and onnxruntime. Deterministic up to the
libraries' own versions (torch 2.15, torchvision 0.29, onnxruntime 1.32 made the fixtures).
"""

import argparse
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torchvision
from torchvision.models.resnet import BasicBlock, conv1x1

OPSET = 17
DYNAMO_OPSET = 18
NAMES = ("resnet18", "mobilenet_v2", "transformer_encoder", "lstm", "gru", "resnet18_b16")
# The committed `--size small` fixtures are these; the benchmark (`--size full`) adds a GRU and
# ResNet-18 at batch 16.
SMALL_NAMES = NAMES[:4]


class SmallResNet18(nn.Module):
    """torchvision's ResNet-18 layout (stem, 4 stages of 2 BasicBlocks, avgpool, fc) with
    configurable stage widths; torchvision's own constructor fixes the widths at 64..512."""

    def __init__(self, widths=(16, 32, 64, 128), num_classes=10):
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(widths[0], 1)
        self.layer2 = self._make_layer(widths[1], 2)
        self.layer3 = self._make_layer(widths[2], 2)
        self.layer4 = self._make_layer(widths[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3], num_classes)

    def _make_layer(self, planes, stride):
        down = None
        if stride != 1 or self.inplanes != planes:
            down = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, down), BasicBlock(planes, planes)]
        self.inplanes = planes
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Encoder(nn.Module):
    """nn.TransformerEncoder (post-norm, gelu) over float embeddings [batch, seq, d_model]."""

    def __init__(self, layers, d_model, heads, ffn):
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=ffn, dropout=0.1, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


class LstmHead(nn.Module):
    """nn.LSTM (or nn.GRU; batch_first) + Linear head on every time step."""

    def __init__(self, inp, hidden, layers, classes, cell=nn.LSTM):
        super().__init__()
        self.lstm = cell(inp, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y)


def randomize_bn(model, gen):
    """Non-trivial BatchNorm statistics (fresh ones are mean 0, var 1: an identity)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def build(name, size):
    """(model in eval mode, tuple of input tensors) for one model at one size; seeded per model.
    bench/cpu_models_ref.py rebuilds the full-size modules through this."""
    seed = 1000 + NAMES.index(name)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    full = size == "full"
    if name in ("resnet18", "resnet18_b16"):
        m = torchvision.models.resnet18(weights=None) if full else SmallResNet18()
        randomize_bn(m, gen)
        batch = 16 if name == "resnet18_b16" else 1
        x = torch.randn(batch, 3, 224, 224, generator=gen) if full else torch.randn(2, 3, 64, 64, generator=gen)
    elif name == "mobilenet_v2":
        m = (
            torchvision.models.mobilenet_v2(weights=None)
            if full
            else torchvision.models.mobilenet_v2(weights=None, width_mult=0.25, num_classes=100)
        )
        randomize_bn(m, gen)
        x = torch.randn(1, 3, 224, 224, generator=gen) if full else torch.randn(1, 3, 64, 64, generator=gen)
    elif name == "transformer_encoder":
        layers, d, heads, ffn, seq, batch = (4, 256, 4, 1024, 128, 1) if full else (2, 64, 4, 128, 16, 2)
        m = Encoder(layers, d, heads, ffn)
        x = torch.randn(batch, seq, d, generator=gen)
    elif name in ("lstm", "gru"):
        inp, hidden, layers, classes, seq, batch = (64, 256, 2, 10, 64, 1) if full else (16, 32, 2, 5, 12, 2)
        m = LstmHead(inp, hidden, layers, classes, nn.LSTM if name == "lstm" else nn.GRU)
        x = torch.randn(batch, seq, inp, generator=gen)
    else:
        raise ValueError(name)
    return m.eval(), (x,)


def export(name, size, out_dir, exporter):
    model, (x,) = build(name, size)
    path = os.path.join(out_dir, f"{name}.onnx")
    with torch.no_grad():
        want = model(x).numpy()
    # Exported with autograd on: under no_grad, eval-mode nn.TransformerEncoderLayer takes its
    # fused fast path (aten::_transformer_encoder_layer_fwd), which has no ONNX export.
    if exporter == "dynamo":
        # torch.export-based exporter (needs onnxscript); weights stay in the one file.
        torch.onnx.export(
            model,
            (x,),
            path,
            dynamo=True,
            opset_version=DYNAMO_OPSET,
            external_data=False,
            input_names=["input_0"],
            output_names=["output_0"],
        )
    else:
        torch.onnx.export(
            model,
            (x,),
            path,
            dynamo=False,
            opset_version=OPSET,
            do_constant_folding=True,
            input_names=["input_0"],
            output_names=["output_0"],
        )
    proto = onnx.load(path)
    onnx.checker.check_model(proto)
    xin = x.numpy().astype(np.float32)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: xin})
    np.save(os.path.join(out_dir, f"{name}.input_0.npy"), xin)
    np.save(os.path.join(out_dir, f"{name}.output_0.npy"), got.astype(np.float32))
    ops = sorted({n.op_type for n in proto.graph.node})
    params = sum(int(np.prod(t.dims)) for t in proto.graph.initializer)
    diff = float(np.max(np.abs(want - got)))
    return {
        "name": name,
        "input_shape": list(xin.shape),
        "output_shape": list(got.shape),
        "params": params,
        "bytes": os.path.getsize(path),
        "ops": ops,
        "max_abs_torch_vs_ort": diff,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--size", choices=["small", "full"], default="small")
    ap.add_argument("--models", nargs="*", choices=NAMES, help="default: every model of the size")
    ap.add_argument(
        "--exporter",
        choices=["torchscript", "dynamo"],
        default="torchscript",
        help="torch.onnx.export(dynamo=False) at opset 17 (default, the committed fixtures) or the "
        "torch.export-based exporter (dynamo=True, opset 18; needs `pip install onnxscript`)",
    )
    args = ap.parse_args()
    if not args.models:
        args.models = list(NAMES if args.size == "full" else SMALL_NAMES)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    manifest = {
        "size": args.size,
        "opset": DYNAMO_OPSET if args.exporter == "dynamo" else OPSET,
        "exporter": f"torch.onnx.export(dynamo={args.exporter == 'dynamo'})",
        "torch": torch.__version__.split("+")[0],
        "torchvision": torchvision.__version__.split("+")[0],
        "onnxruntime": ort.__version__,
        "models": [],
    }
    # A partial export (`--models`) keeps the other models' entries of an existing manifest of
    # the same size and exporter.
    path = os.path.join(args.out, "manifest.json")
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("size") == manifest["size"] and old.get("exporter") == manifest["exporter"]:
            manifest["models"] = [m for m in old.get("models", []) if m.get("name") not in args.models]
    for name in args.models:
        info = export(name, args.size, args.out, args.exporter)
        manifest["models"].append(info)
        print(
            f"{name}: {info['bytes'] / 1e6:.2f} MB, {info['params']} params, in {info['input_shape']}"
            f" -> out {info['output_shape']}, |torch-ort| {info['max_abs_torch_vs_ort']:.2e}",
            file=sys.stderr,
        )
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
