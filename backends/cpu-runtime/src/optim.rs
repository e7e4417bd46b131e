//! Optimizer updates, one pass over a parameter, its gradient and its state at the host's
//! vector width (AVX-512 or AVX2+FMA chosen at run time), split across threads for large
//! parameters: Adam / AdamW (`oar_ir::ops::AdamUpdate`) for eager optimizers (in place) and for
//! compiled training steps (the cpu backend keeps `adam_update` whole and runs [`adam_into`]).
//!
//! The per-call constants (bias corrections, decay) are computed once in f64
//! ([`AdamUpdate::constants`]) and rounded to the element type; each element is then
//! `m' = β₁ m + (1 - β₁) g`, `v' = β₂ v + (1 - β₂) g²`,
//! `p' = p · decay - step_size · m' / (√v' / √(1 - β₂^t) + ε)` in that type.

use crate::contraction::SendPtr;
use crate::native::{elems, elems_mut};
use crate::par::par_units;
use crate::simd::{Simd, instances};
use oar_ir::ops::AdamUpdate;

/// Elements per task (a pool wake-up costs more below it).
const TASK: usize = 1 << 15;

/// The element types of the updates.
pub trait AdamElem: Copy + Send + Sync + 'static {
    /// The f64 constant rounded to this type.
    fn of(v: f64) -> Self;
    /// The host instance of the out-of-place kernel.
    fn run(k: [Self; 8], ins: [&[Self]; 4], outs: [&mut [Self]; 3]);
}

impl AdamElem for f32 {
    fn of(v: f64) -> f32 {
        v as f32
    }
    fn run(k: [f32; 8], ins: [&[f32]; 4], outs: [&mut [f32]; 3]) {
        adam_f32_into_host(k, ins, outs)
    }
}

impl AdamElem for f64 {
    fn of(v: f64) -> f64 {
        v
    }
    fn run(k: [f64; 8], ins: [&[f64]; 4], outs: [&mut [f64]; 3]) {
        adam_f64_into_host(k, ins, outs)
    }
}

/// `[β₁, 1 - β₁, β₂, 1 - β₂, step_size, √(1 - β₂^t), ε, decay]` in the element type (each
/// computed in f64 and rounded once, as PyTorch's Python-side constants are).
fn constants<T: AdamElem>(op: &AdamUpdate, lr: f64, step: f64) -> [T; 8] {
    let k = op.constants(lr, step);
    [
        T::of(op.beta1.0),
        T::of(1.0 - op.beta1.0),
        T::of(op.beta2.0),
        T::of(1.0 - op.beta2.0),
        T::of(k.step_size),
        T::of(k.bc2_sqrt),
        T::of(op.epsilon.0),
        T::of(k.decay),
    ]
}

/// The element function and the out-of-place body for one float type.
macro_rules! bodies {
    ($t:ty) => {
        /// One element's `(p', m', v')`.
        #[inline(always)]
        fn element(k: [$t; 8], p: $t, g: $t, m: $t, v: $t) -> ($t, $t, $t) {
            let [beta1, rest1, beta2, rest2, step_size, bc2_sqrt, eps, decay] = k;
            let m = beta1 * m + rest1 * g;
            let v = beta2 * v + rest2 * g * g;
            (p * decay - step_size * m / (v.sqrt() / bc2_sqrt + eps), m, v)
        }

        #[inline(always)]
        pub(super) fn into<const F: bool>(k: [$t; 8], ins: [&[$t]; 4], outs: [&mut [$t]; 3]) {
            let [p, g, m, v] = ins;
            let [po, mo, vo] = outs;
            let n = p
                .len()
                .min(g.len())
                .min(m.len())
                .min(v.len())
                .min(po.len())
                .min(mo.len())
                .min(vo.len());
            let (p, g, m, v) = (&p[..n], &g[..n], &m[..n], &v[..n]);
            let (po, mo, vo) = (&mut po[..n], &mut mo[..n], &mut vo[..n]);
            for i in 0..n {
                (po[i], mo[i], vo[i]) = element(k, p[i], g[i], m[i], v[i]);
            }
        }
    };
}

mod f32_body {
    bodies!(f32);

    #[inline(always)]
    pub(super) fn in_place<const F: bool>(k: [f32; 8], p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        let n = p.len().min(g.len()).min(m.len()).min(v.len());
        let (p, g, m, v) = (&mut p[..n], &g[..n], &mut m[..n], &mut v[..n]);
        for i in 0..n {
            (p[i], m[i], v[i]) = element(k, p[i], g[i], m[i], v[i]);
        }
    }
}

mod f64_body {
    bodies!(f64);
}

use f32_body::in_place as adam_f32_in_place_body;
use f32_body::into as adam_f32_into_body;
use f64_body::into as adam_f64_into_body;

