//! Timing shared by the bench examples (included with `#[path]`; each uses what it needs).
#![allow(dead_code)]

use std::time::Instant;

/// Median wall time of `runs` calls of `f`, after one warm-up call, in seconds.
pub fn median_secs(runs: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm up
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Median wall time of `runs` calls of a fallible `f`, after `warm` warm-up calls, in
/// milliseconds; the first error stops the measurement.
pub fn median_ms<E>(warm: usize, runs: usize, mut f: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    for _ in 0..warm {
        f()?;
    }
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[runs / 2])
}

/// Median wall times in milliseconds of several fallible workloads measured in alternation:
/// `warm` warm-up calls of each, then `runs` rounds that call each once, so that every median
/// comes from the same minutes as the others (a shared machine's speed drifts between them).
pub fn interleaved_medians_ms<E>(
    warm: usize,
    runs: usize,
    fs: &mut [&mut dyn FnMut() -> Result<(), E>],
) -> Result<Vec<f64>, E> {
    for f in fs.iter_mut() {
        for _ in 0..warm {
            f()?;
        }
    }
    let mut t = vec![Vec::with_capacity(runs); fs.len()];
    for _ in 0..runs {
        for (f, t) in fs.iter_mut().zip(&mut t) {
            let s = Instant::now();
            f()?;
            t.push(s.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(t.into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[runs / 2]
        })
        .collect())
}
