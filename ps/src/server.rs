//! One parameter-server shard over gRPC: the tables' part that hashes to it, snapshots, and
//! the checks that keep a bad request or a misconfigured job from doing harm.

use crate::proto::parameter_server_server::{ParameterServer, ParameterServerServer};
use crate::proto::*;
use crate::table::{Kind, Table, TableConfig};
use crate::{PsError, shard_of_id, shard_of_table};
use oar_ir::TensorData;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::{Request, Response, Status};

/// The most ids one request may carry, and the largest message a server accepts.
pub const MAX_IDS: usize = 1 << 20;
/// The largest request or reply, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// How a shard is set up.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// This shard's index.
    pub shard: u32,
    /// The number of shards in the job.
    pub num_shards: u32,
    /// The tables (the same list on every shard).
    pub tables: Vec<TableConfig>,
    /// Where snapshots go (`shard-I-of-N.safetensors`); `None`: no snapshots.
    pub snapshot_dir: Option<PathBuf>,
    /// Snapshot after every this many pushes (0: only on request and at shutdown).
    pub snapshot_every: u64,
    /// Also snapshot every this many seconds while serving (0: never by time).
    pub snapshot_secs: u64,
}

impl ServerConfig {
    /// Shard `shard` of `num_shards` holding `tables`, without snapshots.
    pub fn new(shard: u32, num_shards: u32, tables: Vec<TableConfig>) -> ServerConfig {
        ServerConfig {
            shard,
            num_shards,
            tables,
            snapshot_dir: None,
            snapshot_every: 0,
            snapshot_secs: 0,
        }
    }
}

struct State {
    tables: BTreeMap<String, Table>,
    pushes: u64,
    /// The sync barrier: trainers of the job, how many wait now, barriers completed.
    trainers: u32,
    arrived: u32,
    generation: u64,
}

/// A shard's tables and configuration, shared by the gRPC handlers.
#[derive(Clone)]
pub struct Shard {
    config: Arc<ServerConfig>,
    state: Arc<Mutex<State>>,
    /// Announces each completed barrier's generation to the trainers waiting in it.
    barrier_done: Arc<tokio::sync::watch::Sender<u64>>,
}

/// A trainer waiting in a barrier; dropped before the barrier completes (its call cancelled
/// or timed out), it leaves, so a retried call is not counted twice.
struct Arrival {
    shard: Shard,
    generation: u64,
    done: bool,
}

impl Drop for Arrival {
    fn drop(&mut self) {
        if !self.done {
            let mut st = self.shard.lock();
            if st.generation == self.generation && st.arrived > 0 {
                st.arrived -= 1;
            }
        }
    }
}

fn snapshot_path(c: &ServerConfig) -> Option<PathBuf> {
    c.snapshot_dir
        .as_ref()
        .map(|d| d.join(format!("shard-{}-of-{}.safetensors", c.shard, c.num_shards)))
}

fn bad(e: impl std::fmt::Display) -> PsError {
    PsError::Snapshot(e.to_string())
}

