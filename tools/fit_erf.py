#!/usr/bin/env python3
"""Fits the f32 erf polynomials of backends/cpu-runtime/src/ewise.rs (`erf_small`, `erfc_large`)
and reports their worst error in ulps when evaluated in f32 (Horner), against Python's
double-precision math.erf.

    erf(a)  = a · P(a²)                     0 ≤ a < 1      (degree 6 in a²)
    erfc(a) = e^{-a²} / a · R(1/a²)          1 ≤ a ≤ 4      (degree 9 in 1/a²)
    erfc(a) = t · e^{G(t) - a²}, t = 1/(1 + a/2), 0 ≤ a ≤ 10  (degree 9 in t; GELU's)

Each fit is a weighted least-squares fit on Chebyshev nodes (weights 1/|f|: relative error),
reweighted by Lawson's iteration towards the minimax fit. The GELU form is reported by
GELU's error (relative, and in ulps for x > 0). Prints each polynomial's coefficients (constant
term first, as shortest-round-trip f32 literals) and its error.
Needs numpy.
"""
import math

import numpy as np


def fit(f, lo, hi, degree, var, nodes=4000, iterations=30, relative=True):
    k = np.arange(nodes)
    x = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / nodes)
    v, y = var(x), f(x)
    a = np.vstack([v**i for i in range(degree + 1)]).T
    w = 1 / np.abs(y) if relative else np.ones_like(y)
    lawson = np.ones(nodes)
    for _ in range(iterations):
        s = w * np.sqrt(lawson)
        c, *_ = np.linalg.lstsq(a * s[:, None], y * s, rcond=None)
        e = np.abs((a @ c - y) * w)
        lawson = lawson * e
        lawson /= lawson.sum()
    return np.float32(c)


def horner32(c, v):
    p = np.full_like(v, c[-1], dtype=np.float32)
    for ci in c[-2::-1]:
        p = (p * v + ci).astype(np.float32)
    return p


def ulps(got, want):
    g = got.astype(np.float32).view(np.int32).astype(np.int64)
    w = want.astype(np.float32).view(np.int32).astype(np.int64)
    return int(np.abs(g - w).max())


erf = np.vectorize(math.erf)
erfc = np.vectorize(math.erfc)

p = fit(lambda x: erf(x) / x, 1e-9, 1.0, 6, lambda x: x * x)
a = np.linspace(1e-6, 1, 200_001).astype(np.float32)
print("P (erf_small):", [str(c) for c in p])
print("  max error:", ulps(horner32(p, (a * a).astype(np.float32)) * a, erf(a.astype(np.float64))), "ulp")

r = fit(lambda x: erfc(x) * x * np.exp(x * x), 1.0, 4.0, 9, lambda x: 1 / (x * x))
a = np.linspace(1, 4, 300_001).astype(np.float32)
z = (a * a).astype(np.float32)
e = np.exp(-z.astype(np.float64)).astype(np.float32)
got = (np.float32(1) - (e * horner32(r, (np.float32(1) / z).astype(np.float32)) / a).astype(np.float32))
print("R (erfc_large):", [str(c) for c in r])
print("  max error of 1 - erfc:", ulps(got, erf(a.astype(np.float64))), "ulp")

# GELU: G(t) = ln(erfc(a) / t) + a², fitted in t (absolute error: it is an exponent) on
# Chebyshev nodes of t over a in [0, 10].
g = fit(lambda t: np.array([math.log(math.erfc(2 * (1 / u - 1)) / u) + (2 * (1 / u - 1)) ** 2 for u in t]),
        1 / 6, 1.0, 9, lambda t: t, nodes=6000, relative=False)
x = np.linspace(-13, 10, 400_001).astype(np.float32)
a = np.abs((x * np.float32(math.sqrt(0.5))).astype(np.float32))
t = (np.float32(1) / (np.float32(1) + np.float32(0.5) * a)).astype(np.float32)
arg = (horner32(g, t).astype(np.float64) - a.astype(np.float64) ** 2).astype(np.float32)  # a fused multiply-add
ec = (t * np.exp(arg.astype(np.float64)).astype(np.float32)).astype(np.float32)
gelu = (np.float32(0.5) * x * np.where(x < 0, ec, (np.float32(2) - ec).astype(np.float32))).astype(np.float32)
want = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])
keep = np.abs(want) > 1e-30
rel = np.abs(gelu[keep] - want[keep]) / np.abs(want[keep])
print("G (erfc_gelu):", [str(c) for c in g])
print("  GELU max relative error: x in [-3, 0):", float(rel[(x[keep] < 0) & (x[keep] > -3)].max()),
      " everywhere:", float(rel.max()), " x > 0:", ulps(gelu[keep][x[keep] > 0], want[keep][x[keep] > 0]), "ulp")
