#!/usr/bin/env python3
"""Small CNNs quantized by ONNX Runtime, for oar's import tests: onnx/tests/models/quant/.

A float CNN (Conv 3->8 3x3 pad 1, Relu, MaxPool 2x2, Conv 8->16 3x3 stride 2, Relu, Reshape,
MatMul 256->10, Add) is built from seeded numpy weights, then quantized by
`onnxruntime.quantization.quantize_static` over 16 seeded calibration images in three forms:

  cnn_qdq_s8s8    QDQ, int8 activations and weights (per-channel weights)
  cnn_qdq_u8s8    QDQ, uint8 activations, int8 weights
  cnn_qop_u8s8    QOperator (QLinearConv / QLinearMatMul / com.microsoft.QLinearAdd), with
                  reduce_range (7-bit weights)

The QOperator model uses `reduce_range=True` because onnxruntime's own U8S8 QLinearConv sums
pairs of u8·s8 products in saturating 16 bits (`vpmaddubsw`) on x86: without reduce_range its
output on this model differs from the exact integer result in 283 of 4096 first-layer values
(by up to 46 steps — reproduced bit for bit by emulating the saturation in numpy), while oar
computes the exact sums. With 7-bit weights no pair can saturate, so both are exact.

Each is written with a test input and onnxruntime's output on it (`NAME.onnx`,
`NAME.input_0.npy`, `NAME.output_0.npy`), and `manifest.json` records, per model, the scale of
the quantized tensor its output is dequantized from: oar's output must be within one such step
of onnxruntime's (the tests' tolerance).

    pip install -r tools/onnx_requirements.txt onnxruntime==1.32.0
    python3 tools/export_quant_models.py
"""

import json
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_static)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "onnx", "tests", "models", "quant")
rng = np.random.default_rng(20261206)
N = 2


def float_model():
    def w(name, shape, fan_in):
        return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)

    inits = [w("w1", [8, 3, 3, 3], 27), numpy_helper.from_array(rng.uniform(-0.1, 0.1, 8).astype(np.float32), "b1"),
             w("w2", [16, 8, 3, 3], 72), numpy_helper.from_array(rng.uniform(-0.1, 0.1, 16).astype(np.float32), "b2"),
             w("w3", [256, 10], 256), numpy_helper.from_array(rng.uniform(-0.1, 0.1, 10).astype(np.float32), "b3"),
             numpy_helper.from_array(np.array([N, 256], dtype=np.int64), "shape")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Reshape", ["r2", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "w3"], ["m"]),
        helper.make_node("Add", ["m", "b3"], ["y"]),
    ]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


class Images(CalibrationDataReader):
    def __init__(self, n):
        self.batches = iter([{"x": rng.uniform(-1, 1, [N, 3, 16, 16]).astype(np.float32)} for _ in range(n)])

    def get_next(self):
        return next(self.batches, None)


def output_step(m):
    """The scale of the quantized tensor the graph output is dequantized from."""
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    out = m.graph.output[0].name
    for n in m.graph.node:
        if out in n.output and n.op_type == "DequantizeLinear":
            return float(inits[n.input[1]])
    raise SystemExit(f"{out} is not produced by a DequantizeLinear")


def main():
    os.makedirs(OUT, exist_ok=True)
    fm = float_model()
    x = rng.uniform(-1, 1, [N, 3, 16, 16]).astype(np.float32)
    manifest = {"onnxruntime": ort.__version__, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "cnn.onnx")
        onnx.save(fm, src)
        for name, fmt, act, rr in [("cnn_qdq_s8s8", QuantFormat.QDQ, QuantType.QInt8, False),
                                   ("cnn_qdq_u8s8", QuantFormat.QDQ, QuantType.QUInt8, False),
                                   ("cnn_qop_u8s8", QuantFormat.QOperator, QuantType.QUInt8, True)]:
            dst = os.path.join(OUT, f"{name}.onnx")
            quantize_static(src, dst, Images(16), quant_format=fmt, activation_type=act, weight_type=QuantType.QInt8,
                            per_channel=True, reduce_range=rr)
            m = onnx.load(dst)
            onnx.checker.check_model(m, full_check=True)
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            s = ort.InferenceSession(dst, opts, providers=["CPUExecutionProvider"])
            y = s.run(None, {"x": x})[0]
            np.save(os.path.join(OUT, f"{name}.input_0.npy"), x)
            np.save(os.path.join(OUT, f"{name}.output_0.npy"), y)
            ops = sorted({n.op_type for n in m.graph.node})
            manifest["models"][name] = {"output_step": output_step(m), "ops": ops, "reduce_range": rr}
            print(name, ops)
    with open(os.path.join(OUT, "manifest.json"), "w", newline="\n") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
