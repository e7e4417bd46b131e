#!/usr/bin/env python3
"""Fixtures for `oar::vision::transforms` (tests/framework/vision_transforms.rs).

Writes tests/fixtures/transforms/transforms.json: a seeded 3-channel image and
- its bilinear resizes (half-pixel centers, no antialiasing: torchvision's tensor `Resize`
  with `antialias=False`, PyTorch's `interpolate(mode="bilinear", align_corners=False)`)
  computed by onnxruntime's `Resize` (mode linear, coordinate_transformation_mode half_pixel)
  to a larger and a smaller size;
- its paddings by numpy.pad in constant, edge and reflect modes.
Needs numpy, onnx and onnxruntime (tools/onnx_requirements.txt); CI only reads the JSON.

    python3 tools/gen_transform_fixtures.py
"""
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

rng = np.random.default_rng(20261206)
img = rng.uniform(0.0, 1.0, size=(3, 5, 7)).astype(np.float32)


def resize(x, h, w):
    node = helper.make_node(
        "Resize", ["x", "", "", "sizes"], ["y"], mode="linear", coordinate_transformation_mode="half_pixel"
    )
    graph = helper.make_graph(
        [node],
        "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("sizes", TensorProto.INT64, [4], [1, 3, h, w])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x[None]})[0][0]


out = {
    "image": img.tolist(),
    "resize_up": {"size": [8, 11], "out": resize(img, 8, 11).tolist()},
    "resize_down": {"size": [3, 4], "out": resize(img, 3, 4).tolist()},
    # Padding (top, left, bottom, right) = (1, 2, 2, 1).
    "pad": {
        "padding": [1, 2, 2, 1],
        "constant": np.pad(img, ((0, 0), (1, 2), (2, 1)), mode="constant", constant_values=0.5).tolist(),
        "edge": np.pad(img, ((0, 0), (1, 2), (2, 1)), mode="edge").tolist(),
        "reflect": np.pad(img, ((0, 0), (1, 2), (2, 1)), mode="reflect").tolist(),
    },
}
path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "transforms", "transforms.json")
with open(path, "w") as f:
    json.dump(out, f)
print(f"wrote {os.path.normpath(path)} (onnxruntime {ort.__version__}, onnx {onnx.__version__})")
