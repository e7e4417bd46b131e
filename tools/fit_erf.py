#!/usr/bin/env python3
"""Fits the f32 erf polynomials of backends/cpu-runtime/src/ewise.rs (`erf_small`, `erfc_large`)
and reports their worst error in ulps when evaluated in f32 (Horner), against Python's
double-precision math.erf.

    erf(a)  = a · P(a²)                     0 ≤ a < 1      (degree 6 in a²)
    erfc(a) = e^{-a²} / a · R(1/a²)          1 ≤ a ≤ 4      (degree 9 in 1/a²)
    erfc(a)/2 = u · 2^{Q(u) - x²·log2(e)/2}, a = |x|/√2, u = 1/(2√2 + |x|)  (degree 9 in u; GELU's)

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

# GELU: h(x) = erfc(|x|/√2) / 2 = u · 2^{Q(u) - x²·log2(e)/2}, u = 1/(K + |x|), K = 2√2 (in f32),
# Q fitted in u (absolute error: it is an exponent) on Chebyshev nodes of u over |x| in [0, 13.3]
# (past it GELU's negative side is below 1e-38); 2^r on [-1/2, 1/2] as 1 + r·E(r).
LOG2E = math.log2(math.e)
K = float(np.float32(2 * math.sqrt(2)))
XMAX = 13.3
q = fit(lambda u: np.array([math.log2(0.5 * math.erfc((1 / w - K) / math.sqrt(2)) / w) + (1 / w - K) ** 2 * LOG2E / 2
                            for w in u]),
        1 / (K + XMAX), 1 / K, 9, lambda u: u, nodes=6000, relative=False)
e2 = fit(lambda r: np.where(r == 0, math.log(2), (2**r - 1) / np.where(r == 0, 1, r)), -0.5, 0.5, 4, lambda r: r)
x = np.linspace(-14, 12, 800_001).astype(np.float32)
u = (np.float32(1) / (np.float32(K) + np.abs(x)).astype(np.float32)).astype(np.float32)
# y = fma(x · c, x, Q(u)), c = -log2(e)/2 rounded to f32
y = ((x * np.float32(-LOG2E / 2)).astype(np.float32).astype(np.float64) * x + horner32(q, u)).astype(np.float32)
n = np.round(y).astype(np.float32)
r = (y - n).astype(np.float32)
p2 = (r.astype(np.float64) * horner32(e2, r) + 1).astype(np.float32)
h = (u * (p2.astype(np.float64) * 2.0 ** n.astype(np.float64)).astype(np.float32)).astype(np.float32)
h = np.where(y < -125, np.float32(0), h)
gelu = (x * np.where(x < 0, h, (np.float32(1) - h).astype(np.float32))).astype(np.float32)
want = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])
keep = np.abs(want) > 1e-30
rel = np.abs(gelu[keep] - want[keep]) / np.abs(want[keep])
xs = x[keep]
print("Q (gelu):", [str(c) for c in q])
print("E (gelu's 2^r):", [str(c) for c in e2])
print("  GELU max relative error: x in [-3, 0):", float(rel[(xs < 0) & (xs > -3)].max()),
      " x < 0:", float(rel[xs < 0].max()), " x > 0:", ulps(gelu[keep][xs > 0], want[keep][xs > 0]), "ulp",
      " |GELU| ≥ 1e-3, x < 0:", ulps(gelu[keep][(xs < 0) & (np.abs(want[keep]) >= 1e-3)],
                                      want[keep][(xs < 0) & (np.abs(want[keep]) >= 1e-3)]), "ulp",
      " below 1e-30: absolute", float(np.abs(gelu[~keep] - want[~keep]).max()))