instances!(adam_f32_in_place_body, adam_f32_in_place_host, adam_f32_in_place_avx2, adam_f32_in_place_avx512,
    (k: [f32; 8], p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) -> ());
instances!(adam_f32_into_body, adam_f32_into_host, adam_f32_into_avx2, adam_f32_into_avx512,
    (k: [f32; 8], ins: [&[f32]; 4], outs: [&mut [f32]; 3]) -> ());
instances!(adam_f64_into_body, adam_f64_into_host, adam_f64_into_avx2, adam_f64_into_avx512,
    (k: [f64; 8], ins: [&[f64]; 4], outs: [&mut [f64]; 3]) -> ());

/// Run `f(lo, hi)` over `0..n` in tasks of at least [`TASK`] elements on up to `threads`
/// threads (each range disjoint).
fn chunks(n: usize, threads: usize, f: impl Fn(usize, usize) + Sync) {
    let tasks = n.div_ceil(TASK).min(threads.max(1)).max(1);
    let per = n.div_ceil(tasks).max(1);
    par_units(tasks, threads, || (), |_, t| f(t * per, ((t + 1) * per).min(n)));
}

/// One AdamW step of an f32 parameter in place, with its moments `[m, v]` (`lr`, `step` as
/// the op defines them).
pub fn adam_f32_in_place(
    op: &AdamUpdate,
    lr: f64,
    step: f64,
    p: &mut [f32],
    g: &[f32],
    [m, v]: [&mut [f32]; 2],
    threads: usize,
) {
    let n = p.len();
    assert!(
        g.len() == n && m.len() == n && v.len() == n,
        "adam: parameter, gradient and moments of different lengths"
    );
    let k = constants::<f32>(op, lr, step);
    let ptrs = (
        SendPtr(p.as_mut_ptr()),
        SendPtr(m.as_mut_ptr()),
        SendPtr(v.as_mut_ptr()),
    );
    chunks(n, threads, |lo, hi| {
        let (p, m, v) = ptrs;
        // Safety: each task takes the disjoint range lo..hi of the three buffers.
        let part = |b: SendPtr<f32>| unsafe { std::slice::from_raw_parts_mut(b.get().add(lo), hi - lo) };
        adam_f32_in_place_host(k, part(p), &g[lo..hi], part(m), part(v));
    });
}

/// One Adam step into new buffers: `outs = (p', m', v')` from `ins = (p, g, m, v)`, every slice
/// of one length, f32 or f64.
pub fn adam_into<T: AdamElem>(
    op: &AdamUpdate,
    lr: f64,
    step: f64,
    ins: [&[T]; 4],
    outs: [&mut [T]; 3],
    threads: usize,
) -> Result<(), String> {
    let n = ins[0].len();
    if ins.iter().any(|s| s.len() != n) || outs.iter().any(|s| s.len() != n) {
        return Err("adam_update: parameter, gradient, moments and results of different lengths".into());
    }
    let k = constants::<T>(op, lr, step);
    let [po, mo, vo] = outs;
    let ptrs = [
        SendPtr(po.as_mut_ptr()),
        SendPtr(mo.as_mut_ptr()),
        SendPtr(vo.as_mut_ptr()),
    ];
    chunks(n, threads, |lo, hi| {
        // Safety: each task takes the disjoint range lo..hi of the three results.
        let part = |b: SendPtr<T>| unsafe { std::slice::from_raw_parts_mut(b.get().add(lo), hi - lo) };
        T::run(k, ins.map(|s| &s[lo..hi]), ptrs.map(part));
    });
    Ok(())
}

/// [`adam_into`] on operand bytes (`p g m v lr step`, every one of `dtype`) into the three
/// results' bytes.
pub fn adam_bytes(
    op: &AdamUpdate,
    dtype: oar_ir::DType,
    ins: &[&[u8]],
    outs: Vec<&mut [u8]>,
    threads: usize,
) -> Result<(), String> {
    fn typed<T: AdamElem + bytemuck::Pod + oar_ir::Element>(
        op: &AdamUpdate,
        ins: &[&[u8]],
        outs: Vec<&mut [u8]>,
        threads: usize,
    ) -> Result<(), String> {
        let cast = |b| elems::<T>(b, "adam_update operand");
        let scalar = |i: usize, what: &str| -> Result<f64, String> {
            match cast(ins[i])? {
                [x] => Ok(x.to_f64()),
                other => Err(format!(
                    "adam_update: the {what} holds {} elements, not one",
                    other.len()
                )),
            }
        };
        let (lr, step) = (scalar(4, "learning rate")?, scalar(5, "step")?);
        let [po, mo, vo]: [&mut [u8]; 3] = outs.try_into().map_err(|_| "adam_update: three results".to_string())?;
        let cast_mut = |b| elems_mut::<T>(b, "adam_update result");
        let ins = [cast(ins[0])?, cast(ins[1])?, cast(ins[2])?, cast(ins[3])?];
        adam_into(
            op,
            lr,
            step,
            ins,
            [cast_mut(po)?, cast_mut(mo)?, cast_mut(vo)?],
            threads,
        )
    }
    if ins.len() != 6 {
        return Err(format!("adam_update: six operands, got {}", ins.len()));
    }
    match dtype {
        oar_ir::DType::F32 => typed::<f32>(op, ins, outs, threads),
        oar_ir::DType::F64 => typed::<f64>(op, ins, outs, threads),
        other => Err(format!("adam_update: no native kernel for {other}")),
    }
}

