//! The runtime's parallel loop: units of work claimed from one shared range by the calling
//! thread and by whichever rayon pool threads are free, without ever waiting for a pool thread
//! to wake.
//!
//! A scope-based split (`rayon::scope`, `in_place_scope`) returns only when every job it
//! spawned has run; when the pool threads are asleep that costs a wake-up (~10 µs on these
//! machines), more than a 64K-element kernel takes, so short kernels could not split at all.
//! Here the caller claims units itself and waits only for units a pool thread has already
//! claimed: an awake pool thread joins within a microsecond, a sleeping one arrives to find
//! every unit taken and returns without touching the work.
//!
//! A pool thread is asleep more often than not between two eager ops, so after a parallel
//! loop ends up to `tasks - 1` pool threads *linger*: each spins on a mailbox for a short
//! while (`OAR_THREAD_SPIN_US`, default 300 µs; 0 turns it off) and the next loop hands its
//! work straight to it, as PyTorch's OpenMP threads spin between ops. A lingering thread
//! keeps running the pool's other jobs (`rayon::yield_now`), so it never starves them.

use std::any::Any;
use std::cell::Cell;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Run `f(state, unit)` for every unit in `0..n`, on the calling thread and up to
/// `tasks - 1` rayon pool threads; each participant makes its own `state` with `init`
/// (scratch memory) when it claims its first unit. A panic in any unit is resumed on the
/// calling thread once every claimed unit has finished.
///
/// Units are claimed in runs, each a participant's share of what is left (guided scheduling):
/// the caller's from the front, the pool threads' from the back, so two participants that
/// keep pace split the units in two halves with two claims each. A claim is an atomic
/// operation on a line every participant writes, a cache miss for all but the last writer:
/// claimed one unit at a time, a deep layer's forty-odd units of a microsecond each spent
/// about as long passing that line between the cores as computing (measured on a VM whose
/// two vCPUs at times sat on different dies, a 500 ns round trip; MobileNetV2 on two threads
/// then took 6.15 instead of 6.75 ms).
pub(crate) fn par_units<S>(n: usize, tasks: usize, init: impl Fn() -> S + Sync, f: impl Fn(&mut S, usize) + Sync) {
    let tasks = tasks.min(n);
    if tasks <= 1 {
        let mut s = init();
        for u in 0..n {
            f(&mut s, u);
        }
        return;
    }
    // The claims pack two unit indices in one word.
    for base in (0..n).step_by(MAX_UNITS) {
        par_block(base, (n - base).min(MAX_UNITS), tasks, &init, &f);
    }
}

/// [`par_units`] on the units `base..base + n`, `2 ≤ tasks ≤ n ≤ MAX_UNITS`.
fn par_block<S>(
    base: usize,
    n: usize,
    tasks: usize,
    init: &(impl Fn() -> S + Sync),
    f: &(impl Fn(&mut S, usize) + Sync),
) {
    let tasks = tasks.min(n);
    // One participant: the units it claimed, then every run it can still claim at its end.
    let participate = |shared: &Shared, first: Range<usize>, end: End| {
        let mut state = None;
        let mut run = Some(first);
        while let Some(units) = run {
            let len = units.len();
            for u in units {
                let result = catch_unwind(AssertUnwindSafe(|| f(state.get_or_insert_with(init), base + u)));
                if let Err(payload) = result {
                    shared
                        .panic
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(payload);
                }
            }
            shared.done.0.fetch_add(len, Ordering::Release);
            run = shared.claim(end);
        }
    };
    let work: &Work<'_> = &participate;
    // Safety: only the lifetime is erased. `work` is called only by a participant that has
    // claimed a unit, and this function returns only when every unit is done, so never
    // after `participate` and what it borrows are gone.
    let work: *const Work<'static> = unsafe { std::mem::transmute(work) };
    let shared = Arc::new(Shared {
        tasks,
        left: Padded(AtomicU64::new(pack(0, n))),
        done: Padded(AtomicUsize::new(0)),
        panic: Mutex::new(None),
        work,
    });
    let mut helpers = tasks - 1;
    for spinner in spinners() {
        if helpers == 0 {
            break;
        }
        if spinner.hand(&shared) {
            helpers -= 1;
        }
    }
    for _ in 0..helpers {
        let s = Arc::clone(&shared);
        rayon::spawn(move || {
            if let Some(first) = s.claim(End::Back) {
                // Safety: a unit is claimed, so the caller is still waiting (see above).
                unsafe { (*s.work)(&s, first, End::Back) }
            }
        });
    }
    if let Some(first) = shared.claim(End::Front) {
        participate(&shared, first, End::Front);
    }
    // Every unit is claimed; wait for those pool threads are still running.
    wait_until(|| shared.done.0.load(Ordering::Acquire) >= n);
    if let Some(payload) = shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
        resume_unwind(payload);
    }
    linger(tasks - 1);
}

