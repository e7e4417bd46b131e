#!/usr/bin/env python3
"""Convert torchvision models' weights to oar state dicts, with inputs and logits to compare.

For each case (a torchvision model, a configuration, an input size) this builds the model with
seeded random weights (batch norms get random affine parameters and running statistics, so they
are not the identity), runs it in eval mode on a seeded input, and writes
    OUT/<case>.safetensors      the weights under oar's names (`oar::Model::load` reads it)
    OUT/<case>.io.safetensors   `input` and `logits`
oar's names are torchvision's, except that batch norms' running statistics are `_mean` and
`_variance` (Paddle's), `num_batches_tracked` is dropped, Linear weights are stored [in, out]
and ViT's attention `in_proj_weight` / `in_proj_bias` are split into `q_proj`, `k_proj` and
`v_proj` (see `rename` below).

    python3 tools/torchvision_to_oar.py             # the small committed fixtures (tests/fixtures/zoo)
    python3 tools/torchvision_to_oar.py --all OUT   # every zoo model at full size, into OUT

The Rust test `zoo::committed_torchvision_fixtures_match` reads the first;
`OAR_ZOO_DIR=OUT cargo test --release -p oar --test framework -- --ignored zoo::` the second.
Weights are written as float16 values (the torch model runs on the same float16-rounded values in
float32), which halves the committed files. Needs torch, torchvision, numpy and safetensors.
"""
import argparse
import os
import sys

import numpy as np
import torch
import torchvision.models as M
from safetensors.numpy import save_file
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet


def small_cases():
    """Small configurations of each family: committed as fixtures."""
    return {
        "densenet_tiny": (
            lambda: M.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2, num_classes=10),
            (2, 3, 32, 32),
        ),
        "shufflenet_v2_tiny": (lambda: M.ShuffleNetV2([1, 1, 1], [8, 16, 32, 64, 128], num_classes=10), (2, 3, 32, 32)),
        "mobilenet_v3_small_025": (lambda: M.mobilenet_v3_small(width_mult=0.25, num_classes=10), (2, 3, 32, 32)),
        "mobilenet_v2_025": (lambda: M.mobilenet_v2(width_mult=0.25, num_classes=10), (2, 3, 32, 32)),
        "vit_tiny": (
            lambda: M.VisionTransformer(
                image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
            ),
            (2, 3, 32, 32),
        ),
    }


def full_cases():
    """Every torchvision model of the zoo at its standard size (1000 classes)."""
    img = (1, 3, 224, 224)
    cases = {
        name: (getattr(M, name), img)
        for name in [
            "alexnet", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn",
            "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "wide_resnet50_2",
            "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
            "shufflenet_v2_x1_5", "shufflenet_v2_x2_0", "squeezenet1_0", "squeezenet1_1", "densenet121", "vit_b_16",
        ]
    }
    cases["googlenet"] = (lambda: M.googlenet(aux_logits=False, init_weights=True), img)
    cases["inception_v3"] = (lambda: M.inception_v3(aux_logits=True, init_weights=True), (1, 3, 299, 299))
    cases["fcn_resnet50"] = (
        lambda: M.segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=True),
        (1, 3, 224, 224),
    )
    return cases


def randomize_norms(model, gen):
    """Random batch-norm parameters and statistics (torchvision initializes them to identity),
    and random values for parameters initialized to zero (biases, ViT's head and class token),
    so that every weight matters to the logits."""
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            c = m.num_features
            m.weight.data = torch.rand(c, generator=gen) + 0.5
            m.bias.data = torch.randn(c, generator=gen) * 0.1
            m.running_mean.data = torch.randn(c, generator=gen) * 0.1
            m.running_var.data = torch.rand(c, generator=gen) + 0.5


def rename(model):
    """The model's state dict under oar's names and layouts, as float32 numpy arrays."""
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    out = {}
    for k, v in model.state_dict().items():
        if k.endswith("num_batches_tracked"):
            continue
        v = v.detach().float().numpy()
        if k in linear:
            v = v.T
        if k.endswith(".in_proj_weight") or k.endswith(".in_proj_bias"):
            # torch.nn.MultiheadAttention packs q, k, v; oar keeps three Linear layers ([in, out]).
            prefix, kind = k.rsplit(".in_proj_", 1)
            for name, part in zip(("q_proj", "k_proj", "v_proj"), np.split(v, 3, axis=0)):
                out[f"{prefix}.{name}.{kind}"] = np.ascontiguousarray(part.T if kind == "weight" else part)
            continue
        k = k.replace(".running_mean", "._mean").replace(".running_var", "._variance")
        out[k] = np.ascontiguousarray(v)
    return out


def convert(name, make, shape, out_dir, seed):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = make().eval()
    randomize_norms(model, gen)
    # Round every weight to float16 so the committed file can hold it exactly.
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())
    x = torch.randn(shape, generator=gen)
    with torch.no_grad():
        y = model(x)
        if isinstance(y, dict):  # segmentation models: the main output
            y = y["out"]
        elif hasattr(y, "logits"):
            y = y.logits
    weights = {k: v.astype(np.float16) for k, v in rename(model).items()}
    save_file(weights, os.path.join(out_dir, f"{name}.safetensors"))
    save_file(
        {"input": x.numpy(), "logits": y.numpy().astype(np.float32)},
        os.path.join(out_dir, f"{name}.io.safetensors"),
    )
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {params} parameters, output {tuple(y.shape)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", metavar="OUT", help="convert every zoo model at full size into OUT")
    ap.add_argument("--only", nargs="*", help="convert only these cases")
    args = ap.parse_args()
    if args.all:
        cases, out = full_cases(), args.all
    else:
        cases = small_cases()
        out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "zoo")
    os.makedirs(out, exist_ok=True)
    for i, (name, (make, shape)) in enumerate(sorted(cases.items())):
        if args.only and name not in args.only:
            continue
        convert(name, make, shape, out, 1000 + i)
    print(f"wrote {os.path.normpath(out)} (torch {torch.__version__})", file=sys.stderr)


if __name__ == "__main__":
    main()
