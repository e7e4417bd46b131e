#!/usr/bin/env python3
"""Generate independent numpy fixtures for every oar op: tests/fixtures/ops/*.json.

`python3 tools/gen_op_fixtures.py` rewrites the files byte-identically (fixed seed, pinned
numpy in tools/requirements.txt). Semantics follow the op docs in ir/src/ops (mod.rs,
primitive.rs, composite.rs, infer.rs); where those are silent, numpy / PyTorch.

Expected values are computed in float64 from the (already rounded) inputs and rounded once
to the output dtype, so they are the correctly rounded answer up to the op's own accuracy.
Each case's `op` is serde_json's externally tagged form of `oar_ir::Op`.
"""

import itertools
import json
import math
import os

import numpy as np

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "ops")
I64_MAX = 2**63 - 1
NAMES = {"float32": "f32", "float64": "f64", "float16": "f16", "int8": "i8", "uint8": "u8",
         "int32": "i32", "int64": "i64", "bool": "bool"}
F32, F64, F16, I32, I64, U8, BOOL = np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_
NAN, INF = float("nan"), float("inf")
# Tolerances: exact for movement/int/bool results; per-dtype for float math; looser where
# the reference may accumulate in a different order (reductions, contractions, norms).
TOL_EXACT = (0.0, 0.0)
TOL_ELEM = {"f32": (1e-5, 1e-6), "f64": (1e-12, 1e-12), "f16": (1e-3, 1e-3)}
TOL_ACC = {"f32": (1e-4, 1e-5), "f64": (1e-10, 1e-12), "f16": (1e-2, 1e-2)}

rng = np.random.default_rng(20240611)


# ---- encoding -----------------------------------------------------------------------------

def enc_float(v, t):
    """A JSON value that parses (as f64, then `as` the dtype) back to exactly `v` of type `t`."""
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    short = float(str(t(v)))  # the dtype's shortest repr, if it survives the f64 detour
    return short if t(short) == t(v) else v


def enc(a):
    a = np.asarray(a)
    name = NAMES[a.dtype.name]
    flat = a.ravel()
    if a.dtype.kind == "f":
        data = [enc_float(v, a.dtype.type) for v in flat]
    elif a.dtype.kind == "b":
        data = [bool(v) for v in flat]
    else:
        data = [int(v) for v in flat]
    return {"dtype": name, "shape": list(a.shape), "data": data}


FILES = {}


def case(family, name, op, inputs, outputs, tol=None, error=False):
    """Record one case; `tol` defaults from the first output's dtype (elementwise accuracy)."""
    outputs = [np.asarray(o) for o in outputs]
    if tol is None:
        tol = tol_for(outputs[0] if outputs else inputs[0], TOL_ELEM)
    c = {"name": name, "op": op, "inputs": [enc(i) for i in inputs],
         "outputs": [enc(o) for o in outputs], "rtol": tol[0], "atol": tol[1]}
    if error:
        c["expect_error"] = True
    FILES.setdefault(family, []).append(c)


def tol_for(a, table):
    name = NAMES[np.asarray(a).dtype.name]
    return table.get(name, TOL_EXACT)


def dims(shape):
    return [{"Static": int(d)} for d in shape]


def rand(shape, t, lo=-2.0, hi=2.0):
    if np.dtype(t).kind == "f":
        return rng.uniform(lo, hi, size=shape).astype(t)
    if np.dtype(t).kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(int(lo), int(hi) + 1, size=shape).astype(t)


def f64(a):
    return np.asarray(a).astype(np.float64)


erf = np.vectorize(math.erf, otypes=[np.float64])


# ---- elementwise ------------------------------------------------------------------------------

UNARY_F = {
    "Neg": (lambda x: -x, [0.0, 1.0, INF, -INF, NAN]),
    "Abs": (np.abs, [0.0, -1.0, INF, -INF, NAN]),
    "Exp": (np.exp, [0.0, 100.0, -100.0, INF, -INF, NAN]),
    "Log": (np.log, [0.0, 1.0, -1.0, INF, NAN]),
    "Sqrt": (np.sqrt, [0.0, 4.0, -1.0, INF, NAN]),
    "Rsqrt": (lambda x: 1.0 / np.sqrt(x), [0.0, 4.0, -1.0, INF, NAN]),
    "Recip": (lambda x: 1.0 / x, [0.0, 4.0, -0.5, INF, NAN]),
    "Sin": (np.sin, [0.0, math.pi / 2, INF, NAN]),
    "Cos": (np.cos, [0.0, math.pi, -INF, NAN]),
    "Tanh": (np.tanh, [0.0, 20.0, -20.0, INF, -INF, NAN]),
    "Erf": (erf, [0.0, 5.0, -5.0, INF, -INF, NAN]),
    "Floor": (np.floor, [-1.5, 1.5, -2.0, 2.0, INF, NAN]),
    "Ceil": (np.ceil, [-1.5, 1.5, -2.0, 2.0, -INF, NAN]),
    "Round": (np.round, [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 3.7, -3.7, INF, NAN]),
    "Sign": (np.sign, [0.0, 3.0, -3.0, INF, -INF, NAN]),
}
POSITIVE = {"Log", "Sqrt", "Rsqrt"}


def gen_unary():
    with np.errstate(all="ignore"):
        for op, (fn, special) in UNARY_F.items():
            for t in (F32, F64):
                lo = 0.05 if op in POSITIVE else -3.0
                x = np.concatenate([rand([10], t, lo, 3.0), np.array(special, t)])
                case("unary", f"{op.lower()}_{NAMES[np.dtype(t).name]}", {"Unary": op}, [x], [fn(f64(x)).astype(t)])
        for op in ("Neg", "Abs", "Exp", "Sqrt", "Tanh", "Round"):
            lo = 0.05 if op in POSITIVE else -3.0
            x = np.concatenate([rand([8], F16, lo, 3.0), np.array([0.5, 1.5, 2.5], F16)])
            case("unary", f"{op.lower()}_f16", {"Unary": op}, [x], [UNARY_F[op][0](f64(x)).astype(F16)])
        for t in (I32, I64):
            x = np.array([-7, -1, 0, 1, 5, 123456], t)
            n = NAMES[np.dtype(t).name]
            case("unary", f"neg_{n}", {"Unary": "Neg"}, [x], [-x])
            case("unary", f"abs_{n}", {"Unary": "Abs"}, [x], [np.abs(x)])
            case("unary", f"sign_{n}", {"Unary": "Sign"}, [x], [np.sign(x)])
            case("unary", f"not_{n}", {"Unary": "Not"}, [x], [~x])
        b = np.array([[True, False, True], [False, False, True]])
        case("unary", "not_bool", {"Unary": "Not"}, [b], [~b])


