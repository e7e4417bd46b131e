//! oar's parameter server (issue 22): shards of dense and sparse tables served over gRPC
//! (tonic; the protocol is `proto/ps.proto`, compiled by protox, no `protoc`), and the trainers'
//! client.
//!
//! - [`table`]: the tables — sparse embedding rows created on first access (an optional entry
//!   filter), server-side SGD / Adagrad / Adam, seeded initializers (a row starts the same on
//!   any shard), expiry, memory accounting.
//! - [`server`]: one shard — rows on the shard their id hashes to ([`shard_of_id`]), dense
//!   tables on the shard their name hashes to; snapshots written atomically every N pushes,
//!   on request and at shutdown, resumed at start; a snapshot directory of another layout
//!   refused; malformed, misrouted or oversized requests answered with a status.
//! - [`heter`]: heterogeneous trainers — a heter trainer serves a model's dense part to CPU
//!   trainers, which send activations and get their gradients back.
//! - [`client`]: pulls and pushes of a batch's unique ids, grouped per shard and sent
//!   concurrently, every call under a deadline, retried with backoff while a shard restarts.

pub mod client;
pub mod heter;
pub mod server;
pub mod table;

/// The generated protocol types and stubs.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("oar.ps");
}

pub use client::{PsClient, TrafficCount};
pub use heter::{HeterClient, HeterWorker, RunningHeter};
pub use proto::PushMode;
pub use server::{RunningServer, ServerConfig, Shard};
pub use table::{Init, Kind, Optimizer, Table, TableConfig};

/// What can go wrong, by where.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    /// A server or job set up inconsistently.
    #[error("parameter server configuration: {0}")]
    Config(String),
    /// A snapshot that cannot be written or read.
    #[error("parameter server snapshot: {0}")]
    Snapshot(String),
    /// Connecting, listening, or a call that failed at the transport.
    #[error("parameter server transport: {0}")]
    Transport(String),
    /// A heter trainer refused a step, or did not answer within the deadline.
    #[error("heter trainer: {0}")]
    Heter(String),
    /// A call the server refused or that ran past its deadline.
    #[error("parameter server shard {shard}: {status}")]
    Call {
        /// The shard called.
        shard: u32,
        /// What it said (code and message).
        status: String,
    },
}

/// The shard (of `num_shards`) a sparse row lives on: SplitMix64's mix of the id, modulo.
pub fn shard_of_id(id: u64, num_shards: u32) -> u32 {
    (oar_ir::ops::random_stream::mix64(id) % u64::from(num_shards.max(1))) as u32
}

/// The shard a dense table lives on: a hash of its name, modulo.
pub fn shard_of_table(name: &str, num_shards: u32) -> u32 {
    (table::name_hash(name) % u64::from(num_shards.max(1))) as u32
}

/// How trainers and servers keep in step (`oar::ps` documents each).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Gradients summed on the servers and applied once per step, behind a barrier.
    Sync,
    /// Gradients applied as they arrive, sent in the background.
    Async,
    /// Local SGD with learning rate `lr`; every `k` steps the local change is pushed and the
    /// servers' values pulled.
    Geo {
        /// Steps between exchanges.
        k: u64,
        /// The local SGD learning rate.
        lr: f32,
    },
}

impl Mode {
    /// GEO needs `k ≥ 1` and a positive learning rate.
    pub fn check(self) -> Result<Mode, PsError> {
        match self {
            Mode::Geo { k, lr } if k == 0 || !lr.is_finite() || lr <= 0.0 => Err(PsError::Config(format!(
                "GEO needs k >= 1 and a positive learning rate, got k = {k}, lr = {lr}"
            ))),
            m => Ok(m),
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = PsError;

    /// `sync`, `async` or `geo:K:LR`.
    fn from_str(s: &str) -> Result<Mode, PsError> {
        let geo = || -> Option<Mode> {
            let mut it = s.strip_prefix("geo:")?.split(':');
            let k = it.next()?.parse().ok()?;
            let lr = it.next()?.parse().ok()?;
            it.next().is_none().then_some(Mode::Geo { k, lr })
        };
        match s {
            "sync" => Ok(Mode::Sync),
            "async" => Ok(Mode::Async),
            _ => geo()
                .ok_or_else(|| PsError::Config(format!("mode `{s}`: want sync, async or geo:K:LR")))?
                .check(),
        }
    }
}
