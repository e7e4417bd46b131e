//! The MPI transport: one communicator per group, every call serialized by a lock (MPI is
//! initialized with `MPI_THREAD_SERIALIZED`, so any thread may call, one at a time). MPI is
//! finalized when the process exits normally (an `atexit` handler), so `mpirun` sees a clean
//! end however long the groups live.
//!
//! Every call runs under a deadline ([`super::set_timeout`], default 30 s): a watchdog thread
//! that finds a call past it prints which collective on which rank waited how long and ends
//! the process at once (`_exit`, as MPI cannot cancel a blocking call), and `mpirun` then ends
//! the job, so a dead or hung rank never hangs the others silently.

use super::{Buffer, Comm};
use crate::error::{Error, Result};
use mpi::collective::SystemOperation;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The call in progress (serialized by the lock): what it is and when it started.
static IN_FLIGHT: Mutex<Option<(&'static str, Instant)>> = Mutex::new(None);

/// Start the watchdog thread once.
fn watchdog() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let rank = std::env::var("OMPI_COMM_WORLD_RANK")
            .or_else(|_| std::env::var("PMI_RANK"))
            .unwrap_or_else(|_| "?".into());
        // A thread that cannot start leaves calls without a deadline; nothing else changes.
        let _ = std::thread::Builder::new()
            .name("oar-mpi-watchdog".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_millis(100));
                    let timeout = super::timeout();
                    let late = IN_FLIGHT
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .filter(|(_, since)| since.elapsed() > timeout);
                    if let Some((what, since)) = late {
                        eprintln!(
                            "error: oar::distributed: {what} on rank {rank} waited {:.1} s, past the {:.1} s timeout: \
                         another rank died or hung (set it with oar::distributed::set_timeout or OAR_DIST_TIMEOUT)",
                            since.elapsed().as_secs_f64(),
                            timeout.as_secs_f64()
                        );
                        // SAFETY: _exit ends the process without running atexit handlers (MPI_Finalize
                        // would wait for the blocked call); mpirun then ends the other ranks.
                        unsafe { libc::_exit(3) };
                    }
                }
            });
    });
}

/// One MPI communicator.
struct Mpi {
    comm: SimpleCommunicator,
    lock: Arc<Mutex<()>>,
}

// SAFETY: the communicator is a handle that MPI lets any thread use when calls are serialized
// (MPI_THREAD_SERIALIZED), which `lock` guarantees: every method takes it first.
unsafe impl Send for Mpi {}
// SAFETY: as above; `&Mpi` only reaches MPI through the lock.
unsafe impl Sync for Mpi {}

extern "C" fn finalize() {
    // SAFETY: registered once after a successful MPI_Init_thread; MPI_Finalize is the last MPI call.
    unsafe {
        mpi::ffi::MPI_Finalize();
    }
}

/// Initialize MPI and return the world communicator.
pub(super) fn world() -> Result<Arc<dyn Comm>> {
    let (universe, level) = mpi::initialize_with_threading(mpi::Threading::Serialized)
        .ok_or_else(|| Error::invalid("distributed::init", "MPI was already initialized"))?;
    if level < mpi::Threading::Serialized {
        return Err(Error::invalid(
            "distributed::init",
            format!("the MPI library offers thread level {level:?}; oar needs Serialized"),
        ));
    }
    let comm = universe.world().duplicate();
    // MPI_Finalize at exit instead of when `universe` drops: groups may live in statics.
    std::mem::forget(universe);
    // SAFETY: `finalize` is a plain extern "C" function with no captured state.
    if unsafe { libc::atexit(finalize) } != 0 {
        return Err(Error::invalid(
            "distributed::init",
            "cannot register MPI_Finalize at exit",
        ));
    }
    watchdog();
    Ok(Arc::new(Mpi {
        comm,
        lock: Arc::new(Mutex::new(())),
    }))
}

fn op(max: bool) -> SystemOperation {
    if max {
        SystemOperation::max()
    } else {
        SystemOperation::sum()
    }
}