def int_div(a, b):
    q = np.abs(a) // np.abs(b)
    return (q * np.sign(a) * np.sign(b)).astype(a.dtype)  # truncates toward zero


BINARY_F = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
    "Max": np.maximum, "Min": np.minimum, "Rem": np.mod,
}
CMP = {"Eq": np.equal, "Ne": np.not_equal, "Lt": np.less, "Le": np.less_equal, "Gt": np.greater,
       "Ge": np.greater_equal}
LOGIC = {"And": np.bitwise_and, "Or": np.bitwise_or, "Xor": np.bitwise_xor}
BROADCASTS = [([2, 3], [2, 3]), ([2, 1, 4], [3, 1]), ([], [2, 3])]


def gen_binary():
    with np.errstate(all="ignore"):
        for op, fn in BINARY_F.items():
            for t in (F32, F64):
                n = NAMES[np.dtype(t).name]
                for sa, sb in BROADCASTS:
                    a = rand(sa, t, 0.1 if op == "Pow" else -3.0, 3.0)
                    b = rand(sb, t, -2.0, 2.0)
                    if op in ("Div", "Rem"):
                        b = np.where(np.abs(b) < 0.1, t(0.5), b).astype(t)
                    tag = "x".join(map(str, sa)) or "s"
                    case("binary", f"{op.lower()}_{n}_{tag}", {"Binary": op}, [a, b], [fn(f64(a), f64(b)).astype(t)])
        sp = {
            "Div": ([1.0, 0.0, -1.0, INF, NAN, 6.0], [0.0, 0.0, 0.0, INF, 1.0, -3.0]),
            "Pow": ([-2.0, 0.0, 2.0, -2.0, -8.0, NAN, 1.0, INF], [0.5, 0.0, -1.0, 3.0, 1 / 3, 0.0, NAN, -1.0]),
            "Max": ([1.0, NAN, 2.0, NAN, -INF], [NAN, 1.0, 3.0, NAN, 0.0]),
            "Min": ([1.0, NAN, 2.0, NAN, INF], [NAN, 1.0, 3.0, NAN, 0.0]),
            "Rem": ([-5.5, 5.5, -5.5, 5.5, 4.0, -4.0, NAN], [2.0, -2.0, -2.0, 2.0, 2.0, 3.0, 1.0]),
        }
        for op, (a, b) in sp.items():
            for t in (F32, F64):
                a_, b_ = np.array(a, t), np.array(b, t)
                out = BINARY_F[op](f64(a_), f64(b_)).astype(t)
                case("binary", f"{op.lower()}_{NAMES[np.dtype(t).name]}_special", {"Binary": op}, [a_, b_], [out])
        for op in ("Add", "Mul", "Div", "Max", "Sub"):
            a, b = rand([2, 4], F16, -3, 3), rand([4], F16, 0.5, 2)
            case("binary", f"{op.lower()}_f16", {"Binary": op}, [a, b], [BINARY_F[op](f64(a), f64(b)).astype(F16)])
        for t in (I32, I64):
            n = NAMES[np.dtype(t).name]
            a = np.array([[7, -7, 7, -7, 0, 9], [1, 2, -3, 100, -100, 5]], t)
            b = np.array([2, 2, -2, -2, 3, 4], t)
            for op, fn in [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", int_div),
                           ("Rem", np.mod), ("Max", np.maximum), ("Min", np.minimum)]:
                case("binary", f"{op.lower()}_{n}", {"Binary": op}, [a, b], [fn(a, b).astype(t)])
            pa, pb = np.array([-3, -2, 0, 2, 3, 1], t), np.array([3, 2, 0, 4, 0, 5], t)
            case("binary", f"pow_{n}", {"Binary": "Pow"}, [pa, pb], [np.power(pa, pb)])
            for op, fn in LOGIC.items():
                case("binary", f"{op.lower()}_{n}", {"Binary": op}, [a, b], [fn(a, b)])
            case("binary", f"div_{n}_by_zero", {"Binary": "Div"}, [np.array([1, 2], t), np.array([1, 0], t)],
                 [], error=True)
        for t in (F32, F64, I32, I64, BOOL):
            n = NAMES[np.dtype(t).name]
            if t == BOOL:
                a, b = rand([3, 4], t), rand([4], t)
            else:
                a, b = rand([3, 4], t, -2, 2).round().astype(t), rand([4], t, -2, 2).round().astype(t)
            if np.dtype(t).kind == "f":
                a[0, 0], b[1] = NAN, NAN
            for op, fn in CMP.items():
                case("binary", f"{op.lower()}_{n}", {"Binary": op}, [a, b], [fn(a, b)], TOL_EXACT)
        a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
        for op, fn in LOGIC.items():
            case("binary", f"{op.lower()}_bool", {"Binary": op}, [a, b], [fn(a, b)])
        for t in (F32, I64, BOOL, F64, F16):
            c, a, b = rand([2, 3, 1], BOOL), rand([3, 4], t, -3, 3), rand([], t, -3, 3)
            case("where", f"where_{NAMES[np.dtype(t).name]}", "Where", [c, a, b], [np.where(c, a, b)], TOL_EXACT)
        c = np.array([True, False, True])
        a, b = np.array([1.0, NAN, 3.0], F32), np.array([NAN, 2.0, INF], F32)
        case("where", "where_f32_nan", "Where", [c, a, b], [np.where(c, a, b)], TOL_EXACT)