impl Shard {
    /// The shard `config` describes, resumed from its snapshot if one exists. A snapshot of
    /// another shard or job size in the directory is refused.
    pub fn new(config: ServerConfig) -> Result<Shard, PsError> {
        if config.num_shards == 0 || config.shard >= config.num_shards {
            return Err(PsError::Config(format!(
                "shard {} of {}: the index must be below the count",
                config.shard, config.num_shards
            )));
        }
        let mut tables = BTreeMap::new();
        for t in &config.tables {
            let sized = t.width() > 0 || matches!(t.kind, Kind::Dense { .. });
            if !sized || tables.insert(t.name.clone(), Table::new(t.clone())).is_some() {
                return Err(PsError::Config(format!(
                    "table `{}` is defined twice or has no values",
                    t.name
                )));
            }
        }
        if let Some(dir) = &config.snapshot_dir {
            let others: Vec<String> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("shard-") && n.ends_with(".safetensors"))
                .collect();
            let mine = format!("shard-{}-of-{}.safetensors", config.shard, config.num_shards);
            if !others.is_empty() && !others.contains(&mine) {
                return Err(PsError::Config(format!(
                    "{} holds snapshots of another layout ({}), not {mine}",
                    dir.display(),
                    others.join(", ")
                )));
            }
        }
        let shard = Shard {
            state: Arc::new(Mutex::new(State {
                tables,
                pushes: 0,
                trainers: 0,
                arrived: 0,
                generation: 0,
            })),
            config: Arc::new(config),
            barrier_done: Arc::new(tokio::sync::watch::channel(0).0),
        };
        if let Some(path) = snapshot_path(&shard.config).filter(|p| p.exists()) {
            shard.restore(&path)?;
        }
        Ok(shard)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write the snapshot now (atomically); its path.
    pub fn snapshot(&self) -> Result<Option<PathBuf>, PsError> {
        let Some(path) = snapshot_path(&self.config) else {
            return Ok(None);
        };
        let mut out: BTreeMap<String, TensorData> = BTreeMap::new();
        {
            let st = self.lock();
            let meta = vec![
                self.config.shard as i64,
                self.config.num_shards as i64,
                st.pushes as i64,
            ];
            out.insert("@meta".into(), TensorData::from_vec(vec![3], meta).map_err(bad)?);
            for (name, t) in &st.tables {
                let mut ids: Vec<u64> = t.rows.keys().copied().collect();
                ids.sort_unstable();
                let width = t.config.width();
                let slen = t.config.optimizer.state_len(width);
                let (mut w, mut s, mut last) = (Vec::new(), Vec::new(), Vec::new());
                for id in &ids {
                    let r = &t.rows[id];
                    w.extend_from_slice(&r.w);
                    s.extend_from_slice(&r.state);
                    last.push(r.last as i64);
                }
                let n = ids.len();
                let ids: Vec<i64> = ids.into_iter().map(|i| i as i64).collect();
                out.insert(format!("{name}/ids"), TensorData::from_vec(vec![n], ids).map_err(bad)?);
                out.insert(
                    format!("{name}/w"),
                    TensorData::from_vec(vec![n, width], w).map_err(bad)?,
                );
                out.insert(
                    format!("{name}/state"),
                    TensorData::from_vec(vec![n, slen], s).map_err(bad)?,
                );
                out.insert(
                    format!("{name}/last"),
                    TensorData::from_vec(vec![n], last).map_err(bad)?,
                );
                out.insert(
                    format!("{name}/clock"),
                    TensorData::from_vec(vec![1], vec![t.clock as i64]).map_err(bad)?,
                );
            }
        }
        let bytes = oar_ir::file::encode_weights(&out).map_err(bad)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(bad)?;
        }
        oar_ir::file::write_atomically(&path, &bytes).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        Ok(Some(path))
    }

    fn restore(&self, path: &std::path::Path) -> Result<(), PsError> {
        let what = |e: &dyn std::fmt::Display| PsError::Snapshot(format!("{}: {e}", path.display()));
        let bytes = std::fs::read(path).map_err(|e| what(&e))?;
        let data = oar_ir::file::decode_weights(&bytes).map_err(|e| what(&e))?;
        let ints = |k: &str| -> Result<Vec<i64>, PsError> {
            data.get(k)
                .ok_or_else(|| what(&format!("no `{k}`")))?
                .to_vec::<i64>()
                .map_err(|e| what(&e))
        };
        let meta = ints("@meta")?;
        if meta.len() != 3 || meta[0] != self.config.shard as i64 || meta[1] != self.config.num_shards as i64 {
            return Err(what(&format!(
                "the snapshot is of shard {:?}, this server is shard {} of {}",
                meta.get(..2),
                self.config.shard,
                self.config.num_shards
            )));
        }
        let mut st = self.lock();
        st.pushes = meta[2] as u64;
        for (name, t) in st.tables.iter_mut() {
            let ids = ints(&format!("{name}/ids"))?;
            let last = ints(&format!("{name}/last"))?;
            let floats = |k: String| -> Result<Vec<f32>, PsError> {
                data.get(&k)
                    .ok_or_else(|| what(&format!("no `{k}`")))?
                    .to_vec::<f32>()
                    .map_err(|e| what(&e))
            };
            let w = floats(format!("{name}/w"))?;
            let s = floats(format!("{name}/state"))?;
            if let (Kind::Dense { len: 0 }, [_]) = (t.config.kind, ids.as_slice()) {
                // A dense table sized by its first INIT: the snapshot knows the size.
                t.config.kind = Kind::Dense { len: w.len() };
            }
            let width = t.config.width();
            let slen = t.config.optimizer.state_len(width);
            if w.len() != ids.len() * width || s.len() != ids.len() * slen || last.len() != ids.len() {
                return Err(what(&format!("table `{name}` does not match its definition")));
            }
            t.rows.clear();
            for (k, &id) in ids.iter().enumerate() {
                t.rows.insert(
                    id as u64,
                    crate::table::Row {
                        w: w[k * width..(k + 1) * width].to_vec(),
                        state: s[k * slen..(k + 1) * slen].to_vec(),
                        last: last[k] as u64,
                    },
                );
            }
            t.clock = ints(&format!("{name}/clock"))?.first().copied().unwrap_or(0) as u64;
        }
        Ok(())
    }

    fn after_push(&self, pushes: u64) -> Result<(), Status> {
        if self.config.snapshot_every > 0 && pushes.is_multiple_of(self.config.snapshot_every) {
            self.snapshot().map_err(|e| Status::internal(e.to_string()))?;
        }
        Ok(())
    }

    /// Check that every id of a sparse request belongs to this shard.
    fn check_ids(&self, table: &str, ids: &[u64]) -> Result<(), Status> {
        if ids.len() > MAX_IDS {
            return Err(Status::resource_exhausted(format!(
                "{} ids in one request (at most {MAX_IDS})",
                ids.len()
            )));
        }
        let n = self.config.num_shards;
        if let Some(id) = ids.iter().find(|&&id| shard_of_id(id, n) != self.config.shard) {
            return Err(Status::invalid_argument(format!(
                "table `{table}`: id {id} belongs to shard {}, this is shard {} of {n}",
                shard_of_id(*id, n),
                self.config.shard
            )));
        }
        Ok(())
    }

    fn table<'a>(st: &'a mut State, name: &str, sparse: bool) -> Result<&'a mut Table, Status> {
        let t = st
            .tables
            .get_mut(name)
            .ok_or_else(|| Status::not_found(format!("no table `{name}`")))?;
        match (t.config.kind, sparse) {
            (Kind::Sparse { .. }, true) | (Kind::Dense { .. }, false) => Ok(t),
            _ => Err(Status::invalid_argument(format!(
                "table `{name}` is {}",
                if sparse { "dense" } else { "sparse" }
            ))),
        }
    }

    fn check_dense_home(&self, name: &str) -> Result<(), Status> {
        let home = shard_of_table(name, self.config.num_shards);
        if home != self.config.shard {
            return Err(Status::invalid_argument(format!(
                "dense table `{name}` lives on shard {home}, this is shard {}",
                self.config.shard
            )));
        }
        Ok(())
    }
}