/// Whether [`adam_into`] computes `adam_update` on operands of these types (f32/f64, static).
pub fn adam_supported(inputs: &[oar_ir::TensorType]) -> bool {
    inputs.len() == 6
        && matches!(inputs[0].dtype, oar_ir::DType::F32 | oar_ir::DType::F64)
        && inputs
            .iter()
            .all(|t| t.dtype == inputs[0].dtype && t.shape.as_static().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::ops::Float;

    fn op(wd: f64) -> AdamUpdate {
        AdamUpdate {
            beta1: Float(0.9),
            beta2: Float(0.999),
            epsilon: Float(1e-8),
            weight_decay: Float(wd),
        }
    }

    fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
            })
            .collect()
    }

    /// The definition in f64, written out: PyTorch's AdamW step.
    fn expect(wd: f64, lr: f64, t: f64, p: f64, g: f64, m: f64, v: f64) -> (f64, f64, f64) {
        let m = 0.9 * m + 0.1 * g;
        let v = 0.999 * v + 0.001 * g * g;
        let mhat = m / (1.0 - 0.9f64.powf(t));
        let vhat = v / (1.0 - 0.999f64.powf(t));
        // PyTorch adds ε to the bias-corrected root √v̂.
        let eps = 1e-8;
        let p = p * (1.0 - lr * wd) - lr * mhat / (vhat.sqrt() + eps);
        (p, m, v)
    }

    /// f64 results to 1e-12 and f32 to 1e-5 relative of the definition (or of the terms summed), in place and into new
    /// buffers, over several tasks (100K elements, two threads) and tails.
    #[test]
    fn adam_matches_the_definition() {
        for (n, wd, t) in [(100_003, 0.01, 3.0), (37, 0.0, 1.0), (5000, 0.1, 250.0)] {
            let (p, g) = (values(n, 1, -1.0, 1.0), values(n, 2, -1.0, 1.0));
            let (m, v) = (values(n, 3, -0.1, 0.1), values(n, 4, 0.0, 0.01));
            let want: Vec<(f64, f64, f64)> = (0..n).map(|i| expect(wd, 0.01, t, p[i], g[i], m[i], v[i])).collect();
            let check = |got: [&[f64]; 3], tol: f64| {
                for (i, w) in want.iter().enumerate() {
                    // Relative to the output, or to the terms it sums (p ~ 1, m ~ 0.1, v ~ 1e-3):
                    // m' = β₁ m + (1 - β₁) g cancels.
                    let floors = [1.0, 0.1, 1e-3];
                    for (k, (&a, b)) in got.iter().map(|s| &s[i]).zip([w.0, w.1, w.2]).enumerate() {
                        assert!(
                            (a - b).abs() <= tol * b.abs().max(floors[k]),
                            "n {n} element {i} output {k}: {a} vs {b}"
                        );
                    }
                }
            };
            // f64 into.
            let (mut po, mut mo, mut vo) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            adam_into(&op(wd), 0.01, t, [&p, &g, &m, &v], [&mut po, &mut mo, &mut vo], 2).unwrap();
            check([&po, &mo, &vo], 1e-12);
            // f32 into and in place: the same bits.
            let f = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
            let (p32, g32, m32, v32) = (f(&p), f(&g), f(&m), f(&v));
            let (mut po, mut mo, mut vo) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
            adam_into(
                &op(wd),
                0.01,
                t,
                [&p32, &g32, &m32, &v32],
                [&mut po, &mut mo, &mut vo],
                2,
            )
            .unwrap();
            let (mut pi, mut mi, mut vi) = (p32.clone(), m32.clone(), v32.clone());
            adam_f32_in_place(&op(wd), 0.01, t, &mut pi, &g32, [&mut mi, &mut vi], 2);
            assert!(po == pi && mo == mi && vo == vi);
            let w = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
            check([&w(&po), &w(&mo), &w(&vo)], 1e-5);
        }
    }

    #[test]
    fn mismatched_lengths_are_an_error() {
        let a = [0f64; 4];
        let (mut x, mut y, mut z) = ([0f64; 4], [0f64; 4], [0f64; 3]);
        let err = adam_into(&op(0.0), 0.1, 1.0, [&a, &a, &a, &a], [&mut x, &mut y, &mut z], 1).unwrap_err();
        assert!(err.contains("lengths"), "{err}");
    }
}