def gen_cast():
    def sat(x, t):
        info = np.iinfo(t)
        out = [min(max(math.trunc(v), info.min), info.max) if math.isfinite(v) else (info.max if v > 0 else info.min)
               for v in map(float, x.ravel())]
        return np.array(out, t).reshape(x.shape)

    x = np.array([-2.7, -0.5, 0.5, 2.7, 100.9, -100.9, 7.0], F32)
    case("cast", "cast_f32_i32_trunc", {"Cast": {"to": "i32"}}, [x], [sat(x, I32)])
    case("cast", "cast_f32_i64_trunc", {"Cast": {"to": "i64"}}, [x], [sat(x, I64)])
    s = np.array([3e9, -3e9, 1e20, -1e20, INF, -INF], F32)
    case("cast", "cast_f32_i32_saturate", {"Cast": {"to": "i32"}}, [s], [sat(s, I32)])
    case("cast", "cast_f32_i64_saturate", {"Cast": {"to": "i64"}}, [s], [sat(s, I64)])
    u = np.array([-5.0, 0.0, 1.9, 254.5, 300.0], F32)
    case("cast", "cast_f32_u8_saturate", {"Cast": {"to": "u8"}}, [u], [sat(u, U8)])
    b = np.array([0.0, 0.5, -1.0, NAN, INF, 1e-30], F32)
    case("cast", "cast_f32_bool", {"Cast": {"to": "bool"}}, [b], [b != 0])
    bb = np.array([[True, False], [False, True]])
    for t in (F32, I32, I64, F64):
        n = NAMES[np.dtype(t).name]
        case("cast", f"cast_bool_{n}", {"Cast": {"to": n}}, [bb], [bb.astype(t)])
    i = np.array([16777217, -16777217, 2**40 + 1, 123, 0, -(2**62) - 1], I64)
    case("cast", "cast_i64_f32", {"Cast": {"to": "f32"}}, [i], [i.astype(F32)])
    case("cast", "cast_i64_f64", {"Cast": {"to": "f64"}}, [i], [i.astype(F64)])
    i32 = np.array([-5, 0, 7, 2**31 - 1], I32)
    case("cast", "cast_i32_i64", {"Cast": {"to": "i64"}}, [i32], [i32.astype(I64)])
    case("cast", "cast_i32_bool", {"Cast": {"to": "bool"}}, [i32], [i32 != 0])
    case("cast", "cast_i32_f32", {"Cast": {"to": "f32"}}, [i32], [i32.astype(F32)])
    d = np.array([0.1, 1 / 3, 1e40, -1e-50, 3.4028235677973366e38, NAN, -INF], F64)
    with np.errstate(all="ignore"):
        case("cast", "cast_f64_f32", {"Cast": {"to": "f32"}}, [d], [d.astype(F32)])
    f = rand([6], F32, -10, 10)
    case("cast", "cast_f32_f64", {"Cast": {"to": "f64"}}, [f], [f.astype(F64)])
    h = np.array([0.1, 1 / 3, 65504.0, 1e5, -2.5, 1e-8, NAN], F32)
    with np.errstate(all="ignore"):
        case("cast", "cast_f32_f16", {"Cast": {"to": "f16"}}, [h], [h.astype(F16)], TOL_EXACT)
    hh = rand([5], F16, -100, 100)
    case("cast", "cast_f16_f32", {"Cast": {"to": "f32"}}, [hh], [hh.astype(F32)], TOL_EXACT)


# ---- reductions -----------------------------------------------------------------------------

REDUCE = {"Sum": np.sum, "Max": np.max, "Min": np.min, "Prod": np.prod, "Mean": np.mean}


def gen_reduce():
    def red(name, op, x, axes, keepdim, t):
        out = REDUCE[op](f64(x) if np.dtype(t).kind == "f" else x, axis=tuple(axes), keepdims=keepdim)
        tol = tol_for(np.zeros(0, t), TOL_ACC)
        case("reduce", name, {"Reduce": {"op": op, "axes": axes, "keepdim": keepdim}}, [x],
             [np.asarray(out).astype(t)], tol)

    x = rand([2, 3, 4], F32)
    for op in REDUCE:
        for axes in ([0], [1], [2], [0, 2], [0, 1, 2]):
            for keep in (False, True):
                red(f"{op.lower()}_f32_ax{''.join(map(str, axes))}_{'keep' if keep else 'drop'}", op,
                    x if op != "Prod" else rand([2, 3, 4], F32, 0.5, 1.5), axes, keep, F32)
    red("sum_f32_no_axes", "Sum", x, [], False, F32)
    xd = rand([3, 5], F64)
    for op in REDUCE:
        red(f"{op.lower()}_f64_ax1", op, xd, [1], False, F64)
    for t in (I32, I64):
        xi = rand([3, 4], t, -5, 5)
        for op in ("Sum", "Max", "Min", "Prod"):
            red(f"{op.lower()}_{NAMES[np.dtype(t).name]}_ax0", op, xi, [0], False, t)
            red(f"{op.lower()}_{NAMES[np.dtype(t).name]}_all", op, xi, [0, 1], True, t)
    xn = np.array([[1.0, NAN, 3.0], [4.0, 5.0, -1.0]], F32)
    for op in ("Max", "Min", "Sum"):
        red(f"{op.lower()}_f32_nan", op, xn, [1], False, F32)
    red("sum_f32_empty_axis", "Sum", np.zeros([2, 0, 3], F32), [1], False, F32)
    red("prod_f32_empty_axis", "Prod", np.zeros([2, 0], F32), [1], False, F32)
    red("sum_f16_ax1", "Sum", rand([2, 6], F16), [1], False, F16)

    def arg(name, op, x, axis, keep):
        fn = np.argmax if op == "ArgMax" else np.argmin
        out = fn(x, axis=axis, keepdims=keep).astype(I64)
        case("reduce", name, {"ArgReduce": {"op": op, "axis": axis, "keepdim": keep}}, [x], [out], TOL_EXACT)

    xt = np.array([[1.0, 3.0, 3.0, -2.0], [5.0, 5.0, 0.0, -2.0], [-1.0, 2.0, 7.0, 0.0]], F32)  # ties: first wins
    for op in ("ArgMax", "ArgMin"):
        for axis in (0, 1):
            for keep in (False, True):
                arg(f"{op.lower()}_f32_ax{axis}_{'keep' if keep else 'drop'}", op, xt, axis, keep)
        arg(f"{op.lower()}_i32", op, rand([2, 3, 4], I32, -3, 3), 2, False)
        arg(f"{op.lower()}_f64", op, rand([4, 3], F64), 0, False)
        arg(f"{op.lower()}_bool", op, np.array([[False, True, True], [False, False, False]]), 1, False)


# ---- movement -----------------------------------------------------------------------------------

def slice_op(ranges):
    return {"Slice": {"ranges": [{"start": s, "end": e, "step": st} for s, e, st in ranges]}}


