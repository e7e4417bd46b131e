#!/usr/bin/env python3
"""Fixtures for oar's quantization ops from ONNX Runtime: tests/fixtures/ops/quant.json.

`quantize_linear` / `dequantize_linear` cases are ONNX QuantizeLinear / DequantizeLinear
models (opset 13) run by onnxruntime's CPU provider; `fake_quant` cases are the same
QuantizeLinear -> DequantizeLinear pair (what `fake_quant` means for an i8/u8 range and an
integer zero point). Exact: every output is compared bit for bit (tolerance 0).

    pip install -r tools/onnx_requirements.txt onnxruntime==1.32.0
    python3 tools/gen_quant_fixtures.py

rewrites the file byte-identically (fixed seed). The case format is gen_op_fixtures.py's.
"""

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "ops", "quant.json")
NAMES = {"float32": "f32", "int8": "i8", "uint8": "u8", "int32": "i32"}
ONNX_TYPES = {"float32": TensorProto.FLOAT, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8,
              "int32": TensorProto.INT32}
rng = np.random.default_rng(20261206)


def enc(a):
    a = np.asarray(a)
    flat = a.ravel()
    if a.dtype.kind == "f":
        data = []
        for v in flat:
            short = float(str(np.float32(v)))
            data.append(short if np.float32(short) == np.float32(v) else float(v))
    else:
        data = [int(v) for v in flat]
    return {"dtype": NAMES[a.dtype.name], "shape": list(a.shape), "data": data}


def run(nodes, inputs, out_dtype=np.float32, out_shape=None):
    """Run a graph of `nodes` over `inputs` (name -> array) in onnxruntime; its output `y`."""
    vi = [helper.make_tensor_value_info(n, ONNX_TYPES[a.dtype.name], list(a.shape)) for n, a in inputs.items()]
    shape = out_shape if out_shape is not None else list(next(iter(inputs.values())).shape)
    out = helper.make_tensor_value_info("y", ONNX_TYPES[np.dtype(out_dtype).name], shape)
    g = helper.make_graph(nodes, "q", vi, [out])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return s.run(["y"], inputs)[0]


CASES = []


def case(name, op, inputs, output):
    CASES.append({"name": name, "op": op, "inputs": [enc(a) for a in inputs], "outputs": [enc(output)],
                  "rtol": 0.0, "atol": 0.0})


def params(shape, zp_dtype, lo, hi):
    scale = rng.uniform(0.005, 0.05, size=shape).astype(np.float32)
    zp = rng.integers(lo, hi + 1, size=shape).astype(zp_dtype)
    return scale, zp


def ins(*arrays):
    return {f"x{i}": a for i, a in enumerate(arrays)}


def exact_matmul(a, b, za, zb):
    return ((a.astype(np.int64) - za.astype(np.int64)) @ (b.astype(np.int64) - zb.astype(np.int64))).astype(np.int32)


def exact_conv(x, w, zx, zw, stride, pad, groups):
    x = np.pad(x.astype(np.int64) - np.int64(zx), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = w.astype(np.int64) - zw.astype(np.int64).reshape(-1, 1, 1, 1)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    y = np.zeros((n, o, oh, ow), np.int64)
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(kh):
            for j in range(kw):
                patch = x[:, g * cg:(g + 1) * cg, i:i + stride * oh:stride, j:j + stride * ow:stride]
                y[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j])
    return y.astype(np.int32)


def integer_cases():
    """MatMulInteger / ConvInteger from onnxruntime, each checked against the exact integer result
    (onnxruntime's u8·s8 kernels may saturate 16-bit pair sums on x86; these cases must not), and
    requantize from its definition in numpy (f32 product, half-to-even, saturate)."""
    for name, a, b, za, zb in [
        ("u8s8", rng.integers(0, 256, [5, 33]).astype(np.uint8), rng.integers(-64, 64, [33, 7]).astype(np.int8),
         np.array(131, np.uint8), rng.integers(-5, 6, [7]).astype(np.int8)),
        ("u8u8_batched", rng.integers(0, 256, [2, 3, 16]).astype(np.uint8),
         rng.integers(0, 256, [2, 16, 4]).astype(np.uint8), np.array(7, np.uint8), np.array(200, np.uint8)),
    ]:
        y = run([helper.make_node("MatMulInteger", ["x0", "x1", "x2", "x3"], ["y"])], ins(a, b, za, zb), np.int32,
                list(a.shape[:-1]) + [b.shape[-1]])
        assert (y == exact_matmul(a, b, za, zb)).all(), f"onnxruntime MatMulInteger {name} is not exact"
        case(f"matmul_integer_{name}", {"Composite": "MatMulInteger"}, [a, b, za, zb], y)
    x = rng.integers(0, 256, [1, 4, 7, 6]).astype(np.uint8)
    w = rng.integers(0, 256, [6, 2, 3, 3]).astype(np.uint8)
    zx, zw = np.array(128, np.uint8), np.array(120, np.uint8)
    node = helper.make_node("ConvInteger", ["x0", "x1", "x2", "x3"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2], group=2)
    want = exact_conv(x, w, zx, zw, 2, 1, 2)
    g = run([node], ins(x, w, zx, zw), np.int32, list(want.shape))
    assert (g == want).all(), "onnxruntime ConvInteger is not exact"
    op = {"ConvInteger": {"stride": [2, 2], "pad_before": [1, 1], "pad_after": [1, 1], "dilation": [1, 1],
                          "groups": 2}}
    case("conv_integer_u8u8_grouped", {"Composite": op}, [x, w, zx, zw], g)
    for name, shape, axis, mshape, zdt in [("u8", [4, 6], 0, [], np.uint8), ("i8_per_axis", [3, 5], 1, [5], np.int8)]:
        acc = rng.integers(-60000, 60000, shape).astype(np.int32)
        m = rng.uniform(0.0005, 0.004, mshape).astype(np.float32)
        z = np.array(rng.integers(-20, 20) + (128 if zdt == np.uint8 else 0), zdt)
        mb = m.reshape([-1] + [1] * (len(shape) - 1 - axis)) if m.ndim else m
        v = np.round(acc.astype(np.float32) * mb).astype(np.float64) + int(z)
        info = np.iinfo(zdt)
        y = np.clip(v, info.min, info.max).astype(zdt)
        op = {"Composite": {"Requantize": {"axis": axis, "dtype": NAMES[np.dtype(zdt).name]}}}
        case(f"requantize_{name}", op, [acc, m, z], y)


