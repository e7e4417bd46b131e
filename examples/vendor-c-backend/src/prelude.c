/* The op table every generated file starts with (oar-example-vendor-c): one helper per
 * (op, operand kind), named `<op>_<f|i|b>` (float, integer, bool). The Rust code generator
 * calls `<op>_<kind>` if `U_<kind>(<op>,` / `B_<kind>(<op>,` appears below, and leaves the
 * kernel to the interpreter otherwise. Floats are computed in double (the caller rounds to the
 * instruction's dtype), integers in int64_t (wrapping: compiled with -fwrapv). Binary helpers
 * set *e on an integer division by zero or a negative integer power. */
#include <math.h>
#include <stdint.h>
#define U_f(op, expr) static inline double op##_f(double x) { return expr; }
#define U_i(op, expr) static inline int64_t op##_i(int64_t x) { return expr; }
#define U_b(op, expr) static inline int64_t op##_b(int64_t x) { return expr; }
#define B_f(op, expr) static inline double op##_f(double a, double b, int *e) { (void)e; return expr; }
#define B_i(op, expr) static inline int64_t op##_i(int64_t a, int64_t b, int *e) { (void)e; return expr; }
#define B_b(op, expr) static inline int64_t op##_b(int64_t a, int64_t b, int *e) { (void)e; return expr; }

U_f(neg, -x) U_f(abs, fabs(x)) U_f(exp, exp(x)) U_f(log, log(x)) U_f(sqrt, sqrt(x))
U_f(rsqrt, 1.0 / sqrt(x)) U_f(recip, 1.0 / x) U_f(sin, sin(x)) U_f(cos, cos(x)) U_f(tanh, tanh(x))
U_f(erf, erf(x)) U_f(floor, floor(x)) U_f(ceil, ceil(x)) U_f(round, nearbyint(x)) /* ties to even */
U_f(sign, x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : x)) /* NaN stays NaN */
U_i(neg, -x) U_i(abs, x < 0 ? -x : x) U_i(sign, (x > 0) - (x < 0)) U_i(not, ~x)
U_b(not, !x)

/* max/min propagate NaN; rem has the sign of the divisor (numpy `mod`). */
B_f(add, a + b) B_f(sub, a - b) B_f(mul, a * b) B_f(div, a / b) B_f(pow, pow(a, b))
B_f(max, isnan(a) || isnan(b) ? NAN : (a > b ? a : b)) B_f(min, isnan(a) || isnan(b) ? NAN : (a < b ? a : b))
B_f(rem, fmod(a, b) == 0.0 ? copysign(0.0, b) : ((fmod(a, b) < 0.0) != (b < 0.0) ? fmod(a, b) + b : fmod(a, b)))
B_f(eq, a == b) B_f(ne, a != b) B_f(lt, a < b) B_f(le, a <= b) B_f(gt, a > b) B_f(ge, a >= b)
B_i(add, a + b) B_i(sub, a - b) B_i(mul, a * b) B_i(max, a > b ? a : b) B_i(min, a < b ? a : b)
B_i(and, a & b) B_i(or, a | b) B_i(xor, a ^ b)
B_i(div, !b ? (*e = 1, 0) : (b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b))
B_i(rem, !b ? (*e = 1, 0) : (b == -1 ? 0 : ((a % b != 0 && ((a % b < 0) != (b < 0))) ? a % b + b : a % b)))
static inline int64_t ipow(int64_t a, int64_t x) { int64_t r = 1; for (; x > 0; x >>= 1, a *= a) if (x & 1) r *= a; return r; }
B_i(pow, b < 0 ? (*e = 1, 0) : ipow(a, b))
B_i(eq, a == b) B_i(ne, a != b) B_i(lt, a < b) B_i(le, a <= b) B_i(gt, a > b) B_i(ge, a >= b)
B_b(and, a & b) B_b(or, a | b) B_b(xor, a ^ b)
B_b(eq, a == b) B_b(ne, a != b) B_b(lt, a < b) B_b(le, a <= b) B_b(gt, a > b) B_b(ge, a >= b)

/* Rust's saturating float -> int `as` (NaN -> 0); (double)INT64_MAX rounds up to 2^63. */
#define UINT8_MIN 0
static inline int64_t f2i(double v, int64_t lo, int64_t hi) {
  return isnan(v) ? 0 : (v >= (double)hi ? hi : (v <= (double)lo ? lo : (int64_t)v)); }