def gen_movement():
    x = rand([2, 3, 4], F32)
    case("movement", "reshape_f32", {"Reshape": {"shape": dims([4, 6])}}, [x], [x.reshape(4, 6)], TOL_EXACT)
    xi = np.arange(6, dtype=I64)
    case("movement", "reshape_i64", {"Reshape": {"shape": dims([2, 1, 3])}}, [xi], [xi.reshape(2, 1, 3)])
    one = np.array([[2.5]], F64)
    case("movement", "reshape_to_scalar", {"Reshape": {"shape": []}}, [one], [one.reshape([])])
    bb = rand([2, 2], BOOL)
    case("movement", "reshape_bool", {"Reshape": {"shape": dims([4])}}, [bb], [bb.reshape(4)])

    for perm in ([2, 0, 1], [0, 1, 2], [1, 0, 2]):
        case("movement", f"permute_{''.join(map(str, perm))}", {"Permute": {"perm": perm}}, [x],
             [np.transpose(x, perm)], TOL_EXACT)
    x4 = rand([2, 3, 2, 2], I32, -9, 9)
    case("movement", "permute_i32_0231", {"Permute": {"perm": [0, 2, 3, 1]}}, [x4], [np.transpose(x4, [0, 2, 3, 1])])

    for name, src, to in [("broadcast_col", rand([3, 1], F32), [2, 3, 4]), ("broadcast_scalar", rand([], F64), [2, 2]),
                          ("broadcast_bool", rand([1], BOOL), [3]), ("broadcast_same", rand([2, 2], I64, -5, 5), [2, 2])]:
        case("movement", name, {"Broadcast": {"shape": dims(to)}}, [src], [np.broadcast_to(src, to)], TOL_EXACT)

    x10 = np.arange(10, dtype=F32)
    for name, src, ranges in [
        ("slice_step3", x10, [(2, 8, 3)]),
        ("slice_neg_start_to_end", x10, [(-3, I64_MAX, 1)]),
        ("slice_clamp", x10, [(-20, 3, 1)]),
        ("slice_past_end", x10, [(7, 100, 2)]),
        ("slice_empty", x10, [(5, 2, 1)]),
        ("slice_2d_neg", rand([4, 5], F32), [(-3, I64_MAX, 1), (1, -1, 2)]),
        ("slice_3d_i64", rand([3, 4, 5], I64, -50, 50), [(0, I64_MAX, 2), (-1, I64_MAX, 1), (-4, -1, 2)]),
    ]:
        idx = tuple(slice(s, None if e == I64_MAX else e, st) for s, e, st in ranges)
        case("movement", name, slice_op(ranges), [src], [src[idx]], TOL_EXACT)

    for name, src, before, after, value in [
        ("pad_f32_zero", rand([2, 3], F32), [1, 0], [0, 2], 0.0),
        ("pad_f32_value", rand([2, 2, 2], F32), [0, 1, 2], [1, 0, 1], -1.5),
        ("pad_i32_value", rand([3], I32, -3, 3), [2], [1], 7.0),
        ("pad_f64_none", rand([2, 2], F64), [0, 0], [0, 0], 3.0),
    ]:
        out = np.pad(src, list(zip(before, after)), constant_values=src.dtype.type(value))
        case("movement", name, {"Pad": {"before": before, "after": after, "value": value}}, [src], [out], TOL_EXACT)

    for name, parts, axis in [
        ("concat_f32_ax1", [rand([2, 1], F32), rand([2, 3], F32), rand([2, 2], F32)], 1),
        ("concat_i64_ax0", [rand([1, 3], I64, -9, 9), rand([2, 3], I64, -9, 9)], 0),
        ("concat_bool_ax0", [rand([2], BOOL), rand([3], BOOL)], 0),
        ("concat_single", [rand([2, 2], F64)], 1),
        ("concat_with_empty", [rand([2, 0], F32), rand([2, 2], F32)], 1),
    ]:
        case("movement", name, {"Concat": {"axis": axis}}, parts, [np.concatenate(parts, axis)], TOL_EXACT)

    for name, shape, axis, t in [("iota_f32_ax1", [2, 3], 1, F32), ("iota_i64_ax0", [3, 2], 0, I64),
                                 ("iota_i32_1d", [4], 0, I32), ("iota_f64_ax2", [2, 2, 3], 2, F64)]:
        out = np.broadcast_to(np.arange(shape[axis]).reshape([-1 if i == axis else 1 for i in range(len(shape))]),
                              shape).astype(t)
        case("movement", name, {"Iota": {"shape": dims(shape), "axis": axis, "dtype": NAMES[np.dtype(t).name]}}, [],
             [out], TOL_EXACT)


# ---- indexing -----------------------------------------------------------------------------------

def scatter_np(data, idx, upd, axis, add):
    out = np.moveaxis(data.copy(), axis, 0)
    k = idx.ndim
    u = np.moveaxis(upd, list(range(axis, axis + k)), list(range(k))).reshape((-1,) + out.shape[1:])
    flat = np.where(idx < 0, idx + data.shape[axis], idx).ravel()
    if add:
        np.add.at(out, flat, u)
    else:
        out[flat] = u
    return np.moveaxis(out, 0, axis)


def gen_indexing():
    d = rand([5, 3], F32)
    for name, data, idx, axis in [
        ("gather_ax0_neg", d, np.array([[-1, 0], [4, -5]], I64), 0),
        ("gather_ax1_i32", d, np.array([2, 0, 2, 1], I32), 1),
        ("gather_scalar_index", d, np.array(3, I64), 0),
        ("gather_3d_ax1", rand([2, 4, 3], F64), np.array([[3, 0, -2], [1, 1, 2]], I64), 1),
        ("gather_bool", rand([4], BOOL), np.array([3, 3, 0], I32), 0),
        ("gather_i64_data", rand([3, 4], I64, -9, 9), np.array([-1, 1], I64), 1),
    ]:
        case("indexing", name, {"Gather": {"axis": axis}}, [data, idx], [np.take(data, idx, axis)], TOL_EXACT)
    case("indexing", "gather_out_of_range", {"Gather": {"axis": 0}}, [d, np.array([5], I64)], [], error=True)

    for name, data, idx, axis, add in [
        ("scatter_replace_ax0", rand([5, 3], F32), np.array([4, 0, 2], I64), 0, False),
        ("scatter_replace_neg", rand([5, 3], F32), np.array([-1, 1], I32), 0, False),
        ("scatter_replace_ax1_2d_idx", rand([2, 5], F64), np.array([[0, 3], [4, 1]], I64), 1, False),
        ("scatter_add_dup", rand([3, 4], F32), np.array([[0, 2], [2, 2]], I64), 1, True),
        ("scatter_add_i32", rand([4, 2], I32, -5, 5), np.array([1, 1, 3, 1], I32), 0, True),
        ("scatter_add_neg", rand([4], F64), np.array([-1, 3, 0], I64), 0, True),
    ]:
        shape = list(data.shape[:axis]) + list(idx.shape) + list(data.shape[axis + 1:])
        upd = rand(shape, data.dtype.type, -5, 5)
        out = scatter_np(data, idx, upd, axis, add)
        tol = tol_for(data, TOL_ACC) if add else TOL_EXACT
        case("indexing", name, {"Scatter": {"axis": axis, "reduce": "Add" if add else "Replace"}}, [data, idx, upd],
             [out], tol)
    case("indexing", "scatter_out_of_range", {"Scatter": {"axis": 0, "reduce": "Add"}},
         [rand([3], F32), np.array([3], I64), rand([1], F32)], [], error=True)


