//! Inline f32 `exp`, `tanh` and `erf` (scalar or f32x4), so softmax and GELU run as straight
//! SIMD code instead of a call per element.
//!
//! Accuracy against the reference (f64 libm rounded to f32), checked by tests over wide
//! ranges including ±inf, NaN, subnormal results and overflow:
//! - `exp`: Cephes-style `expf` (Cody–Waite reduction by ln 2, degree-6 polynomial) with the scale
//!   2ⁿ applied as two exact factors, so overflow to inf and gradual underflow to subnormals
//!   round once like the reference: ≤ 1 ulp.
//! - `tanh`: Cephes `tanhf`: an odd polynomial for |x| < 0.625, `1 - 2/(exp(2|x|) + 1)`
//!   above: ≤ 1 ulp on a dense grid (≤ 2.5e-7 relative anywhere).
//! - `erf`: `x·P(x²)` (degree 6) for |x| < 1 and a degree-14 polynomial in `(|x| - 2.5)/1.5`
//!   on [1, 4] (|x| clamped to 4, where erf rounds to 1), least-squares fits in Chebyshev
//!   form: ≤ 3 ulp (≤ 2.4e-7 relative).
//!
//! The same code runs on scalars (loop remainders), so an element's result does not depend on
//! where it falls in a vector. Where the ISA has FMA, Horner steps and the reduction use it
//! (one rounding instead of two; the bounds above hold either way).

use super::emit::Em;
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value, types};

/// `(e^r - 1 - r) / r²` on |r| ≤ ln2/2 (least-squares fit, one degree below Cephes' with
/// the same ≤ 1 ulp end result), highest degree first.
const EXP_P: [f64; 5] = [
    0.001_374_619_884_342_134_1,
    0.008_370_352_984_652_137,
    0.041_669_763_549_550_88,
    0.166_665_062_806_937_24,
    0.499_999_871_794_669_2,
];
/// Cephes tanhf polynomial (|x| < 0.625), highest degree first.
const TANH_P: [f64; 5] = [
    -5.704_988_727_45E-3,
    2.063_908_879_54E-2,
    -5.373_971_555_31E-2,
    1.333_144_220_36E-1,
    -3.333_328_194_22E-1,
];
/// erf(a)/a ≈ P(a²) on [0, 1], lowest degree first.
const ERF_A: [f64; 7] = [
    1.128_379_166_232_697_8,
    -0.376_126_297_680_977_66,
    0.112_836_346_500_911_1,
    -0.026_856_070_400_906_075,
    0.005_192_959_782_543_69,
    -0.000_805_377_097_673_918_5,
    8.006_950_100_280_285e-5,
];
/// erf(a) ≈ Q((a - 2.5)/1.5) on [1, 4], lowest degree first.
const ERF_B: [f64; 15] = [
    0.999_593_047_692_440_3,
    0.003_267_315_168_795_241_5,
    -0.012_252_806_006_242_189,
    0.028_186_030_587_815_467,
    -0.043_651_819_780_469_156,
    0.046_401_521_839_912_6,
    -0.031_866_640_232_584_08,
    0.009_535_281_728_915_428,
    0.006_633_252_550_680_896,
    -0.010_333_472_468_712_884,
    0.004_673_090_675_947_833,
    0.001_476_325_815_788_878_8,
    -0.002_036_762_880_788_772_3,
    0.000_116_624_610_730_793_56,
    0.000_259_026_160_339_958_74,
];

impl Em<'_, '_> {
    /// Horner's rule with coefficients highest degree first.
    fn horner(&mut self, u: Value, coefs: impl IntoIterator<Item = f64>) -> Value {
        let t = self.b.func.dfg.value_type(u);
        let mut it = coefs.into_iter();
        let first = it.next().expect("a coefficient");
        let mut p = self.fconst(t, first);
        for c in it {
            let c = self.fconst(t, c);
            p = self.mul_add(p, u, c);
        }
        p
    }

