#!/usr/bin/env python3
"""Paddle's vision models (LeNet, MobileNetV1) as oar state dicts, with inputs and logits.

The companion of tools/torchvision_to_oar.py for the zoo models whose reference is
`paddle.vision.models` rather than torchvision. For each case this builds the Paddle model with
seeded random weights (batch norms get random affine parameters and running statistics, so they
are not the identity), rounds every weight to float16, runs the model in eval mode on a seeded
input and writes
    OUT/<case>.safetensors      the weights under oar's names (`oar::Model::load` reads it)
    OUT/<case>.io.safetensors   `input` and `logits`
oar's LeNet and MobileNetV1 use Paddle's parameter names and layouts (Linear weights [in, out],
batch-norm statistics `_mean` / `_variance`), so the state dict is written as it is.

    python3 tools/paddle_to_oar.py            # the small committed fixtures (tests/fixtures/zoo)
    python3 tools/paddle_to_oar.py --all OUT  # MobileNetV1 at scale 1.0, 1000 classes, into OUT

The Rust test `zoo::committed_paddle_fixtures_match` reads the first;
`OAR_ZOO_DIR=OUT cargo test --release -p oar --test framework -- --ignored zoo::` the second.
Needs paddlepaddle (3.3.1 was used), numpy and safetensors.
"""
import argparse
import os
import sys

import numpy as np
import paddle
from paddle.vision.models import LeNet, MobileNetV1
from safetensors.numpy import save_file


def small_cases():
    """Committed as fixtures: LeNet as it is (it is small) and MobileNetV1 at scale 0.25."""
    return {
        "paddle_lenet": (lambda: LeNet(num_classes=10), (2, 1, 28, 28)),
        "paddle_mobilenet_v1_025": (lambda: MobileNetV1(scale=0.25, num_classes=10), (2, 3, 32, 32)),
    }


def full_cases():
    return {"paddle_mobilenet_v1": (lambda: MobileNetV1(scale=1.0, num_classes=1000), (1, 3, 224, 224))}


def randomize(model, rng):
    """Random values for every parameter and batch-norm statistic, rounded to float16."""
    for name, t in model.state_dict().items():
        if name.endswith("_variance"):
            v = rng.uniform(0.5, 1.5, t.shape)
        elif name.endswith("_mean"):
            v = rng.normal(0.0, 0.1, t.shape)
        elif name.endswith(".bias"):
            v = rng.normal(0.0, 0.1, t.shape)
        elif len(t.shape) == 1:  # batch-norm scales
            v = rng.uniform(0.5, 1.5, t.shape)
        else:
            fan_in = int(np.prod(t.shape[1:])) if len(t.shape) == 4 else t.shape[0]
            v = rng.normal(0.0, 1.0 / np.sqrt(fan_in), t.shape)
        t.set_value(v.astype(np.float16).astype(np.float32))


def convert(name, make, shape, out_dir, seed):
    paddle.seed(seed)
    rng = np.random.default_rng(seed)
    model = make()
    model.eval()
    randomize(model, rng)
    x = rng.standard_normal(shape).astype(np.float32)
    with paddle.no_grad():
        y = model(paddle.to_tensor(x)).numpy().astype(np.float32)
    weights = {k: v.numpy().astype(np.float16) for k, v in model.state_dict().items()}
    save_file(weights, os.path.join(out_dir, f"{name}.safetensors"))
    save_file({"input": x, "logits": y}, os.path.join(out_dir, f"{name}.io.safetensors"))
    params = sum(int(np.prod(p.shape)) for p in model.parameters())
    print(f"{name}: {params} parameters, output {tuple(y.shape)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", metavar="OUT", help="convert the full-size models into OUT")
    args = ap.parse_args()
    paddle.set_device("cpu")
    if args.all:
        cases, out = full_cases(), args.all
    else:
        cases = small_cases()
        out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "zoo")
    os.makedirs(out, exist_ok=True)
    for i, (name, (make, shape)) in enumerate(sorted(cases.items())):
        convert(name, make, shape, out, 2000 + i)
    print(f"wrote {os.path.normpath(out)} (paddle {paddle.__version__})", file=sys.stderr)


if __name__ == "__main__":
    main()