# ---- contractions -------------------------------------------------------------------------------

def conv_nd(x, w, stride, pb, pa, dil, groups):
    """Direct cross-correlation: loop over output positions and kernel taps (no im2col)."""
    x, w = f64(x), f64(w)
    n, c = x.shape[:2]
    o, sp, ks = w.shape[0], x.ndim - 2, w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(pb, pa)))
    outs = [(xp.shape[2 + i] - dil[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(sp)]
    y = np.zeros((n, o) + tuple(outs))
    cg, og = c // groups, o // groups
    for pos in itertools.product(*[range(s) for s in outs]):
        for g in range(groups):
            acc = np.zeros((n, og))
            for k in itertools.product(*[range(s) for s in ks]):
                at = tuple(pos[i] * stride[i] + k[i] * dil[i] for i in range(sp))
                xs = xp[(slice(None), slice(g * cg, (g + 1) * cg)) + at]
                ws = w[(slice(g * og, (g + 1) * og), slice(None)) + k]
                acc += xs @ ws.T
            y[(slice(None), slice(g * og, (g + 1) * og)) + pos] = acc
    return y


def gen_contraction():
    for name, sa, sb, t in [("matmul_f32_2d", [3, 4], [4, 5], F32), ("matmul_f64_batched", [2, 3, 4], [2, 4, 2], F64),
                            ("matmul_f32_bcast_batch", [2, 1, 3, 4], [3, 4, 5], F32),
                            ("matmul_f32_bcast_one", [1, 2, 3], [4, 3, 2], F32), ("matmul_i32", [2, 3], [3, 2], I32),
                            ("matmul_i64_batched", [2, 2, 3], [3, 1], I64), ("matmul_f32_vecs", [1, 4], [4, 1], F32),
                            ("matmul_f16", [2, 8], [8, 3], F16)]:
        a, b = rand(sa, t, -3, 3), rand(sb, t, -3, 3)
        out = (f64(a) @ f64(b)).astype(t) if np.dtype(t).kind == "f" else (a @ b).astype(t)
        case("contraction", name, "MatMul", [a, b], [out], tol_for(a, TOL_ACC))

    for name, xs, ws, stride, pb, pa, dil, groups, t in [
        ("conv1d_groups_stride", [2, 4, 9], [6, 2, 3], [2], [1], [0], [1], 2, F32),
        ("conv1d_dilation", [1, 2, 10], [3, 2, 3], [1], [2], [2], [3], 1, F64),
        ("conv2d_asym", [1, 3, 7, 6], [4, 3, 3, 2], [2, 1], [1, 0], [2, 1], [1, 2], 1, F32),
        ("conv2d_depthwise", [2, 4, 5, 5], [4, 1, 3, 3], [1, 1], [1, 1], [1, 1], [1, 1], 4, F32),
        ("conv2d_1x1_f64", [2, 3, 3, 4], [5, 3, 1, 1], [1, 1], [0, 0], [0, 0], [1, 1], 1, F64),
        ("conv2d_groups3_stride", [1, 6, 6, 7], [3, 2, 2, 3], [2, 3], [0, 1], [1, 0], [1, 1], 3, F32),
        ("conv3d_mixed", [1, 2, 4, 5, 4], [2, 1, 2, 3, 2], [1, 2, 1], [0, 1, 1], [1, 0, 1], [2, 1, 1], 2, F32),
    ]:
        x, w = rand(xs, t), rand(ws, t)
        op = {"Conv": {"stride": stride, "pad_before": pb, "pad_after": pa, "dilation": dil, "groups": groups}}
        case("contraction", name, op, [x, w], [conv_nd(x, w, stride, pb, pa, dil, groups).astype(t)],
             tol_for(x, TOL_ACC))


# ---- composites ---------------------------------------------------------------------------------

def pool_out(size, k, s, pb, pa, ceil):
    avail = size + pb + pa - k
    out = (-(-avail // s) if ceil else avail // s) + 1
    if ceil and (out - 1) * s >= size + pb:  # PyTorch: the last window starts inside input or leading pad
        out -= 1
    return out


def pool2d(x, k, s, pad, ceil, kind, include_pad=True):
    """Max or average pooling with PyTorch's window and divisor rules (asymmetric padding)."""
    n, c, h, w = x.shape
    top, left, bottom, right = pad
    oh, ow = pool_out(h, k[0], s[0], top, bottom, ceil), pool_out(w, k[1], s[1], left, right, ceil)
    y = np.zeros((n, c, oh, ow))
    xf = f64(x)
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s[0] - top, j * s[1] - left
            h1, w1 = min(h0 + k[0], h + bottom), min(w0 + k[1], w + right)
            full = (h1 - h0) * (w1 - w0)  # window clipped to the padded input (PyTorch)
            a, b, cc, d = max(h0, 0), min(h1, h), max(w0, 0), min(w1, w)
            win = xf[:, :, a:b, cc:d]
            if kind == "max":
                y[:, :, i, j] = win.max(axis=(2, 3))
            else:
                y[:, :, i, j] = win.sum(axis=(2, 3)) / (full if include_pad else (b - a) * (d - cc))
    return y


def adaptive(x, osz, kind):
    n, c, h, w = x.shape
    y = np.zeros((n, c) + tuple(osz))
    for i in range(osz[0]):
        for j in range(osz[1]):
            a, b = (i * h) // osz[0], -(-((i + 1) * h) // osz[0])
            cc, d = (j * w) // osz[1], -(-((j + 1) * w) // osz[1])
            win = f64(x[:, :, a:b, cc:d])
            y[:, :, i, j] = win.max(axis=(2, 3)) if kind == "max" else win.mean(axis=(2, 3))
    return y


def comp(name, fields=None):
    return {"Composite": name if fields is None else {name: fields}}


def gen_nn_layers():
    fam = "composite_layers"
    for name, xs, ws, bias, t in [("linear_f32_bias", [2, 3, 4], [4, 5], True, F32),
                                  ("linear_f64_nobias", [3, 4], [4, 2], False, F64),
                                  ("linear_f32_rank1", [4], [4, 2], True, F32)]:
        x, w = rand(xs, t), rand(ws, t)
        ins, out = [x, w], f64(x) @ f64(w)
        if bias:
            b = rand([ws[1]], t)
            ins, out = ins + [b], out + f64(b)
        case(fam, name, comp("Linear"), ins, [out.astype(t)], tol_for(x, TOL_ACC))

    for name, xs, ws, stride, pad, dil, groups, bias, t in [
        ("conv2d_bias_asym_pad", [2, 3, 6, 5], [4, 3, 3, 3], [2, 1], [1, 0, 0, 2], [1, 1], 1, True, F32),
        ("conv2d_nobias_groups_dil", [1, 4, 7, 7], [2, 2, 2, 3], [1, 2], [0, 1, 1, 0], [2, 1], 2, False, F32),
        ("conv2d_bias_f64", [1, 2, 4, 4], [3, 2, 3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1, True, F64),
    ]:
        x, w = rand(xs, t), rand(ws, t)
        y = conv_nd(x, w, stride, pad[:2], pad[2:], dil, groups)
        ins = [x, w]
        if bias:
            b = rand([ws[0]], t)
            ins, y = ins + [b], y + f64(b)[None, :, None, None]
        op = comp("Conv2d", {"stride": stride, "padding": pad, "dilation": dil, "groups": groups})
        case(fam, name, op, ins, [y.astype(t)], tol_for(x, TOL_ACC))

    for name, xs, k, s, pad, ceil, t in [
        ("max_pool2d_basic", [1, 2, 5, 5], [2, 2], [2, 2], [0, 0, 0, 0], False, F32),
        ("max_pool2d_ceil", [1, 2, 5, 5], [2, 2], [2, 2], [0, 0, 0, 0], True, F32),
        ("max_pool2d_pad_ceil_overrun", [1, 1, 6, 6], [3, 3], [2, 2], [1, 1, 1, 1], True, F32),
        ("max_pool2d_pad_ceil_drop_last", [2, 1, 5, 5], [2, 2], [2, 2], [1, 1, 1, 1], True, F64),
        ("max_pool2d_asym_pad", [1, 2, 5, 6], [3, 2], [1, 2], [1, 0, 0, 1], False, F32),
        ("max_pool2d_i32_pad", [1, 1, 4, 4], [3, 3], [2, 2], [1, 1, 1, 1], False, I32),
    ]:
        x = rand(xs, t, -9, -1) if t == I32 else rand(xs, t)
        op = comp("MaxPool2d", {"kernel": k, "stride": s, "padding": pad, "ceil_mode": ceil})
        case(fam, name, op, [x], [pool2d(x, k, s, pad, ceil, "max").astype(t)], TOL_EXACT)

    for name, xs, k, s, pad, ceil, inc, t in [
        ("avg_pool2d_basic", [1, 2, 4, 4], [2, 2], [2, 2], [0, 0, 0, 0], False, True, F32),
        ("avg_pool2d_pad_include", [1, 2, 5, 5], [3, 3], [2, 2], [1, 1, 1, 1], False, True, F32),
        ("avg_pool2d_pad_exclude", [1, 2, 5, 5], [3, 3], [2, 2], [1, 1, 1, 1], False, False, F32),
        ("avg_pool2d_ceil_exclude", [1, 1, 6, 6], [3, 3], [2, 2], [1, 1, 1, 1], True, False, F64),
        ("avg_pool2d_ceil_include_overrun", [1, 1, 6, 6], [3, 3], [2, 2], [1, 1, 1, 1], True, True, F64),
        ("avg_pool2d_ceil_nopad_include", [1, 2, 5, 5], [2, 2], [2, 2], [0, 0, 0, 0], True, True, F32),
        ("avg_pool2d_asym_pad_exclude", [1, 2, 5, 6], [3, 2], [1, 2], [1, 0, 0, 1], False, False, F32),
    ]:
        x = rand(xs, t)
        op = comp("AvgPool2d", {"kernel": k, "stride": s, "padding": pad, "ceil_mode": ceil, "count_include_pad": inc})
        case(fam, name, op, [x], [pool2d(x, k, s, pad, ceil, "avg", inc).astype(t)], tol_for(x, TOL_ACC))

    for kind, variant in (("avg", "AdaptiveAvgPool2d"), ("max", "AdaptiveMaxPool2d")):
        for name, xs, osz, t in [("down", [1, 2, 5, 7], [3, 4], F32), ("even", [2, 1, 4, 4], [2, 2], F64),
                                 ("up", [1, 1, 2, 3], [3, 5], F32), ("global", [1, 3, 3, 5], [1, 1], F32)]:
            x = rand(xs, t)
            tol = tol_for(x, TOL_ACC) if kind == "avg" else TOL_EXACT
            case(fam, f"adaptive_{kind}_pool2d_{name}", comp(variant, {"output_size": osz}), [x],
                 [adaptive(x, osz, kind).astype(t)], tol)
    xi = rand([1, 2, 5, 3], I32, -9, 9)
    case(fam, "adaptive_max_pool2d_i32", comp("AdaptiveMaxPool2d", {"output_size": [2, 2]}), [xi],
         [adaptive(xi, [2, 2], "max").astype(I32)], TOL_EXACT)


def gen_nn_norm():
    fam = "composite_norm"
    for name, xs, train, t, eps, mom in [("batch_norm_train_2d", [4, 3], True, F32, 1e-5, 0.9),
                                         ("batch_norm_train_4d", [2, 3, 4, 5], True, F32, 1e-5, 0.9),
                                         ("batch_norm_train_f64_3d", [3, 2, 4], True, F64, 1e-3, 0.8),
                                         ("batch_norm_eval_4d", [2, 3, 4, 4], False, F32, 1e-5, 0.9),
                                         ("batch_norm_eval_f64_2d", [5, 2], False, F64, 1e-2, 0.9)]:
        c = xs[1]
        x, sc, bi = rand(xs, t, -3, 3), rand([c], t, 0.5, 2), rand([c], t)
        rm, rv = rand([c], t, -1, 1), rand([c], t, 0.5, 2)
        axes = tuple(i for i in range(len(xs)) if i != 1)
        bshape = [1, c] + [1] * (len(xs) - 2)
        if train:
            mean, var = f64(x).mean(axis=axes), f64(x).var(axis=axes)  # biased batch variance
        else:
            mean, var = f64(rm), f64(rv)
        y = (f64(x) - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape) + eps) * f64(sc).reshape(bshape) \
            + f64(bi).reshape(bshape)
        outs = [y.astype(t)]
        if train:
            outs += [(mom * f64(rm) + (1 - mom) * mean).astype(t), (mom * f64(rv) + (1 - mom) * var).astype(t)]
        op = comp("BatchNorm", {"epsilon": eps, "momentum": mom, "training": train})
        case(fam, name, op, [x, sc, bi, rm, rv], outs, tol_for(x, TOL_ACC))

    for name, xs, nd, affine, t in [("layer_norm_last_affine", [2, 3, 4], 1, True, F32),
                                    ("layer_norm_two_axes_plain", [2, 3, 4], 2, False, F32),
                                    ("layer_norm_f64_affine", [3, 5], 1, True, F64),
                                    ("layer_norm_all_axes_affine", [2, 3], 2, True, F32)]:
        x = rand(xs, t, -3, 3)
        axes = tuple(range(len(xs) - nd, len(xs)))
        xf = f64(x)
        y = (xf - xf.mean(axis=axes, keepdims=True)) / np.sqrt(xf.var(axis=axes, keepdims=True) + 1e-5)
        ins = [x]
        if affine:
            w, b = rand(xs[-nd:], t, 0.5, 2), rand(xs[-nd:], t)
            ins, y = ins + [w, b], y * f64(w) + f64(b)
        case(fam, name, comp("LayerNorm", {"normalized_ndim": nd, "epsilon": 1e-5}), ins, [y.astype(t)],
             tol_for(x, TOL_ACC))

    def log_softmax(x, axis):
        m = x.max(axis=axis, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))

    for name, x, axis in [("f32_ax1", rand([2, 5], F32, -4, 4), 1), ("f32_ax0_3d", rand([3, 4, 2], F32, -4, 4), 0),
                          ("f64_ax2", rand([2, 2, 6], F64, -4, 4), 2),
                          ("f32_large", np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -999.0]], F32), 1)]:
        ls = log_softmax(f64(x), axis)
        t = x.dtype.type
        case(fam, f"softmax_{name}", comp("Softmax", {"axis": axis}), [x], [np.exp(ls).astype(t)], tol_for(x, TOL_ACC))
        case(fam, f"log_softmax_{name}", comp("LogSoftmax", {"axis": axis}), [x], [ls.astype(t)], tol_for(x, TOL_ACC))

    for red in ("Mean", "Sum", "None"):
        for t, it in ((F32, I64), (F64, I32)):
            logits = rand([4, 5], t, -3, 3)
            labels = np.array([0, 4, 2, 2], it)
            loss = -log_softmax(f64(logits), 1)[np.arange(4), labels]
            out = {"Mean": loss.mean(), "Sum": loss.sum(), "None": loss}[red]
            case(fam, f"cross_entropy_{red.lower()}_{NAMES[np.dtype(t).name]}",
                 comp("CrossEntropy", {"reduction": red}), [logits, labels], [np.asarray(out).astype(t)],
                 tol_for(logits, TOL_ACC))
    case(fam, "cross_entropy_label_out_of_range", comp("CrossEntropy", {"reduction": "Mean"}),
         [rand([2, 3], F32), np.array([0, 3], I64)], [], error=True)