/// The barrier generation announced at shutdown: it wakes the trainers waiting in a barrier
/// (they get `Unavailable`) so that shutting down does not wait for their deadlines.
const SHUTTING_DOWN: u64 = u64::MAX;

/// A push's mode; `INIT` is for dense tables only, unknown values are refused.
fn mode(m: i32, dense: bool) -> Result<PushMode, Status> {
    match PushMode::try_from(m) {
        Ok(PushMode::Init) if !dense => Err(Status::invalid_argument("INIT pushes are for dense tables")),
        Ok(m) => Ok(m),
        Err(_) => Err(Status::invalid_argument(format!("unknown push mode {m}"))),
    }
}

#[tonic::async_trait]
impl ParameterServer for Shard {
    async fn info(&self, req: Request<InfoRequest>) -> Result<Response<InfoReply>, Status> {
        let r = req.into_inner();
        if r.shard != self.config.shard || r.num_shards != self.config.num_shards {
            return Err(Status::failed_precondition(format!(
                "this server is shard {} of {}, the client expects shard {} of {}",
                self.config.shard, self.config.num_shards, r.shard, r.num_shards
            )));
        }
        let st = self.lock();
        let tables = st
            .tables
            .iter()
            .map(|(name, t)| TableInfo {
                name: name.clone(),
                rows: t.len() as u64,
                bytes: t.bytes(),
            })
            .collect();
        Ok(Response::new(InfoReply {
            shard: self.config.shard,
            num_shards: self.config.num_shards,
            tables,
        }))
    }

