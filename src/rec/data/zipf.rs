//! Zipf sampling by rejection-inversion (Hörmann & Derflinger, "Rejection-inversion to generate
//! variates from monotone discrete distributions", 1996), as in Apache Commons RNG: O(1) expected
//! time per sample and O(1) memory whatever the vocabulary size, so a field of 400 000 ids needs
//! no table.

use crate::error::{Error, Result};

/// The Zipf law over ranks `1..=n`: `P(k) = k^-s / Σ_{j≤n} j^-s`.
#[derive(Clone, Debug, PartialEq)]
pub struct Zipf {
    n: u64,
    s: f64,
    /// `H(1.5) - h(1)`: the upper end of the inverted range.
    h_integral_x1: f64,
    /// `H(n + 0.5)`: the lower end.
    h_integral_n: f64,
    /// Acceptance shortcut: `k - x <= squeeze` accepts without evaluating `H` again.
    squeeze: f64,
}

impl Zipf {
    /// The law over `n ≥ 1` ranks with exponent `s > 0` (finite).
    pub fn new(n: u64, s: f64) -> Result<Zipf> {
        if n == 0 || !(s > 0.0 && s.is_finite()) {
            return Err(Error::invalid(
                "Zipf",
                format!("want n >= 1 ranks and a finite exponent s > 0, got n = {n}, s = {s}"),
            ));
        }
        let h_integral_x1 = h_integral(1.5, s) - 1.0;
        let h_integral_n = h_integral(n as f64 + 0.5, s);
        let squeeze = 2.0 - h_integral_inverse(h_integral(2.5, s) - h(2.0, s), s);
        Ok(Zipf {
            n,
            s,
            h_integral_x1,
            h_integral_n,
            squeeze,
        })
    }

    /// Number of ranks `n`.
    pub fn n(&self) -> u64 {
        self.n
    }

    /// One rank in `1..=n`, drawing uniforms in `[0, 1)` from `uniform` (on average a little
    /// more than one).
    pub fn sample(&self, mut uniform: impl FnMut() -> f64) -> u64 {
        loop {
            let u = self.h_integral_n + uniform() * (self.h_integral_x1 - self.h_integral_n);
            let x = h_integral_inverse(u, self.s);
            let k = ((x + 0.5) as u64).clamp(1, self.n);
            let kf = k as f64;
            if kf - x <= self.squeeze || u >= h_integral(kf + 0.5, self.s) - h(kf, self.s) {
                return k;
            }
        }
    }

    /// The exact probability of rank `k` (sums the normalizer: O(n), for tests and reports).
    pub fn pmf(&self, k: u64) -> f64 {
        if k == 0 || k > self.n {
            return 0.0;
        }
        let norm: f64 = (1..=self.n).map(|j| h(j as f64, self.s)).sum();
        h(k as f64, self.s) / norm
    }
}

/// `h(x) = x^-s`.
fn h(x: f64, s: f64) -> f64 {
    (-s * x.ln()).exp()
}

/// `H(x) = ∫_1^x t^-s dt = (x^(1-s) - 1) / (1 - s)`, stable near `s = 1`.
fn h_integral(x: f64, s: f64) -> f64 {
    let log_x = x.ln();
    expm1_over_x((1.0 - s) * log_x) * log_x
}

/// The inverse of [`h_integral`].
fn h_integral_inverse(x: f64, s: f64) -> f64 {
    let t = (x * (1.0 - s)).max(-1.0);
    (log1p_over_x(t) * x).exp()
}

/// `ln(1 + x) / x`, with its Taylor series near 0.
fn log1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, with its Taylor series near 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rec::data::Draws;

    /// Pearson's chi-square of `draws` samples against the exact law.
    fn chi_square(zipf: &Zipf, draws: usize, seed: u64) -> f64 {
        let mut rng = Draws::new(seed);
        let mut counts = vec![0u64; zipf.n() as usize + 1];
        for _ in 0..draws {
            let k = zipf.sample(|| rng.uniform());
            counts[k as usize] += 1;
        }
        assert_eq!(counts[0], 0, "rank 0 drawn");
        (1..=zipf.n())
            .map(|k| {
                let expected = zipf.pmf(k) * draws as f64;
                (counts[k as usize] as f64 - expected).powi(2) / expected
            })
            .sum()
    }

    #[test]
    fn frequencies_follow_the_law() {
        // Chi-square with n - 1 degrees of freedom; the bounds are the 99.99% quantiles
        // (df 9: 33.7, df 29: 66.6), so a correct sampler fails with probability 1e-4 per seed
        // and these fixed seeds pass; a sampler off by 1% on rank 1 gives ~100 at 200k draws.
        for (n, s, bound) in [(10, 1.1, 33.7), (10, 1.0, 33.7), (30, 0.7, 66.6), (30, 2.0, 66.6)] {
            let chi2 = chi_square(&Zipf::new(n, s).unwrap(), 200_000, 7);
            assert!(chi2 < bound, "n {n} s {s}: chi-square {chi2} >= {bound}");
        }
    }

    #[test]
    fn large_vocabularies_stay_in_range_and_keep_the_head() {
        let zipf = Zipf::new(400_000, 1.1).unwrap();
        let mut rng = Draws::new(3);
        let draws = 100_000;
        let mut ones = 0;
        for _ in 0..draws {
            let k = zipf.sample(|| rng.uniform());
            assert!((1..=400_000).contains(&k));
            ones += (k == 1) as usize;
        }
        // P(1) ≈ 0.105; the binomial standard deviation at 100k draws is ~0.001.
        let p1 = zipf.pmf(1);
        let got = ones as f64 / draws as f64;
        assert!((got - p1).abs() < 0.005, "P(1): drawn {got}, law {p1}");
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(Zipf::new(0, 1.1).is_err());
        assert!(Zipf::new(10, 0.0).is_err());
        assert!(Zipf::new(10, f64::NAN).is_err());
        assert_eq!(Zipf::new(1, 1.1).unwrap().sample(|| 0.5), 1);
    }
}