/// Run `$body` with `$v` (and `$w`) bound to the same-typed vectors of two buffers; a dtype
/// mismatch is an error.
macro_rules! typed2 {
    ($a:expr, $b:expr, |$v:ident, $w:ident| $body:expr) => {
        match ($a, $b) {
            (Buffer::F32($v), Buffer::F32($w)) => $body,
            (Buffer::F64($v), Buffer::F64($w)) => $body,
            (Buffer::I32($v), Buffer::I32($w)) => $body,
            (Buffer::I64($v), Buffer::I64($w)) => $body,
            _ => return Err(Error::invalid("collective", "send and receive buffers differ in dtype")),
        }
    };
}

macro_rules! typed {
    ($a:expr, |$v:ident| $body:expr) => {
        match $a {
            Buffer::F32($v) => $body,
            Buffer::F64($v) => $body,
            Buffer::I32($v) => $body,
            Buffer::I64($v) => $body,
        }
    };
}

impl Mpi {
    /// Run `f` on the communicator under the lock, with `what`'s deadline armed.
    fn call<T>(&self, what: &'static str, f: impl FnOnce(&SimpleCommunicator) -> T) -> T {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        *IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner()) = Some((what, Instant::now()));
        let out = f(&self.comm);
        *IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner()) = None;
        out
    }
}

impl Comm for Mpi {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn all_reduce(&self, buf: &mut Buffer, max: bool) -> Result<()> {
        // A fresh (lazily zeroed) receive buffer rather than a copy of the send buffer.
        let mut recv = Buffer::zeros(buf.dtype(), buf.len(), "all_reduce")?;
        self.call("all_reduce", |c| -> Result<()> {
            typed2!(&*buf, &mut recv, |s, r| c.all_reduce_into(&s[..], &mut r[..], op(max)));
            Ok(())
        })?;
        *buf = recv;
        Ok(())
    }

    fn sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        self.call("all_reduce", |c| c.all_reduce_into(send, recv, SystemOperation::sum()));
        Ok(())
    }

    fn broadcast(&self, buf: &mut Buffer, root: usize) -> Result<()> {
        self.call("broadcast", |c| {
            let root = c.process_at_rank(root as i32);
            typed!(buf, |v| root.broadcast_into(&mut v[..]));
        });
        Ok(())
    }

    fn all_gather(&self, send: &Buffer, recv: &mut Buffer) -> Result<()> {
        self.call("all_gather", |c| -> Result<()> {
            typed2!(send, recv, |s, r| c.all_gather_into(&s[..], &mut r[..]));
            Ok(())
        })
    }

    fn reduce_scatter(&self, send: &Buffer, recv: &mut Buffer, max: bool) -> Result<()> {
        self.call("reduce_scatter", |c| -> Result<()> {
            typed2!(send, recv, |s, r| c.reduce_scatter_block_into(
                &s[..],
                &mut r[..],
                op(max)
            ));
            Ok(())
        })
    }

    fn send(&self, buf: &Buffer, dst: usize) -> Result<()> {
        self.call("send", |c| {
            let p = c.process_at_rank(dst as i32);
            typed!(buf, |v| p.send(&v[..]));
        });
        Ok(())
    }

    fn recv(&self, buf: &mut Buffer, src: usize) -> Result<()> {
        self.call("recv", |c| {
            let p = c.process_at_rank(src as i32);
            typed!(buf, |v| {
                p.receive_into(&mut v[..]);
            });
        });
        Ok(())
    }

    fn send_recv(&self, send: &Buffer, dst: usize, recv: &mut Buffer, src: usize) -> Result<()> {
        self.call("send_recv", |c| -> Result<()> {
            let (to, from) = (c.process_at_rank(dst as i32), c.process_at_rank(src as i32));
            typed2!(send, recv, |s, r| {
                mpi::point_to_point::send_receive_into(&s[..], &to, &mut r[..], &from);
            });
            Ok(())
        })
    }

    fn barrier(&self) -> Result<()> {
        self.call("barrier", |c| c.barrier());
        Ok(())
    }

    fn split(&self, ranks: &[usize]) -> Result<Option<Arc<dyn Comm>>> {
        let me = self.rank();
        let color = if ranks.contains(&me) {
            Color::with_value(0)
        } else {
            Color::undefined()
        };
        let sub = self.call("new_group", |c| c.split_by_color(color));
        Ok(sub.map(|comm| {
            Arc::new(Mpi {
                comm,
                lock: self.lock.clone(),
            }) as Arc<dyn Comm>
        }))
    }
}
