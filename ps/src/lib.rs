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
//! - [`client`]: pulls and pushes of a batch's unique ids, grouped per shard and sent
//!   concurrently, every call under a deadline, retried with backoff while a shard restarts.

pub mod client;
pub mod server;
pub mod table;

/// The generated protocol types and stubs.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("oar.ps");
}

pub use client::PsClient;
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
