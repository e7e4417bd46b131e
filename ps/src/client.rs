//! The trainers' side: one connection per shard, blocking calls (the eager framework is
//! synchronous) made on a private runtime.

use crate::proto::parameter_server_client::ParameterServerClient;
use crate::proto::*;
use crate::server::MAX_MESSAGE_BYTES;
use crate::{PsError, shard_of_id, shard_of_table};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// A client of every shard of a job.
pub struct PsClient {
    rt: tokio::runtime::Runtime,
    shards: Vec<ParameterServerClient<Channel>>,
    deadline: Duration,
    traffic: Traffic,
    /// The trainer this client pushes for (sync sums are taken in trainer order).
    trainer: std::sync::atomic::AtomicU32,
}

/// What a client has sent and received: calls, and payload bytes (8 per id, 4 per value; gRPC
/// framing and table names not counted).
#[derive(Default, Debug)]
struct Traffic {
    calls: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
}

/// A [`Traffic`] reading.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficCount {
    /// Calls made (one per shard called).
    pub calls: u64,
    /// Payload bytes sent.
    pub sent: u64,
    /// Payload bytes received.
    pub received: u64,
}

impl Traffic {
    fn add(&self, calls: usize, sent: usize, received: usize) {
        self.calls.fetch_add(calls as u64, Ordering::Relaxed);
        self.sent.fetch_add(sent as u64, Ordering::Relaxed);
        self.received.fetch_add(received as u64, Ordering::Relaxed);
    }
}

/// Whether a failed call is worth retrying (the shard is restarting, or busy). A shard killed
/// while the client's pooled connection to it is open fails the next call on that connection
/// as `Cancelled` (seen in CI: a pull right after a restart), not `Unavailable`.
fn transient(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}

