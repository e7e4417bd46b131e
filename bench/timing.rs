//! Timing shared by the bench examples (included with `#[path]`).

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
