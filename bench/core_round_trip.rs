//! How long two threads take to pass one cache line back and forth: the machine's cross-core
//! latency. On a VM it tells whether the vCPUs share a die right now. On the Zen 3 machine of
//! 2026-12-07 it read 100–190 ns in some minutes and 440–590 ns in others, and two-thread model
//! runs were 40% slower in the latter (docs/PERFORMANCE.md); run it before and after a
//! two-thread benchmark to know which kind of minutes the benchmark saw.
//!
//! `cargo run --release --example bench_core_round_trip [ROUND_TRIPS]` prints
//! `round trip N ns` (the median of 5 runs of 200,000 by default).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

fn main() {
    let trips: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let mut ns: Vec<f64> = (0..5).map(|_| round_trip_ns(trips)).collect();
    ns.sort_by(f64::total_cmp);
    println!("round trip {:.0} ns", ns[ns.len() / 2]);
}

/// Mean time of one round trip: this thread writes an odd value, the other answers with the
/// next even one.
fn round_trip_ns(trips: u64) -> f64 {
    let flag = Arc::new(AtomicU64::new(0));
    let other = Arc::clone(&flag);
    let pong = std::thread::spawn(move || {
        for i in 0..trips {
            while other.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            other.store(2 * i + 2, Ordering::Release);
        }
    });
    let start = Instant::now();
    for i in 0..trips {
        flag.store(2 * i + 1, Ordering::Release);
        while flag.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let elapsed = start.elapsed();
    pong.join().expect("the answering thread");
    elapsed.as_nanos() as f64 / trips.max(1) as f64
}
