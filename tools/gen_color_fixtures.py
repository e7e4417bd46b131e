#!/usr/bin/env python3
"""Fixtures for `oar::vision::transforms::ColorAdjust` (tests/framework/vision_transforms.rs).

Writes tests/fixtures/transforms/color.json: a seeded 3-channel and a 1-channel float image in
[0, 1] and torchvision's `adjust_brightness`, `adjust_contrast`, `adjust_saturation` and
`adjust_hue` of them at fixed factors (torchvision's tensor implementations). Needs torch and
torchvision; CI only reads the JSON.

    python3 tools/gen_color_fixtures.py
"""
import json
import os

import numpy as np
import torch
import torchvision
import torchvision.transforms.functional as F

rng = np.random.default_rng(20261207)
rgb = rng.uniform(0.0, 1.0, size=(3, 5, 7)).astype(np.float32)
# A gray pixel (r = g = b) and pure primaries exercise the hue conversion's edge cases.
rgb[:, 0, 0] = 0.5
rgb[:, 0, 1] = [1.0, 0.0, 0.0]
rgb[:, 0, 2] = [0.0, 1.0, 0.0]
rgb[:, 0, 3] = [0.0, 0.0, 1.0]
gray = rng.uniform(0.0, 1.0, size=(1, 5, 7)).astype(np.float32)

adjust = {
    "brightness": F.adjust_brightness,
    "contrast": F.adjust_contrast,
    "saturation": F.adjust_saturation,
    "hue": F.adjust_hue,
}
factors = {
    "brightness": [0.6, 1.3],
    "contrast": [0.4, 1.5],
    "saturation": [0.2, 1.7],
    "hue": [-0.35, 0.2],
}
cases = []
for name, fs in factors.items():
    for f in fs:
        out = adjust[name](torch.from_numpy(rgb), f).numpy()
        cases.append({"adjust": name, "factor": f, "image": "rgb", "out": out.tolist()})
for name in ("brightness", "contrast"):
    out = adjust[name](torch.from_numpy(gray), 1.4).numpy()
    cases.append({"adjust": name, "factor": 1.4, "image": "gray", "out": out.tolist()})

path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "transforms", "color.json")
with open(path, "w") as f:
    json.dump({"rgb": rgb.tolist(), "gray": gray.tolist(), "cases": cases}, f)
print(f"wrote {os.path.normpath(path)} (torch {torch.__version__}, torchvision {torchvision.__version__})")
