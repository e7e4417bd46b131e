#!/usr/bin/env python3
"""Fixtures for `oar::vision::image` (tests/framework/vision_transforms.rs): small PNG and JPEG
files written by Pillow and the pixels Pillow decodes from them.

Writes tests/fixtures/images/{rgb.png, gray.png, rgba.png, rgb.jpg, pixels.json}. Needs numpy
and Pillow (`pip install pillow`); CI only reads the committed files.

    python3 tools/gen_image_fixtures.py
"""
import json
import os

import numpy as np
from PIL import Image

rng = np.random.default_rng(20261206)
d = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "images")
os.makedirs(d, exist_ok=True)
h, w = 7, 9
# A smooth picture (JPEG keeps it close) with some noise.
yy, xx = np.mgrid[0:h, 0:w]
rgb = np.stack([xx * 25, yy * 30, (xx + yy) * 12], axis=-1).astype(np.int64) + rng.integers(0, 6, size=(h, w, 3))
rgb = np.clip(rgb, 0, 255).astype(np.uint8)
gray = rgb[..., 0]
rgba = np.concatenate([rgb, rng.integers(0, 256, size=(h, w, 1), dtype=np.uint8)], axis=-1)
Image.fromarray(rgb, "RGB").save(os.path.join(d, "rgb.png"))
Image.fromarray(gray, "L").save(os.path.join(d, "gray.png"))
Image.fromarray(rgba, "RGBA").save(os.path.join(d, "rgba.png"))
Image.fromarray(rgb, "RGB").save(os.path.join(d, "rgb.jpg"), quality=90)
decoded = np.asarray(Image.open(os.path.join(d, "rgb.jpg")).convert("RGB"))
with open(os.path.join(d, "pixels.json"), "w") as f:
    json.dump(
        {
            "shape": [h, w],
            "rgb": rgb.ravel().tolist(),
            "gray": gray.ravel().tolist(),
            "rgba": rgba.ravel().tolist(),
            "jpeg_rgb": decoded.ravel().tolist(),
        },
        f,
    )
print("wrote", os.path.normpath(d))