    async fn pull_sparse(&self, req: Request<PullSparseRequest>) -> Result<Response<PullSparseReply>, Status> {
        let r = req.into_inner();
        self.check_ids(&r.table, &r.ids)?;
        let mut st = self.lock();
        let t = Shard::table(&mut st, &r.table, true)?;
        let values = t.pull(&r.ids, r.training);
        Ok(Response::new(PullSparseReply {
            dim: t.config.width() as u32,
            values,
        }))
    }

    async fn push_sparse(&self, req: Request<PushSparseRequest>) -> Result<Response<PushReply>, Status> {
        let r = req.into_inner();
        self.check_ids(&r.table, &r.ids)?;
        let pushes = {
            let mut st = self.lock();
            let t = Shard::table(&mut st, &r.table, true)?;
            let dim = t.config.width();
            if r.grads.len() != r.ids.len() * dim || r.grads.iter().any(|g| !g.is_finite()) {
                return Err(Status::invalid_argument(format!(
                    "table `{}`: {} gradient values for {} ids of {dim} (all finite)",
                    r.table,
                    r.grads.len(),
                    r.ids.len()
                )));
            }
            match mode(r.mode, false)? {
                PushMode::Apply => t.push(&r.ids, &r.grads),
                PushMode::Accumulate => {
                    t.accumulate(r.trainer, &r.ids, &r.grads);
                    return Ok(Response::new(PushReply {}));
                }
                PushMode::Delta => t.add(&r.ids, &r.grads),
                PushMode::Init => unreachable!("refused by mode()"),
            }
            st.pushes += 1;
            st.pushes
        };
        self.after_push(pushes)?;
        Ok(Response::new(PushReply {}))
    }

    async fn pull_dense(&self, req: Request<PullDenseRequest>) -> Result<Response<PullDenseReply>, Status> {
        let r = req.into_inner();
        self.check_dense_home(&r.table)?;
        let mut st = self.lock();
        let t = Shard::table(&mut st, &r.table, false)?;
        Ok(Response::new(PullDenseReply {
            values: t.pull(&[0], false),
        }))
    }

    async fn push_dense(&self, req: Request<PushDenseRequest>) -> Result<Response<PushReply>, Status> {
        let r = req.into_inner();
        self.check_dense_home(&r.table)?;
        let pushes = {
            let mut st = self.lock();
            let t = Shard::table(&mut st, &r.table, false)?;
            let m = mode(r.mode, true)?;
            // INIT may size a table defined without a length.
            let sizing = m == PushMode::Init && t.config.width() == 0;
            if (!sizing && r.grads.len() != t.config.width()) || r.grads.iter().any(|g| !g.is_finite()) {
                return Err(Status::invalid_argument(format!(
                    "dense table `{}` has {} values, the push {} (all finite)",
                    r.table,
                    t.config.width(),
                    r.grads.len()
                )));
            }
            match m {
                PushMode::Apply => t.push(&[0], &r.grads),
                PushMode::Accumulate => {
                    t.accumulate(r.trainer, &[0], &r.grads);
                    return Ok(Response::new(PushReply {}));
                }
                PushMode::Delta => t.add(&[0], &r.grads),
                PushMode::Init => {
                    t.init_dense(&r.grads);
                    return Ok(Response::new(PushReply {}));
                }
            }
            st.pushes += 1;
            st.pushes
        };
        self.after_push(pushes)?;
        Ok(Response::new(PushReply {}))
    }

