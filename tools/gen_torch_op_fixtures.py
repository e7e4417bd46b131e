#!/usr/bin/env python3
"""PyTorch fixtures for the ops segmentation, detection and generative models need:
tests/fixtures/ops/torch_*.json, in the format of tools/gen_op_fixtures.py (read by
tests/framework/op_fixtures.rs against the reference backend, the oracle every backend is
checked against).

    pip install torch numpy && python3 tools/gen_torch_op_fixtures.py

Inputs are drawn with a fixed seed and stored in the files; expected outputs are PyTorch's
(CPU, the input dtype), so the fixtures pin oar's semantics to PyTorch's. Where oar follows ONNX
instead (negative one_hot indices, asymmetric transposed-conv padding), the expected value is
built from PyTorch ops as noted beside the case. Tolerances: the fixture's rtol/atol per case.
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_op_fixtures import enc  # noqa: E402  (same tensor encoding)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "ops")
rng = np.random.default_rng(20261201)
TOL_F32 = (1e-5, 1e-6)
TOL_ACC32 = (2e-5, 2e-6)
TOL_F64 = (1e-12, 1e-12)
EXACT = (0.0, 0.0)
FILES = {}


def case(family, name, op, inputs, outputs, tol):
    c = {"name": name, "op": op, "inputs": [enc(np.asarray(i)) for i in inputs],
         "outputs": [enc(np.asarray(o)) for o in outputs], "rtol": tol[0], "atol": tol[1]}
    FILES.setdefault(family, []).append(c)


def f32(*shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def f64(*shape):
    return rng.uniform(-1, 1, shape)


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def comp(name, attrs):
    return {"Composite": {name: attrs}}


# ---- conv_transpose -------------------------------------------------------------------

def conv_transpose(name, x, w, b, stride, pb, pa, out_pad, dil, groups):
    """PyTorch pads symmetrically; oar (and ONNX) crop `pb` before and `pa` after: the full
    (padding 0) transposed convolution, cropped."""
    fn = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}[x.ndim]
    y = fn(t(x), t(w), None if b is None else t(b), stride=stride, padding=0,
           output_padding=out_pad, groups=groups, dilation=dil)
    sl = [slice(None), slice(None)] + [slice(p, y.shape[2 + i] - q) for i, (p, q) in enumerate(zip(pb, pa))]
    y = y[tuple(sl)]
    op = comp("ConvTranspose", {"stride": list(stride), "pad_before": list(pb), "pad_after": list(pa),
                                "output_padding": list(out_pad), "dilation": list(dil), "groups": groups})
    ins = [x, w] + ([] if b is None else [b])
    case("torch_conv_transpose", name, op, ins, [y.numpy()], TOL_ACC32 if x.dtype == np.float32 else TOL_F64)


conv_transpose("1d_stride2_outpad", f32(2, 3, 5), f32(3, 4, 3), f32(4), [2], [1], [1], [1], [1], 1)
conv_transpose("2d_groups_dilation", f32(1, 4, 4, 3), f32(4, 3, 3, 2), None, [1, 2], [1, 0], [0, 1], [0, 1], [2, 1], 2)
conv_transpose("2d_symmetric_f64", f64(2, 2, 3, 3), f64(2, 3, 2, 2), f64(3), [2, 2], [1, 1], [1, 1], [1, 1], [1, 1], 1)
conv_transpose("3d", f32(1, 2, 2, 3, 2), f32(2, 2, 2, 3, 2), None, [1, 2, 1], [0, 1, 0], [0, 1, 0], [0, 1, 0], [1, 1, 1], 1)


# ---- resize ---------------------------------------------------------------------------

def resize(name, x, sizes, mode, coordinate, nearest, torch_mode, align_corners=None):
    y = F.interpolate(t(x), size=tuple(sizes), mode=torch_mode, align_corners=align_corners)
    op = comp("Resize", {"sizes": list(sizes), "scales": [], "mode": mode, "coordinate": coordinate,
                         "nearest": nearest, "cubic_a": -0.75, "exclude_outside": False})
    tol = TOL_ACC32 if x.dtype == np.float32 else TOL_F64
    case("torch_resize", name, op, [x], [y.numpy()], EXACT if mode == "Nearest" else tol)


resize("nearest_up", f32(1, 2, 3, 4), [6, 5], "Nearest", "Asymmetric", "Floor", "nearest")
resize("nearest_down", f32(1, 1, 7, 5), [3, 2], "Nearest", "Asymmetric", "Floor", "nearest")
resize("nearest_exact", f32(2, 1, 5), [7], "Nearest", "HalfPixel", "RoundPreferCeil", "nearest-exact")
resize("bilinear_up_down", f32(2, 1, 4, 5), [7, 3], "Linear", "HalfPixel", "Floor", "bilinear", False)
resize("bilinear_align_corners", f64(1, 2, 3, 4), [5, 9], "Linear", "AlignCorners", "Floor", "bilinear", True)
resize("bicubic_half_pixel", f32(1, 2, 5, 4), [8, 6], "Cubic", "HalfPixel", "Floor", "bicubic", False)
resize("bicubic_align_corners", f32(1, 1, 4, 4), [7, 3], "Cubic", "AlignCorners", "Floor", "bicubic", True)
resize("linear_1d", f32(2, 3, 6), [4], "Linear", "HalfPixel", "Floor", "linear", False)
resize("trilinear", f32(1, 1, 2, 3, 2), [3, 4, 5], "Linear", "HalfPixel", "Floor", "trilinear", False)


# ---- group_norm, instance_norm --------------------------------------------------------

x = f32(2, 6, 3, 2)
w, b = f32(6), f32(6)
case("torch_norm", "group_norm_affine", comp("GroupNorm", {"num_groups": 3, "epsilon": 1e-5}), [x, w, b],
     [F.group_norm(t(x), 3, t(w), t(b), 1e-5).numpy()], TOL_ACC32)
x = f64(3, 4, 5)
case("torch_norm", "group_norm_plain_f64", comp("GroupNorm", {"num_groups": 2, "epsilon": 1e-5}), [x],
     [F.group_norm(t(x), 2, eps=1e-5).numpy()], TOL_F64)
x = f32(2, 4, 3)
case("torch_norm", "group_norm_one_group", comp("GroupNorm", {"num_groups": 1, "epsilon": 1e-3}), [x],
     [F.group_norm(t(x), 1, eps=1e-3).numpy()], TOL_ACC32)
x, w, b = f32(2, 3, 4, 3), f32(3), f32(3)
case("torch_norm", "instance_norm_affine", comp("InstanceNorm", {"epsilon": 1e-5}), [x, w, b],
     [F.instance_norm(t(x), weight=t(w), bias=t(b), eps=1e-5).numpy()], TOL_ACC32)
x = f64(2, 3, 5)
case("torch_norm", "instance_norm_1d_f64", comp("InstanceNorm", {"epsilon": 1e-5}), [x],
     [F.instance_norm(t(x), eps=1e-5).numpy()], TOL_F64)


# ---- border_pad -----------------------------------------------------------------------

def border_pad(name, x, before, after, mode, torch_mode):
    # torch.nn.functional.pad lists (before, after) from the last axis backwards.
    pads = []
    for b, a in zip(reversed(before), reversed(after)):
        pads += [b, a]
    while len(pads) > 2 and pads[-1] == 0 and pads[-2] == 0:
        pads = pads[:-2]
    y = F.pad(t(x), tuple(pads), mode=torch_mode)
    op = comp("BorderPad", {"before": list(before), "after": list(after), "mode": mode})
    case("torch_pad", name, op, [x], [y.numpy()], EXACT)


border_pad("reflect_2d", f32(2, 3, 4, 5), [0, 0, 2, 1], [0, 0, 1, 3], "Reflect", "reflect")
border_pad("reflect_1d", f32(1, 2, 6), [0, 0, 5], [0, 0, 4], "Reflect", "reflect")
border_pad("replicate_1d", f32(2, 2, 4), [0, 0, 3], [0, 0, 2], "Replicate", "replicate")
border_pad("replicate_3d", f32(1, 1, 2, 3, 2), [0, 0, 1, 2, 0], [0, 0, 2, 0, 3], "Replicate", "replicate")
border_pad("circular_2d", f32(1, 2, 3, 4), [0, 0, 1, 2], [0, 0, 3, 4], "Circular", "circular")


# ---- cumsum ---------------------------------------------------------------------------

def cumsum(name, x, axis, exclusive, reverse, tol):
    y = t(x)
    if reverse:
        y = y.flip(axis)
    s = torch.cumsum(y, axis)
    if exclusive:  # the sum strictly before: shift by one, zero first
        s = torch.cat([torch.zeros_like(s.narrow(axis, 0, 1)), s.narrow(axis, 0, s.shape[axis] - 1)], axis)
    if reverse:
        s = s.flip(axis)
    # PyTorch widens integer sums to int64; oar keeps the input dtype (ONNX CumSum).
    s = s.to(t(x).dtype)
    op = comp("CumSum", {"axis": axis, "exclusive": exclusive, "reverse": reverse})
    case("torch_cumsum", name, op, [x], [s.numpy()], tol)


cumsum("f32_axis1", f32(3, 7, 2), 1, False, False, TOL_ACC32)
cumsum("f64_exclusive_reverse", f64(9, 2), 0, True, True, TOL_F64)
cumsum("i32_reverse", rng.integers(-20, 21, (2, 5)).astype(np.int32), 1, False, True, EXACT)
cumsum("i64_exclusive", rng.integers(-9, 10, (4, 3)).astype(np.int64), 0, True, False, EXACT)


# ---- sort, argsort, topk --------------------------------------------------------------

x = f32(3, 6)
x[0, 1] = np.nan
x[1, 2] = x[1, 4] = 0.5
x[2, 0], x[2, 3] = -0.0, 0.0
v, i = torch.sort(t(x), dim=1, descending=False, stable=True)
case("torch_sort", "sort_f32_ties_nan", {"Sort": {"axis": 1, "descending": False}}, [x], [v.numpy(), i.numpy()], EXACT)
x = f64(5, 3)
v, i = torch.sort(t(x), dim=0, descending=True, stable=True)
case("torch_sort", "sort_f64_descending", {"Sort": {"axis": 0, "descending": True}}, [x], [v.numpy(), i.numpy()], EXACT)
x = rng.integers(-3, 4, (2, 7)).astype(np.int64)
v, i = torch.sort(t(x), dim=1, descending=True, stable=True)
case("torch_sort", "sort_i64_descending_ties", {"Sort": {"axis": 1, "descending": True}}, [x], [v.numpy(), i.numpy()], EXACT)
x = f32(6, 2)
case("torch_sort", "argsort_f32", comp("ArgSort", {"axis": 0, "descending": False}), [x],
     [torch.argsort(t(x), dim=0, descending=False, stable=True).numpy()], EXACT)
x = rng.integers(-3, 4, (2, 5)).astype(np.int64)
case("torch_sort", "argsort_i64_descending", comp("ArgSort", {"axis": 1, "descending": True}), [x],
     [torch.argsort(t(x), dim=1, descending=True, stable=True).numpy()], EXACT)
x = f32(4, 7)
v, i = torch.topk(t(x), 3, dim=1, largest=True, sorted=True)
case("torch_sort", "topk_f32_largest", comp("TopK", {"k": 3, "axis": 1, "largest": True}), [x], [v.numpy(), i.numpy()], EXACT)
x = f64(5, 3)
v, i = torch.topk(t(x), 2, dim=0, largest=False, sorted=True)
case("torch_sort", "topk_f64_smallest", comp("TopK", {"k": 2, "axis": 0, "largest": False}), [x], [v.numpy(), i.numpy()], EXACT)
# With ties torch.topk's order among equals is unspecified; oar keeps the earlier element
# first, which is PyTorch's stable sort followed by a slice.
x = rng.integers(-2, 3, (3, 6)).astype(np.int32)
v, i = torch.sort(t(x), dim=1, descending=True, stable=True)
case("torch_sort", "topk_i32_ties", comp("TopK", {"k": 4, "axis": 1, "largest": True}), [x],
     [v[:, :4].numpy(), i[:, :4].numpy()], EXACT)


# ---- masked_fill, one_hot -------------------------------------------------------------

x, m = f32(2, 3, 4), rng.integers(0, 2, (3, 1)).astype(bool)
case("torch_select", "masked_fill_broadcast", comp("MaskedFill", {"value": -1e4}), [x, m],
     [t(x).masked_fill(t(m), -1e4).numpy()], EXACT)
x, m = rng.integers(-5, 6, (4, 3)).astype(np.int32), rng.integers(0, 2, (4, 3)).astype(bool)
case("torch_select", "masked_fill_i32", comp("MaskedFill", {"value": 7.0}), [x, m],
     [t(x).masked_fill(t(m), 7).numpy()], EXACT)
idx = np.array([[0, 4, 2], [1, 3, 0]], dtype=np.int64)
case("torch_select", "one_hot_f32", comp("OneHot", {"depth": 5, "dtype": "f32"}), [idx],
     [F.one_hot(t(idx), 5).to(torch.float32).numpy()], EXACT)
# Negative indices count from the end and out-of-range ones give zero rows (ONNX OneHot);
# PyTorch's one_hot takes neither, so the expected value wraps and masks around it.
idx = np.array([-1, -4, 3, 4, -5, 0, 2], dtype=np.int32)
wrapped = np.where(idx < 0, idx + 4, idx)
valid = (wrapped >= 0) & (wrapped < 4)
hot = F.one_hot(t(np.where(valid, wrapped, 0).astype(np.int64)), 4) * t(valid.astype(np.int64))[:, None]
case("torch_select", "one_hot_negative_out_of_range", comp("OneHot", {"depth": 4, "dtype": "i64"}), [idx],
     [hot.numpy()], EXACT)


# ---- einsum ---------------------------------------------------------------------------

def einsum(name, eq, ins, tol=TOL_ACC32):
    y = torch.einsum(eq, *[t(a) for a in ins]).to(t(ins[0]).dtype)  # oar keeps the dtype
    case("torch_einsum", name, comp("Einsum", {"equation": eq}), ins, [y.numpy()], tol)


einsum("matmul", "ij,jk->ik", [f32(3, 4), f32(4, 5)])
einsum("batched_transposed", "bij,bkj->bki", [f32(2, 3, 4), f32(2, 5, 4)])
einsum("trace", "ii->", [f64(4, 4)], TOL_F64)
einsum("diagonal", "ii->i", [f64(4, 4)], TOL_F64)
einsum("implicit_outer", "i,j", [f32(3), f32(4)])
einsum("ellipsis_three", "...ij,jk,k->...i", [f32(2, 3, 4), f32(4, 5), f32(5)])
einsum("bilinear", "bn,anm,bm->ba", [f32(2, 3), f32(4, 3, 5), f32(2, 5)])
einsum("i32_sum", "ij->", [rng.integers(-9, 10, (3, 4)).astype(np.int32)], EXACT)


# ---- shape_of -------------------------------------------------------------------------

for name, x in [("f32_rank3", f32(3, 1, 4)), ("i64_rank1", np.arange(5, dtype=np.int64)), ("f64_scalar", f64())]:
    shape = torch.tensor(torch.from_numpy(np.asarray(x)).shape, dtype=torch.int64)  # ONNX Shape
    case("torch_shape_of", name, {"Composite": "ShapeOf"}, [x], [shape.numpy()], EXACT)


# ---- flip, triu / tril ------------------------------------------------------------------

for name, x, dims in [("f32_last", f32(2, 3, 5), [2]), ("f64_two_axes", f64(4, 3, 2), [0, 1]),
                      ("i64_all", rng.integers(-9, 10, (3, 4)).astype(np.int64), [0, 1])]:
    case("torch_flip", name, comp("Flip", {"axes": dims}), [x], [torch.flip(t(x), dims).numpy()], EXACT)

for name, x, d, upper in [("f32_triu_batched", f32(2, 4, 5), 1, True), ("f64_tril_below", f64(5, 3), -1, False),
                          ("i32_tril", rng.integers(-9, 10, (4, 4)).astype(np.int32), 0, False),
                          ("bool_triu_far", rng.integers(0, 2, (3, 6)).astype(bool), -2, True)]:
    y = (torch.triu if upper else torch.tril)(t(x), d)
    case("torch_trilu", name, comp("Trilu", {"diagonal": d, "upper": upper}), [x], [y.numpy()], EXACT)


# ---- lstm_cell / gru_cell (the gates of one step, after the two matrix products) ----------

for name, n, h, mk, tol in [("f32", 3, 4, f32, TOL_F32), ("f64", 2, 3, f64, TOL_F64)]:
    xg, hg, c = mk(n, 4 * h), mk(n, 4 * h), mk(n, h)
    # torch.lstm_cell on input [xg, hg] with W_ih = [I I] and the rest zero: gates = xg + hg.
    eye = torch.eye(4 * h, dtype=t(xg).dtype)
    w_ih, w_hh = torch.cat([eye, eye], 1), torch.zeros(4 * h, h, dtype=eye.dtype)
    hy, cy = torch.lstm_cell(torch.cat([t(xg), t(hg)], 1), (torch.zeros(n, h, dtype=eye.dtype), t(c)),
                             w_ih, w_hh, torch.zeros(4 * h, dtype=eye.dtype), torch.zeros(4 * h, dtype=eye.dtype))
    case("torch_rnn_cell", f"lstm_{name}", {"Composite": "LstmCell"}, [xg, hg, c], [hy.numpy(), cy.numpy()], tol)
    xg, hg, hs = mk(n, 3 * h), mk(n, 3 * h), mk(n, h)
    # PyTorch's GRU cell formula written with its ops (torch.gru_cell needs h·W_hh = hg).
    xr, xz, xn = t(xg).chunk(3, 1)
    hr, hz, hn = t(hg).chunk(3, 1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    nn_ = torch.tanh(xn + r * hn)
    case("torch_rnn_cell", f"gru_{name}", {"Composite": "GruCell"}, [xg, hg, hs],
         [((1 - z) * nn_ + z * t(hs)).numpy()], tol)


# ---- lstm_seq (a whole LSTM layer's recurrence after the input projection) -----------------

for name, n, steps, h, reverse, mk, tol in [("f32", 2, 4, 3, False, f32, TOL_ACC32),
                                            ("f32_reverse", 3, 3, 5, True, f32, TOL_ACC32),
                                            ("f64", 2, 3, 2, False, f64, TOL_F64)]:
    xg, w, h0, c0 = 3 * mk(n, steps, 4 * h), mk(4 * h, h), mk(n, h), mk(n, h)
    # torch.lstm with W_ih = I (its input is xg itself), W_hh = w, no biases, batch first; the
    # reverse direction runs on the flipped sequence and flips its output back.
    x = t(xg).flip(1) if reverse else t(xg)
    eye = torch.eye(4 * h, dtype=x.dtype)
    y, hy, cy = torch.lstm(x, (t(h0)[None], t(c0)[None]), [eye, t(w)], False, 1, 0.0, False, False, True)
    y = y.flip(1) if reverse else y
    case("torch_rnn_seq", f"lstm_seq_{name}", comp("LstmSeq", {"reverse": reverse}), [xg, w, h0, c0],
         [y.numpy(), hy[0].numpy(), cy[0].numpy()], tol)


# ---- gru_seq (a whole GRU layer's recurrence after the input projection; b_hh apart) ---------

for name, n, steps, h, reverse, mk, tol in [("f32", 2, 4, 3, False, f32, TOL_ACC32),
                                            ("f32_reverse", 3, 3, 5, True, f32, TOL_ACC32),
                                            ("f64", 2, 3, 2, False, f64, TOL_F64)]:
    xg, w, b, h0 = 3 * mk(n, steps, 3 * h), mk(3 * h, h), mk(3 * h), mk(n, h)
    # torch.gru with W_ih = I, b_ih = 0 (its input is xg itself), W_hh = w, b_hh = b, batch first.
    x = t(xg).flip(1) if reverse else t(xg)
    eye = torch.eye(3 * h, dtype=x.dtype)
    y, hy = torch.gru(x, t(h0)[None], [eye, t(w), torch.zeros(3 * h, dtype=x.dtype), t(b)], True, 1, 0.0,
                      False, False, True)
    y = y.flip(1) if reverse else y
    case("torch_rnn_seq", f"gru_seq_{name}", comp("GruSeq", {"reverse": reverse}), [xg, w, b, h0],
         [y.numpy(), hy[0].numpy()], tol)


# ---- conv_weight_grad (a convolution's weight gradient, by PyTorch's autograd) ----------------

def conv_weight_grad(name, x, k, o, stride, pb, pa, dil, groups):
    """PyTorch pads symmetrically; oar pads `pb` before and `pa` after: x zero-padded first."""
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.ndim]
    pad = []
    for p, q in zip(reversed(pb), reversed(pa)):
        pad += [p, q]
    xp = F.pad(t(x), pad)
    w = torch.zeros((o, x.shape[1] // groups, *k), dtype=xp.dtype, requires_grad=True)
    y = fn(xp, w, stride=stride, dilation=dil, groups=groups)
    dy = rng.uniform(-1, 1, tuple(y.shape)).astype(x.dtype)
    (dw,) = torch.autograd.grad(y, w, t(dy))
    op = comp("ConvWeightGrad", {"stride": list(stride), "pad_before": list(pb), "pad_after": list(pa),
                                 "dilation": list(dil), "groups": groups, "kernel": list(k)})
    case("torch_conv_weight_grad", name, op, [x, dy], [dw.numpy()],
         TOL_ACC32 if x.dtype == np.float32 else TOL_F64)


conv_weight_grad("wgrad_1d_stride2", f32(2, 3, 7), [3], 4, [2], [1], [0], [1], 1)
conv_weight_grad("wgrad_2d_groups_dilation", f32(1, 4, 6, 5), [2, 3], 6, [1, 2], [1, 0], [0, 1], [2, 1], 2)
conv_weight_grad("wgrad_2d_same_f64", f64(2, 3, 8, 8), [5, 5], 4, [1, 1], [2, 2], [2, 2], [1, 1], 1)
conv_weight_grad("wgrad_2d_5x5_same_one_channel", f32(2, 1, 12, 12), [5, 5], 6, [1, 1], [2, 2], [2, 2], [1, 1], 1)
conv_weight_grad("wgrad_3d", f32(1, 2, 3, 5, 3), [2, 3, 2], 2, [1, 2, 1], [0, 1, 0], [0, 1, 0], [1, 1, 1], 1)


# ---- max_pool2d_grad (max_pool2d's gradient, by PyTorch's autograd; distinct values: PyTorch
# gives a tied window's cotangent to its first maximum, oar splits it as its max tree does) ------

def max_pool2d_grad(name, x, k, s, p, ceil_mode):
    xt = t(x).requires_grad_(True)
    y = F.max_pool2d(xt, k, s, p, ceil_mode=ceil_mode)
    dy = rng.uniform(-1, 1, tuple(y.shape)).astype(x.dtype)
    (dx,) = torch.autograd.grad(y, xt, t(dy))
    op = comp("MaxPool2dGrad", {"kernel": list(k), "stride": list(s), "padding": [p[0], p[1], p[0], p[1]],
                                "ceil_mode": ceil_mode})
    case("torch_max_pool2d_grad", name, op, [x, dy], [dx.numpy()], TOL_F64 if x.dtype == np.float64 else TOL_F32)


max_pool2d_grad("k2s2", f32(2, 3, 8, 6), [2, 2], [2, 2], [0, 0], False)
max_pool2d_grad("k3s2p1", f32(1, 2, 9, 7), [3, 3], [2, 2], [1, 1], False)
max_pool2d_grad("k3x2_s1x2_ceil_f64", f64(1, 2, 5, 7), [3, 2], [1, 2], [1, 0], True)


# ---- adam_update (one step of PyTorch's own Adam / AdamW from a given state) --------------

def adam_update(name, shape, dtype, step, lr, wd):
    p, g = rng.uniform(-1, 1, shape).astype(dtype), rng.uniform(-1, 1, shape).astype(dtype)
    m, v = rng.uniform(-0.1, 0.1, shape).astype(dtype), rng.uniform(0, 0.01, shape).astype(dtype)
    param = torch.nn.Parameter(t(p.copy()))
    param.grad = t(g.copy())
    opt = torch.optim.AdamW([param], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd, foreach=False)
    # The state after `step - 1` updates; step() counts this one.
    opt.state[param] = {"step": torch.tensor(float(step - 1)), "exp_avg": t(m.copy()),
                        "exp_avg_sq": t(v.copy())}
    opt.step()
    st = opt.state[param]
    op = comp("AdamUpdate", {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "weight_decay": wd})
    scalar = lambda x: np.asarray(x, dtype=dtype)
    case("torch_optim", name, op, [p, g, m, v, scalar(lr), scalar(step)],
         [param.detach().numpy(), st["exp_avg"].numpy(), st["exp_avg_sq"].numpy()],
         TOL_F64 if dtype == np.float64 else TOL_F32)


adam_update("adamw_f32", (3, 5), np.float32, 3, 0.01, 0.01)
adam_update("adam_first_step_f32", (37,), np.float32, 1, 0.001, 0.0)
adam_update("adamw_f64", (2, 3, 4), np.float64, 10, 0.01, 0.1)


def main():
    for family, cases in FILES.items():
        path = os.path.join(OUT_DIR, f"{family}.json")
        with open(path, "w") as fh:
            fh.write("[\n" + ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases) + "\n]\n")
        print(f"{path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
