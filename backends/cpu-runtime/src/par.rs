//! The runtime's parallel loop: units of work claimed from one counter by the calling thread
//! and by whichever rayon pool threads are free, without ever waiting for a pool thread to wake.
//!
//! A scope-based split (`rayon::scope`, `in_place_scope`) returns only when every job it
//! spawned has run; when the pool threads are asleep that costs a wake-up (~10 µs on these
//! machines), more than a 64K-element kernel takes, so short kernels could not split at all.
//! Here the caller claims units itself and waits only for units a pool thread has already
//! claimed: an awake pool thread joins within a microsecond, a sleeping one arrives to find
//! every unit taken and returns without touching the work. (PyTorch's OpenMP threads spin
//! between ops for the same reason.)

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Run `f(state, unit)` for every unit in `0..n`, on the calling thread and up to
/// `tasks - 1` rayon pool threads; each participant makes its own `state` with `init`
/// (scratch memory) when it claims its first unit. A panic in any unit is resumed on the
/// calling thread once every claimed unit has finished.
pub(crate) fn par_units<S>(n: usize, tasks: usize, init: impl Fn() -> S + Sync, f: impl Fn(&mut S, usize) + Sync) {
    let tasks = tasks.min(n);
    if tasks <= 1 {
        let mut s = init();
        for u in 0..n {
            f(&mut s, u);
        }
        return;
    }
    // One participant: the unit it claimed, then every unit it can still claim.
    let participate = |shared: &Shared, first: usize| {
        let mut state = None;
        let mut unit = Some(first);
        while let Some(u) = unit {
            let result = catch_unwind(AssertUnwindSafe(|| f(state.get_or_insert_with(&init), u)));
            if let Err(payload) = result {
                shared
                    .panic
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(payload);
            }
            shared.done.fetch_add(1, Ordering::Release);
            unit = shared.claim();
        }
    };
    let work: &Work<'_> = &participate;
    // Safety: only the lifetime is erased. `work` is called only by a participant that has
    // claimed a unit, and this function returns only when every unit is done, so never
    // after `participate` and what it borrows are gone.
    let work: *const Work<'static> = unsafe { std::mem::transmute(work) };
    let shared = Arc::new(Shared {
        n,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
        work,
    });
    for _ in 1..tasks {
        let s = Arc::clone(&shared);
        rayon::spawn(move || {
            if let Some(first) = s.claim() {
                // Safety: a unit is claimed, so the caller is still waiting (see above).
                unsafe { (*s.work)(&s, first) }
            }
        });
    }
    if let Some(first) = shared.claim() {
        participate(&shared, first);
    }
    // Every unit is claimed; wait for those pool threads are still running.
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < n {
        if spins < 1 << 12 {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    if let Some(payload) = shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
        resume_unwind(payload);
    }
}

/// A participant's loop, given the shared counters and its first claimed unit.
type Work<'a> = dyn Fn(&Shared, usize) + Sync + 'a;

struct Shared {
    n: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    work: *const Work<'static>,
}

// Safety: `work` points at a `Sync` closure and is called only as `par_units` describes.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    fn claim(&self) -> Option<usize> {
        let u = self.next.fetch_add(1, Ordering::Relaxed);
        (u < self.n).then_some(u)
    }
}

#[cfg(test)]
mod tests {
    use super::par_units;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc;

    #[test]
    fn every_unit_runs_once() {
        for tasks in [1, 2, 4] {
            for n in [0, 1, 2, 3, 7, 100] {
                let runs: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                let inits = AtomicU32::new(0);
                par_units(
                    n,
                    tasks,
                    || inits.fetch_add(1, Ordering::Relaxed),
                    |_, u| {
                        runs[u].fetch_add(1, Ordering::Relaxed);
                    },
                );
                assert!(
                    runs.iter().all(|r| r.load(Ordering::Relaxed) == 1),
                    "tasks {tasks}, n {n}"
                );
                // One state per participant that ran a unit, never more than the tasks.
                assert!(inits.load(Ordering::Relaxed) as usize <= tasks.min(n).max(1));
            }
        }
    }

    /// With every pool thread busy, the caller runs all units itself instead of waiting for
    /// one (a scope-based split waits here until the pool frees up: a hang).
    #[test]
    fn never_waits_for_busy_pool_threads() {
        let workers = rayon::current_num_threads();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = std::sync::Arc::new(std::sync::Mutex::new(release_rx));
        let (started_tx, started_rx) = mpsc::channel::<()>();
        for _ in 0..workers {
            let (rx, started) = (release_rx.clone(), started_tx.clone());
            rayon::spawn(move || {
                started.send(()).unwrap();
                let _ = rx.lock().unwrap().recv();
            });
        }
        for _ in 0..workers {
            started_rx.recv().unwrap();
        }
        let caller = std::thread::current().id();
        let on_caller = AtomicU32::new(0);
        par_units(
            4,
            4,
            || (),
            |_, _| {
                if std::thread::current().id() == caller {
                    on_caller.fetch_add(1, Ordering::Relaxed);
                }
            },
        );
        for _ in 0..workers {
            release_tx.send(()).unwrap();
        }
        assert_eq!(on_caller.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_panicking_unit_reaches_the_caller_after_the_others_finish() {
        let runs = AtomicU32::new(0);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            par_units(
                16,
                2,
                || (),
                |_, u| {
                    runs.fetch_add(1, Ordering::Relaxed);
                    assert_ne!(u, 5, "unit five fails");
                },
            )
        }));
        assert!(caught.is_err());
        assert_eq!(runs.load(Ordering::Relaxed), 16);
    }
}