/// Units one loop's claims can count (two indices share a 64-bit word).
const MAX_UNITS: usize = u32::MAX as usize;

/// Spin until `done()`, then yield between checks: work another thread has already claimed
/// finishes within microseconds unless that thread was descheduled.
pub(crate) fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < 1 << 12 {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Keep up to `helpers` pool threads spinning for the next parallel loop.
fn linger(helpers: usize) {
    if spin_time().is_zero() {
        return;
    }
    for spinner in spinners().iter().take(helpers) {
        if spinner
            .state
            .compare_exchange(IDLE, WAITING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            rayon::spawn(move || spinner.run());
        }
    }
}

fn spin_time() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("OAR_THREAD_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(300);
        Duration::from_micros(us.min(1_000_000))
    })
}

/// One mailbox per pool thread but one (the caller of a loop is the other participant).
fn spinners() -> &'static [Spinner] {
    static SPINNERS: OnceLock<Box<[Spinner]>> = OnceLock::new();
    SPINNERS.get_or_init(|| {
        (1..rayon::current_num_threads().max(1))
            .map(|_| Spinner {
                state: AtomicU8::new(IDLE),
                mailbox: Mutex::new(None),
            })
            .collect()
    })
}

/// No thread is lingering on this mailbox.
const IDLE: u8 = 0;
/// A pool thread is (or is about to be) spinning on it, and the mailbox is empty.
const WAITING: u8 = 1;
/// A loop's work is in the mailbox, or the lingering thread is running it.
const HANDED: u8 = 2;

struct Spinner {
    state: AtomicU8,
    mailbox: Mutex<Option<Arc<Shared>>>,
}

thread_local! {
    static LINGERING: Cell<bool> = const { Cell::new(false) };
}