def gen_nn_activation():
    fam = "composite_activation"
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))
    acts = {
        "relu": (comp("Relu"), lambda v: np.maximum(v, 0)),
        "gelu_erf": (comp("Gelu", {"approximate": False}), lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2)))),
        "gelu_tanh": (comp("Gelu", {"approximate": True}),
                      lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))),
        "silu": (comp("Silu"), lambda v: v * sig(v)),
        "sigmoid": (comp("Sigmoid"), sig),
        "dropout_eval": (comp("Dropout", {"p": 0.5, "training": False, "seed": 7}), lambda v: v),
    }
    for name, (op, fn) in acts.items():
        for t in (F32, F64):
            x = np.concatenate([rand([12], t, -4, 4), np.array([0.0, 15.0, -15.0], t)])
            case(fam, f"{name}_{NAMES[np.dtype(t).name]}", op, [x], [fn(f64(x)).astype(t)])
    xi = np.array([[-3, 0, 2], [5, -1, 7]], I32)
    case(fam, "relu_i32", comp("Relu"), [xi], [np.maximum(xi, 0)])
    xh = rand([6], F16, -3, 3)
    case(fam, "sigmoid_f16", comp("Sigmoid"), [xh], [sig(f64(xh)).astype(F16)])

    for name, ids, w in [("embedding_i64_2d", np.array([[0, 5, 2], [2, 2, 1]], I64), rand([6, 4], F32)),
                         ("embedding_i32_scalar", np.array(3, I32), rand([5, 3], F64))]:
        case(fam, name, comp("Embedding"), [ids, w], [w[ids]], TOL_EXACT)
    case(fam, "embedding_out_of_range", comp("Embedding"), [np.array([0, 6], I64), rand([6, 2], F32)], [], error=True)

    for name, qs, ks, vs, causal, scale, mask, t in [
        ("sdpa_plain", [2, 3, 4], [2, 5, 4], [2, 5, 6], False, None, None, F32),
        ("sdpa_causal_square", [1, 2, 4, 3], [1, 2, 4, 3], [1, 2, 4, 3], True, None, None, F32),
        ("sdpa_causal_rect", [2, 3, 4], [2, 5, 4], [2, 5, 2], True, None, None, F64),
        ("sdpa_bool_mask", [2, 3, 4], [2, 5, 4], [2, 5, 3], False, None, "bool", F32),
        ("sdpa_float_mask_scale", [2, 3, 4], [2, 5, 4], [2, 5, 3], False, 0.3, "float", F32),
        ("sdpa_scale_f64", [1, 3, 2], [1, 3, 2], [1, 3, 2], False, 1.5, None, F64),
    ]:
        q, k, v = rand(qs, t), rand(ks, t), rand(vs, t)
        L, S, E = qs[-2], ks[-2], qs[-1]
        sc = f64(q) @ np.swapaxes(f64(k), -1, -2) * (scale if scale is not None else 1 / math.sqrt(E))
        ins = [q, k, v]
        if causal:
            sc = np.where(np.tril(np.ones((L, S), bool)), sc, -np.inf)  # key index > query index masked
        if mask == "bool":
            m = rand([L, S], BOOL)
            m[:, 0] = True  # every query keeps a key (fully masked rows are NaN in PyTorch)
            ins.append(m)
            sc = np.where(m, sc, -np.inf)
        elif mask == "float":
            m = rand([2, 1, S], t, -2, 2)
            ins.append(m)
            sc = sc + f64(m)
        p = np.exp(sc - sc.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        op = comp("ScaledDotProductAttention", {"causal": causal, "scale": scale})
        case(fam, name, op, ins, [(p @ f64(v)).astype(t)], tol_for(q, TOL_ACC))


def gen_edges():
    """Empty tensors, scalars and numerically hard inputs, where implementations usually slip."""
    fam = "edge"
    e = np.zeros([0, 3], F32)
    case(fam, "exp_empty", {"Unary": "Exp"}, [e], [e])
    case(fam, "add_empty_bcast", {"Binary": "Add"}, [e, rand([3], F32)], [e])
    case(fam, "sum_keep_empty_other_axis", {"Reduce": {"op": "Sum", "axes": [1], "keepdim": True}}, [e],
         [np.zeros([0, 1], F32)])
    case(fam, "permute_empty", {"Permute": {"perm": [1, 0]}}, [e], [e.T])
    a, b = rand([2, 0], F32), rand([0, 3], F32)
    case(fam, "matmul_k0", "MatMul", [a, b], [np.zeros([2, 3], F32)], TOL_EXACT)
    s, t = rand([], F64), rand([], F64)
    case(fam, "tanh_scalar", {"Unary": "Tanh"}, [s], [np.tanh(s)])
    case(fam, "mul_scalars", {"Binary": "Mul"}, [s, t], [s * t])
    case(fam, "sum_scalar_no_axes", {"Reduce": {"op": "Sum", "axes": [], "keepdim": False}}, [s], [s])
    c, x, y = np.array(False), rand([2, 2], I32, -5, 5), rand([2, 2], I32, -5, 5)
    case(fam, "where_scalar_cond", "Where", [c, x, y], [np.where(c, x, y)], TOL_EXACT)
    src = rand([1, 3, 1], F32)
    case(fam, "broadcast_middle", {"Broadcast": {"shape": dims([2, 2, 3, 4])}}, [src],
         [np.broadcast_to(src, [2, 2, 3, 4])], TOL_EXACT)
    xn = np.array([[1.0, NAN, 3.0, NAN], [2.0, 0.0, -1.0, 0.0]], F32)
    for op, fn in (("ArgMax", np.argmax), ("ArgMin", np.argmin)):  # NaN counts as the extreme (numpy, PyTorch)
        case(fam, f"{op.lower()}_f32_nan", {"ArgReduce": {"op": op, "axis": 1, "keepdim": False}}, [xn],
             [fn(xn, axis=1).astype(I64)], TOL_EXACT)
    d = rand([2, 3, 4], I64, -9, 9)
    idx = np.array([[0, 3], [-1, 1]], I64)
    upd = rand([2, 3, 2, 2], I64, -9, 9)
    case(fam, "scatter_add_i64_last_axis", {"Scatter": {"axis": 2, "reduce": "Add"}}, [d, idx, upd],
         [scatter_np(d, idx, upd, 2, True)], TOL_EXACT)

    # Large offsets: E[x²] - E[x]² cancels catastrophically in f32; a stable variance does not.
    xo = (1000.0 + rand([4, 8], F64, -0.05, 0.05)).astype(F32)
    xf = f64(xo)
    ln = (xf - xf.mean(1, keepdims=True)) / np.sqrt(xf.var(1, keepdims=True) + 1e-5)
    case(fam, "layer_norm_f32_offset", comp("LayerNorm", {"normalized_ndim": 1, "epsilon": 1e-5}), [xo],
         [ln.astype(F32)], (1e-3, 1e-3))
    one, zero = np.ones([8], F32), np.zeros([8], F32)
    # batch_norm over x[N=4, C=8]: unit scale, zero bias, zero running mean, unit running var.
    mean, var = f64(xo).mean(0), f64(xo).var(0)
    y = (f64(xo) - mean) / np.sqrt(var + 1e-5)
    case(fam, "batch_norm_train_f32_offset", comp("BatchNorm", {"epsilon": 1e-5, "momentum": 0.9, "training": True}),
         [xo, one, zero, zero, one], [y.astype(F32), (0.1 * mean).astype(F32), (0.9 + 0.1 * var).astype(F32)],
         (1e-3, 1e-3))
    lg = np.array([[1000.0, -1000.0, 0.0], [-50.0, 50.0, 49.0]], F32)
    lab = np.array([1, 2], I64)
    ls = f64(lg) - f64(lg).max(1, keepdims=True)
    ls = ls - np.log(np.exp(ls).sum(1, keepdims=True))
    case(fam, "cross_entropy_extreme_logits", comp("CrossEntropy", {"reduction": "None"}), [lg, lab],
         [(-ls[np.arange(2), lab]).astype(F32)], TOL_ACC["f32"])
    xm = np.array([[-INF, 0.0, 1.0], [2.0, -INF, -INF]], F32)
    with np.errstate(all="ignore"):
        m = f64(xm).max(1, keepdims=True)
        lsm = f64(xm) - m - np.log(np.exp(f64(xm) - m).sum(1, keepdims=True))
    case(fam, "softmax_neg_inf", comp("Softmax", {"axis": 1}), [xm], [np.exp(lsm).astype(F32)], TOL_ACC["f32"])
    case(fam, "log_softmax_neg_inf", comp("LogSoftmax", {"axis": 1}), [xm], [lsm.astype(F32)], TOL_ACC["f32"])
    big = rand([4096], F32, 0.0, 1.0)
    case(fam, "sum_f32_4096", {"Reduce": {"op": "Sum", "axes": [0], "keepdim": False}}, [big],
         [np.asarray(f64(big).sum()).astype(F32)], TOL_ACC["f32"])
    q = rand([1, 1, 4], F32)
    k, v = rand([1, 3, 4], F32), rand([1, 3, 2], F32)
    m = np.array([True, False, True])
    sc = np.where(m, (f64(q) @ np.swapaxes(f64(k), -1, -2)) / 2.0, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    case(fam, "sdpa_single_query_1d_mask", comp("ScaledDotProductAttention", {"causal": False, "scale": None}),
         [q, k, v, m], [(p @ f64(v)).astype(F32)], TOL_ACC["f32"])


def write_all():
    os.makedirs(OUT_DIR, exist_ok=True)
    for family, cases in sorted(FILES.items()):
        names = [c["name"] for c in cases]
        assert len(names) == len(set(names)), f"duplicate case names in {family}"
        body = ",\n".join(json.dumps(c, separators=(",", ":"), allow_nan=False) for c in cases)
        with open(os.path.join(OUT_DIR, f"{family}.json"), "w", newline="\n") as f:
            f.write("[\n" + body + "\n]\n")


def main():
    for gen in (gen_unary, gen_binary, gen_cast, gen_reduce, gen_movement, gen_indexing, gen_contraction,
                gen_nn_layers, gen_nn_norm, gen_nn_activation, gen_edges):
        gen()
    write_all()
    total = sum(len(c) for c in FILES.values())
    print(f"wrote {total} cases in {len(FILES)} files to {os.path.normpath(OUT_DIR)}")


if __name__ == "__main__":
    main()