    /// `a·b + c`, fused where the ISA has FMA.
    fn mul_add(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let m = self.b.ins().fmul(a, b);
            self.b.ins().fadd(m, c)
        }
    }

    fn int_ty(&self, t: Type) -> Type {
        if t.is_vector() { types::I32X4 } else { types::I32 }
    }

    /// `e^x` for f32 / f32x4.
    pub(super) fn exp_f32(&mut self, x: Value) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let it = self.int_ty(t);
        // Beyond these the result is 0 / inf anyway; NaN passes through.
        let lo = self.fconst(t, -104.0);
        let hi = self.fconst(t, 89.0);
        let x = self.max_keep_nan(x, lo);
        let x = self.min_keep_nan(x, hi);
        // n = round(x / ln 2) by the 1.5·2²³ trick (|n| ≤ 151).
        const MAGIC: f32 = 12_582_912.0;
        let log2e = self.fconst(t, std::f64::consts::LOG2_E);
        let magic = self.fconst(t, MAGIC as f64);
        let tt = self.mul_add(x, log2e, magic);
        let nf = self.b.ins().fsub(tt, magic);
        let ti = self.b.ins().bitcast(it, super::ops::le(), tt);
        let mbits = self.iconst(it, MAGIC.to_bits() as i64);
        let ni = self.b.ins().isub(ti, mbits);
        // r = x - n·ln 2 in two steps (n·C1 is exact).
        let c1 = self.fconst(t, -0.693_359_375);
        let c2 = self.fconst(t, 2.121_944_40e-4);
        let r = self.mul_add(nf, c1, x);
        let r = self.mul_add(nf, c2, r);
        let z = self.b.ins().fmul(r, r);
        let p = self.horner(r, EXP_P);
        let p = self.mul_add(p, z, r);
        let one = self.fconst(t, 1.0);
        let p = self.b.ins().fadd(p, one);
        // 2ⁿ as 2^(n>>1) · 2^(n - n>>1): both factors are normal, the last product rounds once.
        let n1 = self.b.ins().sshr_imm_s(ni, 1);
        let n2 = self.b.ins().isub(ni, n1);
        let bias = self.iconst(it, 127);
        let mut y = p;
        for n in [n1, n2] {
            let e = self.b.ins().iadd(n, bias);
            let e = self.b.ins().ishl_imm_s(e, 23);
            let s = self.b.ins().bitcast(t, super::ops::le(), e);
            y = self.b.ins().fmul(y, s);
        }
        y
    }

    /// `tanh x` for f32 / f32x4.
    pub(super) fn tanh_f32(&mut self, x: Value) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let a = self.b.ins().fabs(x);
        // |x| ≥ 0.625: 1 - 2 / (e^{2|x|} + 1).
        let a2 = self.b.ins().fadd(a, a);
        let e = self.exp_f32(a2);
        let one = self.fconst(t, 1.0);
        let two = self.fconst(t, 2.0);
        let d = self.b.ins().fadd(e, one);
        let q = self.b.ins().fdiv(two, d);
        let big = self.b.ins().fsub(one, q);
        // |x| < 0.625: a + a·z·P(z), z = a².
        let z = self.b.ins().fmul(a, a);
        let p = self.horner(z, TANH_P);
        let pz = self.b.ins().fmul(p, z);
        let small = self.mul_add(pz, a, a);
        let lim = self.fconst(t, 0.625);
        let is_small = self.b.ins().fcmp(FloatCC::LessThan, a, lim);
        let r = self.choose(is_small, small, big);
        self.copysign(r, x)
    }

    /// `erf x` for f32 / f32x4.
    pub(super) fn erf_f32(&mut self, x: Value) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let a = self.b.ins().fabs(x);
        let four = self.fconst(t, 4.0);
        let a = self.min_keep_nan(a, four);
        let z = self.b.ins().fmul(a, a);
        let pa = self.horner(z, ERF_A.iter().rev().copied());
        let small = self.b.ins().fmul(a, pa);
        let mid = self.fconst(t, 2.5);
        let inv = self.fconst(t, 1.0 / 1.5);
        let u = self.b.ins().fsub(a, mid);
        let u = self.b.ins().fmul(u, inv);
        let big = self.horner(u, ERF_B.iter().rev().copied());
        let one = self.fconst(t, 1.0);
        let is_small = self.b.ins().fcmp(FloatCC::LessThan, a, one);
        let r = self.choose(is_small, small, big);
        self.copysign(r, x)
    }
}

use cranelift_codegen::ir::Type;