impl Spinner {
    /// Give `shared` to the thread lingering here, if there is one and it is free.
    fn hand(&self, shared: &Arc<Shared>) -> bool {
        if self.state.load(Ordering::Relaxed) != WAITING {
            return false;
        }
        let mut mailbox = self.mailbox.lock().unwrap_or_else(|e| e.into_inner());
        // The lock is held until the work is in the mailbox, so the spinner, which takes the
        // lock after it sees HANDED, always finds it there.
        if self
            .state
            .compare_exchange(WAITING, HANDED, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        *mailbox = Some(Arc::clone(shared));
        true
    }

    /// Runs on a pool thread: take loops from the mailbox until none has come for the spin
    /// time, running the pool's other jobs in between.
    fn run(&self) {
        // A lingering thread that picks up another mailbox's spinner through `yield_now`
        // would leave its own unserved: the nested one hands back at once.
        let nested = LINGERING.with(|l| l.replace(true));
        let mut deadline = Instant::now() + spin_time();
        let mut polls = 0u32;
        loop {
            if self.state.load(Ordering::Acquire) == HANDED {
                let job = self.mailbox.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(job) = job
                    && let Some(first) = job.claim(End::Back)
                {
                    // Safety: a unit is claimed, so the loop's caller is still waiting.
                    unsafe { (*job.work)(&job, first, End::Back) }
                }
                self.state.store(WAITING, Ordering::Release);
                deadline = Instant::now() + spin_time();
                continue;
            }
            polls = polls.wrapping_add(1);
            if nested || polls.is_multiple_of(64) {
                if (nested || Instant::now() >= deadline)
                    && self
                        .state
                        .compare_exchange(WAITING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    break;
                }
                if !nested {
                    rayon::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        LINGERING.with(|l| l.set(nested));
    }
}

/// A participant's loop, given the shared counters, its first claimed run of units and the
/// end it claims from.
type Work<'a> = dyn Fn(&Shared, Range<usize>, End) + Sync + 'a;

/// The end of the unclaimed units a participant takes its runs from.
#[derive(Clone, Copy)]
enum End {
    Front,
    Back,
}

/// A value on cache lines of its own (two: the adjacent-line prefetcher pulls pairs).
#[repr(align(128))]
struct Padded<T>(T);

struct Shared {
    tasks: usize,
    /// The unclaimed units `front..back`, as `pack(front, back)`.
    left: Padded<AtomicU64>,
    /// Units finished; apart from `left`, which the participants write at other times.
    done: Padded<AtomicUsize>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    work: *const Work<'static>,
}

// Safety: `work` points at a `Sync` closure and is called only as `par_units` describes.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

fn pack(front: usize, back: usize) -> u64 {
    (back as u64) << 32 | front as u64
}

impl Shared {
    /// A run of unclaimed units from `end`: a `1 / tasks` share of those left, at least one.
    fn claim(&self, end: End) -> Option<Range<usize>> {
        let mut cur = self.left.0.load(Ordering::Relaxed);
        loop {
            let (front, back) = ((cur & u64::from(u32::MAX)) as usize, (cur >> 32) as usize);
            if front >= back {
                return None;
            }
            let k = (back - front).div_ceil(self.tasks);
            let (units, rest) = match end {
                End::Front => (front..front + k, pack(front + k, back)),
                End::Back => (back - k..back, pack(front, back - k)),
            };
            match self
                .left
                .0
                .compare_exchange_weak(cur, rest, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(units),
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{End, Padded, Shared, Work, pack, par_units};
    use std::ops::Range;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::atomic::{AtomicU64, AtomicUsize};
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

    /// Back-to-back loops share their units with a pool thread: the second loop's unit 0
    /// (on the caller) waits — bounded — for unit 1 to run elsewhere, which happens whether
    /// the pool thread was lingering (the mailbox) or asleep (a spawned job).
    #[test]
    fn back_to_back_loops_hand_units_to_a_pool_thread() {
        if rayon::current_num_threads() < 2 {
            return;
        }
        for _ in 0..50 {
            par_units(2, 2, || (), |_, _| {});
            let caller = std::thread::current().id();
            let elsewhere = std::sync::atomic::AtomicBool::new(false);
            let other_done = std::sync::atomic::AtomicBool::new(false);
            par_units(
                2,
                2,
                || (),
                |_, u| {
                    if std::thread::current().id() != caller {
                        elsewhere.store(true, Ordering::Release);
                        other_done.store(true, Ordering::Release);
                        return;
                    }
                    if u == 0 {
                        let start = std::time::Instant::now();
                        while !other_done.load(Ordering::Acquire) && start.elapsed() < std::time::Duration::from_secs(5)
                        {
                            std::hint::spin_loop();
                        }
                    }
                },
            );
            assert!(elsewhere.load(Ordering::Acquire), "no pool thread ran a unit");
        }
    }

    /// Claims from both ends cover every unit once: the front's runs in order from 0, the
    /// back's from `n` down, each a `1 / tasks` share of what was left.
    #[test]
    fn claims_split_the_units_from_both_ends() {
        let work = |_: &Shared, _: Range<usize>, _: End| {};
        let work: &Work<'_> = &work;
        for (n, tasks) in [(1, 2), (2, 2), (7, 2), (48, 2), (100, 3), (5, 4)] {
            let shared = Shared {
                tasks,
                left: Padded(AtomicU64::new(pack(0, n))),
                done: Padded(AtomicUsize::new(0)),
                panic: Mutex::new(None),
                // Safety: never called; only the lifetime is erased.
                work: unsafe { std::mem::transmute::<&Work<'_>, *const Work<'static>>(work) },
            };
            let (mut front, mut back, mut left) = (0, n, n);
            let mut seen = vec![0; n];
            for i in 0.. {
                let end = if i % 3 == 0 { End::Back } else { End::Front };
                let Some(units) = shared.claim(end) else { break };
                assert_eq!(units.len(), left.div_ceil(tasks), "n {n}, tasks {tasks}: run {units:?}");
                match end {
                    End::Front => {
                        assert_eq!(units.start, front);
                        front = units.end;
                    }
                    End::Back => {
                        assert_eq!(units.end, back);
                        back = units.start;
                    }
                }
                left -= units.len();
                units.for_each(|u| seen[u] += 1);
            }
            assert!(seen.iter().all(|&c| c == 1), "n {n}, tasks {tasks}: {seen:?}");
        }
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
