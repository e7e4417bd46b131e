#!/usr/bin/env python3
"""Top-1 agreement of bf16/f16 autocast with f32 on oar's AMP test ResNet-18, in PyTorch.

The Rust test `amp::dump_resnet18_for_torch` (ignored by default) writes the network's weights
(fixed random values), its 1024 input images and oar's own f32/bf16/f16 logits to
`$OAR_AMP_DUMP/resnet18_amp.safetensors`. This script loads the weights into torchvision's
resnet18 (oar's Linear weight is [in, out], torch's [out, in]), runs it in f32 and under
`torch.autocast("cpu", dtype)` and prints, for both frameworks, the largest logit error relative
to the largest logit and the number of images whose top-1 class is unchanged.

    OAR_AMP_DUMP=/tmp/amp cargo test --release -p oar --test framework -- --ignored \
        amp::dump_resnet18_for_torch
    python3 tools/amp_resnet_torch.py /tmp/amp/resnet18_amp.safetensors

Needs torch and torchvision (tools/requirements.txt); reads safetensors without the package.
"""
import json
import struct
import sys

import numpy as np
import torch
import torchvision

DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], dtype=DTYPES[meta["dtype"]]).reshape(meta["shape"])
    return out


def compare(full, low):
    err = np.abs(full - low).max() / np.abs(full).max()
    agree = int((full.argmax(1) == low.argmax(1)).sum())
    return err, agree


def main():
    t = read_safetensors(sys.argv[1])
    model = torchvision.models.resnet18(num_classes=10).eval()
    state = {}
    for name, v in t.items():
        if name.startswith("@"):
            continue
        key = name.replace("._mean", ".running_mean").replace("._variance", ".running_var")
        if key == "fc.weight":
            v = v.T
        state[key] = torch.from_numpy(np.array(v))
    missing = model.load_state_dict(state, strict=False)
    assert not missing.unexpected_keys, missing
    assert all(k.endswith("num_batches_tracked") for k in missing.missing_keys), missing
    images = torch.from_numpy(np.array(t["@images"]))
    with torch.no_grad():
        full = model(images).numpy()
        oar_full = t["@logits/f32"]
        print(f"f32: oar vs torch logits differ by {np.abs(full - oar_full).max() / np.abs(full).max():.1e}")
        n = images.shape[0]
        for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16)):
            with torch.autocast("cpu", dtype=dtype):
                low = model(images).float().numpy()
            err, agree = compare(full, low)
            oerr, oagree = compare(oar_full, t[f"@logits/{name}"])
            print(f"{name}: torch autocast error {err:.1e}, top-1 {agree}/{n}; "
                  f"oar auto_cast error {oerr:.1e}, top-1 {oagree}/{n}")


if __name__ == "__main__":
    main()