    async fn barrier(&self, req: Request<BarrierRequest>) -> Result<Response<BarrierReply>, Status> {
        let trainers = req.into_inner().trainers;
        let (mut arrival, mut done) = {
            let mut st = self.lock();
            if trainers == 0 || (st.arrived > 0 && st.trainers != trainers) {
                return Err(Status::failed_precondition(format!(
                    "a barrier of {trainers} trainers, but {} of {} have arrived",
                    st.arrived, st.trainers
                )));
            }
            st.trainers = trainers;
            st.arrived += 1;
            if st.arrived == trainers {
                // The last trainer: apply the step's gradients and release everyone.
                st.arrived = 0;
                st.generation += 1;
                let mut applied = 0;
                for t in st.tables.values_mut() {
                    applied += u64::from(t.apply_accumulated());
                }
                st.pushes += applied;
                let (generation, pushes) = (st.generation, st.pushes);
                drop(st);
                self.barrier_done.send_replace(generation);
                if applied > 0 {
                    self.after_push(pushes)?;
                }
                return Ok(Response::new(BarrierReply { generation }));
            }
            let arrival = Arrival {
                shard: self.clone(),
                generation: st.generation,
                done: false,
            };
            (arrival, self.barrier_done.subscribe())
        };
        let mine = arrival.generation;
        let generation = *done
            .wait_for(|&g| g > mine)
            .await
            .map_err(|_| Status::unavailable("the server is shutting down"))?;
        if generation == SHUTTING_DOWN {
            return Err(Status::unavailable("the server is shutting down"));
        }
        arrival.done = true;
        Ok(Response::new(BarrierReply { generation }))
    }

    async fn snapshot(&self, _: Request<SnapshotRequest>) -> Result<Response<SnapshotReply>, Status> {
        let path = self.snapshot().map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(SnapshotReply {
            path: path.map(|p| p.display().to_string()).unwrap_or_default(),
        }))
    }
}

/// Serve `shard` on `addr` until `shutdown` completes, then write a final snapshot.
pub async fn serve(
    shard: Shard,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), PsError> {
    // Small requests go out at once (no Nagle delay against the peer's delayed ACKs).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let ticker = (shard.config.snapshot_secs > 0).then(|| {
        let (shard, every) = (shard.clone(), Duration::from_secs(shard.config.snapshot_secs));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tick.tick().await;
                let s = shard.clone();
                // Writing a snapshot blocks; keep it off the serving threads.
                if let Ok(Err(e)) = tokio::task::spawn_blocking(move || s.snapshot()).await {
                    eprintln!("oar ps: shard {}: timed snapshot failed: {e}", shard.config.shard);
                }
            }
        })
    });
    let svc = ParameterServerServer::new(shard.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let waiters = shard.barrier_done.clone();
    let shutdown = async move {
        shutdown.await;
        waiters.send_replace(SHUTTING_DOWN);
    };
    let served = tonic::transport::Server::builder()
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| PsError::Transport(e.to_string()));
    if let Some(t) = ticker {
        t.abort();
    }
    served?;
    shard.snapshot()?;
    Ok(())
}

/// A gRPC service served on a thread of its own: `stop` (or drop) shuts it down and waits.
pub(crate) struct Serving {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), PsError>>>,
    what: &'static str,
}

impl Serving {
    /// Bind `addr` (port 0: any free port), then run `serve(listener, shutdown)` on a new
    /// thread's runtime until stopped.
    pub(crate) fn start<F, Fut>(what: &'static str, addr: SocketAddr, serve: F) -> Result<Serving, PsError>
    where
        F: FnOnce(tokio::net::TcpListener, tokio::sync::oneshot::Receiver<()>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), PsError>>,
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| PsError::Transport(e.to_string()))?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(|e| PsError::Transport(format!("cannot listen on {addr}: {e}")))?;
        let addr = listener.local_addr().map_err(|e| PsError::Transport(e.to_string()))?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("oar-{what}-{addr}"))
            .spawn(move || rt.block_on(serve(listener, rx)))
            .map_err(|e| PsError::Transport(e.to_string()))?;
        Ok(Serving {
            addr,
            stop: Some(tx),
            thread: Some(thread),
            what,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn shutdown(&mut self) -> Result<(), PsError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| PsError::Transport(format!("the {} thread panicked", self.what)))?,
            None => Ok(()),
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// A shard served on a thread of its own (tests, embedding a server in a program): `stop`
/// shuts it down, writes its final snapshot and waits.
pub struct RunningServer(Serving);

impl RunningServer {
    /// Serve `config`'s shard on `addr` (port 0: any free port).
    pub fn start(config: ServerConfig, addr: SocketAddr) -> Result<RunningServer, PsError> {
        let shard = Shard::new(config)?;
        Serving::start("ps", addr, move |listener, rx| {
            serve(shard, listener, async {
                let _ = rx.await;
            })
        })
        .map(RunningServer)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    /// Shut down (final snapshot written) and wait.
    pub fn stop(mut self) -> Result<(), PsError> {
        self.0.shutdown()
    }
}
