/* The op table every generated file starts with (oar-example-vendor-c): one helper per
 * (op, operand kind), named `<op>_<f|i|b>` (float, integer, bool). The Rust code generator
 * calls `<op>_<kind>` if `U_<kind>(<op>,` / `B_<kind>(<op>,` appears below, and leaves the
 * kernel to the interpreter otherwise. Kernels arrive legalized (`oar::passes::legalize`):
 * exp, log, sin, cos, tanh, erf, rsqrt, pow, rem and NaN-aware max/min are already core
 * arithmetic, so the table holds only that core. Floats are computed in double (the caller
 * rounds to the instruction's dtype), integers in int64_t (wrapping: compiled with -fwrapv).
 * Binary helpers set *e on an integer division by zero or a negative integer power. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#define U_f(op, expr) static inline double op##_f(double x) { return expr; }
#define U_i(op, expr) static inline int64_t op##_i(int64_t x) { return expr; }
#define U_b(op, expr) static inline int64_t op##_b(int64_t x) { return expr; }
#define B_f(op, expr) static inline double op##_f(double a, double b, int *e) { (void)e; return expr; }
#define B_i(op, expr) static inline int64_t op##_i(int64_t a, int64_t b, int *e) { (void)e; return expr; }
#define B_b(op, expr) static inline int64_t op##_b(int64_t a, int64_t b, int *e) { (void)e; return expr; }

U_f(neg, -x) U_f(abs, fabs(x)) U_f(sqrt, sqrt(x)) U_f(recip, 1.0 / x)
U_f(floor, floor(x)) U_f(ceil, ceil(x)) U_f(round, nearbyint(x)) /* ties to even */
U_f(sign, x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : x)) /* NaN stays NaN */
U_i(neg, -x) U_i(abs, x < 0 ? -x : x) U_i(sign, (x > 0) - (x < 0)) U_i(not, ~x)
U_b(not, !x)

/* max/min propagate NaN (reductions combine with them). */
B_f(add, a + b) B_f(sub, a - b) B_f(mul, a * b) B_f(div, a / b)
B_f(max, isnan(a) || isnan(b) ? NAN : (a > b ? a : b)) B_f(min, isnan(a) || isnan(b) ? NAN : (a < b ? a : b))
B_f(eq, a == b) B_f(ne, a != b) B_f(lt, a < b) B_f(le, a <= b) B_f(gt, a > b) B_f(ge, a >= b)
B_i(add, a + b) B_i(sub, a - b) B_i(mul, a * b) B_i(max, a > b ? a : b) B_i(min, a < b ? a : b)
B_i(and, a & b) B_i(or, a | b) B_i(xor, a ^ b)
B_i(div, !b ? (*e = 1, 0) : (b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b))
static inline int64_t ipow(int64_t a, int64_t x) { int64_t r = 1; for (; x > 0; x >>= 1, a *= a) if (x & 1) r *= a; return r; }
B_i(pow, b < 0 ? (*e = 1, 0) : ipow(a, b))
B_i(eq, a == b) B_i(ne, a != b) B_i(lt, a < b) B_i(le, a <= b) B_i(gt, a > b) B_i(ge, a >= b)
B_b(and, a & b) B_b(or, a | b) B_b(xor, a ^ b)
B_b(eq, a == b) B_b(ne, a != b) B_b(lt, a < b) B_b(le, a <= b) B_b(gt, a > b) B_b(ge, a >= b)

/* The kernel description's bitcast: the same bits as another type. */
static inline int32_t bits_of_f32(float x) { int32_t r; memcpy(&r, &x, 4); return r; }
static inline float f32_of_bits(int32_t x) { float r; memcpy(&r, &x, 4); return r; }
static inline int64_t bits_of_f64(double x) { int64_t r; memcpy(&r, &x, 8); return r; }
static inline double f64_of_bits(int64_t x) { double r; memcpy(&r, &x, 8); return r; }