def main():
    # x spans several times the quantized range, so saturation and ordinary rounding both show;
    # ties come from the exact-tie case below.
    for name, shape, axis, pshape, zdt, zr in [
        ("u8_per_tensor", [2, 3, 5], 1, [], np.uint8, (0, 255)),
        ("i8_per_tensor", [4, 6], 1, [], np.int8, (-20, 20)),
        ("i8_per_axis1", [2, 3, 4], 1, [3], np.int8, (-10, 10)),
        ("u8_per_axis0", [4, 5], 0, [4], np.uint8, (100, 150)),
    ]:
        x = rng.uniform(-6, 6, size=shape).astype(np.float32)
        s, z = params(pshape, zdt, *zr)
        q = run([helper.make_node("QuantizeLinear", ["x0", "x1", "x2"], ["y"], axis=axis)], ins(x, s, z), zdt)
        op = {"Composite": {"QuantizeLinear": {"axis": axis, "dtype": NAMES[np.dtype(zdt).name]}}}
        case(f"quantize_{name}", op, [x, s, z], q)
        info = np.iinfo(zdt)
        xq = rng.integers(max(info.min, zr[0] - 40), min(info.max, zr[1] + 40) + 1, size=shape).astype(zdt)
        y = run([helper.make_node("DequantizeLinear", ["x0", "x1", "x2"], ["y"], axis=axis)], ins(xq, s, z))
        case(f"dequantize_{name}", {"Composite": {"DequantizeLinear": {"axis": axis}}}, [xq, s, z], y)
        fq = run([helper.make_node("Cast", ["x2"], ["zi"], to=ONNX_TYPES[np.dtype(zdt).name]),
                  helper.make_node("QuantizeLinear", ["x0", "x1", "zi"], ["q"], axis=axis),
                  helper.make_node("DequantizeLinear", ["q", "x1", "zi"], ["y"], axis=axis)],
                 ins(x, s, z.astype(np.float32)))
        op = {"Composite": {"FakeQuant": {"axis": axis, "qmin": int(info.min), "qmax": int(info.max)}}}
        case(f"fake_quant_{name}", op, [x, s, z.astype(np.float32)], fq)
    # Exact ties (x / 0.25 = k + 0.5) round to even.
    x = (np.arange(-12, 12, dtype=np.float32) + 0.5) * np.float32(0.25)
    s = np.array(0.25, dtype=np.float32)
    z = np.array(-3, dtype=np.int8)
    q = run([helper.make_node("QuantizeLinear", ["x0", "x1", "x2"], ["y"])], ins(x, s, z), np.int8)
    case("quantize_i8_ties", {"Composite": {"QuantizeLinear": {"axis": 0, "dtype": "i8"}}}, [x, s, z], q)
    # int32 input (a bias) without a zero point.
    xi = rng.integers(-(1 << 20), 1 << 20, size=[7]).astype(np.int32)
    s = np.array(0.0007, dtype=np.float32)
    y = run([helper.make_node("DequantizeLinear", ["x0", "x1"], ["y"])], ins(xi, s))
    case("dequantize_i32", {"Composite": {"DequantizeLinear": {"axis": 0}}}, [xi, s], y)
    integer_cases()
    body = ",\n".join(json.dumps(c, separators=(",", ":"), allow_nan=False) for c in CASES)
    with open(OUT, "w", newline="\n") as f:
        f.write("[\n" + body + "\n]\n")
    print(f"wrote {len(CASES)} cases to {os.path.normpath(OUT)} (onnxruntime {ort.__version__})")


if __name__ == "__main__":
    main()