impl PsClient {
    /// Connect to the shards at `endpoints` (`http://host:port`, shard `i` at index `i`) and
    /// check each is the shard of the job it should be. Every later call must finish within
    /// `deadline`, retries included.
    pub fn connect(endpoints: &[String], deadline: Duration) -> Result<PsClient, PsError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| PsError::Transport(e.to_string()))?;
        let mut shards = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let ep = Endpoint::from_shared(e.clone())
                .map_err(|err| PsError::Config(format!("bad endpoint `{e}`: {err}")))?
                .connect_timeout(deadline)
                .timeout(deadline);
            // Lazy: a shard that is not up yet is retried by the calls.
            let channel = {
                let _g = rt.enter();
                ep.connect_lazy()
            };
            shards.push(
                ParameterServerClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            );
        }
        if shards.is_empty() {
            return Err(PsError::Config("no shards to connect to".into()));
        }
        let client = PsClient {
            rt,
            shards,
            deadline,
            traffic: Traffic::default(),
            trainer: Default::default(),
        };
        client.info()?;
        Ok(client)
    }

    /// The number of shards.
    pub fn num_shards(&self) -> u32 {
        self.shards.len() as u32
    }

    /// Push as trainer `trainer` (0 until set): in sync mode the servers sum a step's
    /// gradients in trainer order, so a step's update is the same whatever order the pushes
    /// arrive in.
    pub fn set_trainer(&self, trainer: u32) {
        self.trainer.store(trainer, Ordering::Relaxed);
    }

    /// Calls and payload bytes so far.
    pub fn traffic(&self) -> TrafficCount {
        let t = &self.traffic;
        TrafficCount {
            calls: t.calls.load(Ordering::Relaxed),
            sent: t.sent.load(Ordering::Relaxed),
            received: t.received.load(Ordering::Relaxed),
        }
    }

    /// Call `f` on shard `s` until it succeeds, fails for good, or the deadline passes
    /// (retrying transient failures with doubling backoff).
    async fn call<T, F, Fut>(c: ParameterServerClient<Channel>, s: u32, deadline: Duration, f: F) -> Result<T, PsError>
    where
        F: Fn(ParameterServerClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let start = Instant::now();
        let mut wait = Duration::from_millis(20);
        loop {
            let left = deadline.saturating_sub(start.elapsed());
            let attempt = tokio::time::timeout(left, f(c.clone())).await;
            let status = match attempt {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(st)) => st,
                Err(_) => tonic::Status::deadline_exceeded(format!("no answer within {deadline:?}")),
            };
            if !transient(&status) || start.elapsed() + wait >= deadline {
                return Err(PsError::Call {
                    shard: s,
                    status: format!("{:?}: {}", status.code(), status.message()),
                });
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }

    /// Every shard's view of itself and its tables (also checks the job's layout).
    pub fn info(&self) -> Result<Vec<InfoReply>, PsError> {
        let n = self.num_shards();
        let calls = self.shards.iter().enumerate().map(|(s, c)| {
            Self::call(c.clone(), s as u32, self.deadline, move |mut c| async move {
                c.info(InfoRequest {
                    shard: s as u32,
                    num_shards: n,
                })
                .await
            })
        });
        self.rt.block_on(async { futures_join(calls).await })
    }

    /// The rows of `ids` in sparse table `table` (duplicates fetched once), `dim` values per id
    /// in order; with `training`, absent rows are created.
    pub fn pull_sparse(&self, table: &str, ids: &[u64], training: bool) -> Result<(usize, Vec<f32>), PsError> {
        let n = self.num_shards();
        // Unique ids per shard, and where each id's row lands.
        let mut per_shard: Vec<Vec<u64>> = vec![Vec::new(); n as usize];
        let mut at: HashMap<u64, (u32, usize)> = HashMap::new();
        for &id in ids {
            at.entry(id).or_insert_with(|| {
                let s = shard_of_id(id, n);
                per_shard[s as usize].push(id);
                (s, per_shard[s as usize].len() - 1)
            });
        }
        let deadline = self.deadline;
        let calls = per_shard.iter().enumerate().map(|(s, part)| {
            let (c, part, table) = (self.shards[s].clone(), part.clone(), table.to_string());
            async move {
                if part.is_empty() {
                    return Ok(PullSparseReply {
                        dim: 0,
                        values: Vec::new(),
                    });
                }
                Self::call(c, s as u32, deadline, move |mut c| {
                    let req = PullSparseRequest {
                        table: table.clone(),
                        ids: part.clone(),
                        training,
                    };
                    async move { c.pull_sparse(req).await }
                })
                .await
            }
        });
        let replies = self.rt.block_on(futures_join(calls))?;
        self.traffic.add(
            per_shard.iter().filter(|p| !p.is_empty()).count(),
            8 * at.len(),
            4 * replies.iter().map(|r| r.values.len()).sum::<usize>(),
        );
        let dim = replies.iter().map(|r| r.dim as usize).max().unwrap_or(0);
        let mut out = Vec::with_capacity(ids.len() * dim);
        for id in ids {
            let (s, k) = at[id];
            let r = &replies[s as usize];
            let row = r.values.get(k * dim..(k + 1) * dim).ok_or_else(|| PsError::Call {
                shard: s,
                status: format!(
                    "a reply of {} values for {} ids of {dim}",
                    r.values.len(),
                    per_shard[s as usize].len()
                ),
            })?;
            out.extend_from_slice(row);
        }
        Ok((dim, out))
    }

    /// Push gradients `grads` (`dim` per id) for `ids` of sparse table `table`, applied by the
    /// table's optimizer at once; the gradients of a repeated id are summed first, so each row
    /// takes one update.
    pub fn push_sparse(&self, table: &str, ids: &[u64], grads: &[f32], dim: usize) -> Result<(), PsError> {
        self.push_sparse_as(PushMode::Apply, table, ids, grads, dim)
    }

    /// [`PsClient::push_sparse`] in `mode`: applied at once, accumulated until the next
    /// [`PsClient::barrier`], or added as deltas.
    pub fn push_sparse_as(
        &self,
        mode: PushMode,
        table: &str,
        ids: &[u64],
        grads: &[f32],
        dim: usize,
    ) -> Result<(), PsError> {
        if dim == 0 || grads.len() != ids.len() * dim {
            return Err(PsError::Config(format!(
                "{} gradient values for {} ids of {dim}",
                grads.len(),
                ids.len()
            )));
        }
        let n = self.num_shards();
        let mut per_shard: Vec<(Vec<u64>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); n as usize];
        let mut at: HashMap<u64, (u32, usize)> = HashMap::new();
        for (&id, g) in ids.iter().zip(grads.chunks_exact(dim)) {
            let (s, k) = *at.entry(id).or_insert_with(|| {
                let s = shard_of_id(id, n);
                let part = &mut per_shard[s as usize];
                part.0.push(id);
                part.1.resize(part.1.len() + dim, 0.0);
                (s, part.0.len() - 1)
            });
            let row = &mut per_shard[s as usize].1[k * dim..(k + 1) * dim];
            row.iter_mut().zip(g).for_each(|(r, g)| *r += g);
        }
        self.traffic.add(
            per_shard.iter().filter(|p| !p.0.is_empty()).count(),
            per_shard.iter().map(|p| 8 * p.0.len() + 4 * p.1.len()).sum(),
            0,
        );
        let (deadline, trainer) = (self.deadline, self.trainer.load(Ordering::Relaxed));
        let calls = per_shard.into_iter().enumerate().map(|(s, (part, gs))| {
            let (c, table) = (self.shards[s].clone(), table.to_string());
            async move {
                if part.is_empty() {
                    return Ok(PushReply {});
                }
                Self::call(c, s as u32, deadline, move |mut c| {
                    let req = PushSparseRequest {
                        table: table.clone(),
                        ids: part.clone(),
                        grads: gs.clone(),
                        mode: mode.into(),
                        trainer,
                    };
                    async move { c.push_sparse(req).await }
                })
                .await
            }
        });
        self.rt.block_on(futures_join(calls)).map(|_| ())
    }

    /// The values of dense table `table`.
    pub fn pull_dense(&self, table: &str) -> Result<Vec<f32>, PsError> {
        let s = shard_of_table(table, self.num_shards());
        let table = table.to_string();
        self.traffic.add(1, 0, 0);
        let r = self.rt.block_on(Self::call(
            self.shards[s as usize].clone(),
            s,
            self.deadline,
            move |mut c| {
                let req = PullDenseRequest { table: table.clone() };
                async move { c.pull_dense(req).await }
            },
        ))?;
        self.traffic.add(0, 0, 4 * r.values.len());
        Ok(r.values)
    }

    /// Push a gradient of dense table `table`, applied by its optimizer at once.
    pub fn push_dense(&self, table: &str, grads: &[f32]) -> Result<(), PsError> {
        self.push_dense_as(PushMode::Apply, table, grads)
    }

    /// [`PsClient::push_dense`] in `mode` (`Init`: the table's values, taken only if no push
    /// has touched it yet).
    pub fn push_dense_as(&self, mode: PushMode, table: &str, grads: &[f32]) -> Result<(), PsError> {
        let s = shard_of_table(table, self.num_shards());
        self.traffic.add(1, 4 * grads.len(), 0);
        let trainer = self.trainer.load(Ordering::Relaxed);
        let (table, grads) = (table.to_string(), grads.to_vec());
        self.rt.block_on(Self::call(
            self.shards[s as usize].clone(),
            s,
            self.deadline,
            move |mut c| {
                let req = PushDenseRequest {
                    table: table.clone(),
                    grads: grads.clone(),
                    mode: mode.into(),
                    trainer,
                };
                async move { c.push_dense(req).await }
            },
        ))?;
        Ok(())
    }

    /// Wait on every shard until all `trainers` of the job have arrived; the last arrival
    /// applies the gradients accumulated since the previous barrier. Returns the barriers
    /// completed so far (the step count of a sync job).
    pub fn barrier(&self, trainers: u32) -> Result<u64, PsError> {
        let calls = self.shards.iter().enumerate().map(|(s, c)| {
            Self::call(c.clone(), s as u32, self.deadline, move |mut c| async move {
                c.barrier(BarrierRequest { trainers }).await
            })
        });
        let replies = self.rt.block_on(futures_join(calls))?;
        Ok(replies.iter().map(|r| r.generation).min().unwrap_or(0))
    }

    /// Ask every shard to write its snapshot now; their paths.
    pub fn snapshot(&self) -> Result<Vec<String>, PsError> {
        let calls = self.shards.iter().enumerate().map(|(s, c)| {
            Self::call(c.clone(), s as u32, self.deadline, |mut c| async move {
                c.snapshot(SnapshotRequest {}).await
            })
        });
        Ok(self
            .rt
            .block_on(futures_join(calls))?
            .into_iter()
            .map(|r| r.path)
            .collect())
    }
}

/// Run the futures concurrently; their results in order, or the first error.
async fn futures_join<T>(
    calls: impl Iterator<Item = impl std::future::Future<Output = Result<T, PsError>> + Send + 'static>,
) -> Result<Vec<T>, PsError>
where
    T: Send + 'static,
{
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.map_err(|e| PsError::Transport(e.to_string()))??);
    }
    Ok(out)
}
