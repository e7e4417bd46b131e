//! Training against a parameter server (`oar-ps`, feature `ps`): embeddings whose tables live
//! on the servers, the dense parameters kept there too, and the three ways trainers keep in
//! step with them.
//!
//! A [`PsTrainer`] holds the connection and the [`Strategy`]: its [`Mode`] and this trainer's
//! place in the job. [`PsTrainer::sparse_embedding`] gives [`SparseEmbedding`] layers, whose
//! `forward` pulls the rows of the batch's unique ids into a leaf tensor and looks the ids up
//! in it, so autograd gives that leaf the rows' gradients. [`PsTrainer::bind_dense`] keeps
//! the model's dense parameters in a dense table. After `backward`, [`PsTrainer::step`]
//! sends what the step learnt, as the mode says:
//!
//! | mode | the step sends | applied | the next step reads |
//! |---|---|---|---|
//! | [`Mode::Sync`] | gradients ÷ trainers, summed on the servers | once, by the servers' optimizer, when every trainer has reached the step's barrier | the updated values: as one process over all trainers' batches |
//! | [`Mode::Async`] | gradients, from a background thread while the next step computes | at once, by the servers' optimizer | whatever has arrived |
//! | [`Mode::Geo`] | every `k` steps, the change of its local copy ÷ trainers | added to the values | its local copy, updated by local SGD between exchanges |
//!
//! [`SparseEmbedding::prefetch`] starts the pull of the next batch's rows while this one
//! computes (in sync mode call it after `step`, so it reads the updated rows).

use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

mod heter;
pub use heter::{DensePart, HeterLink, HeterStep, serve_heter};
pub use oar_ps::{
    Mode, Optimizer as ServerOptimizer, PsClient, PsError, PushMode, RunningHeter, RunningServer, ServerConfig,
    TableConfig,
};

/// A parameter-server, transport or data error as oar's.
fn ps_err(e: impl std::fmt::Display) -> Error {
    Error::invalid("parameter server", e.to_string())
}

/// A trainer's mode and place in the job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Strategy {
    /// How the trainers keep in step.
    pub mode: Mode,
    /// This trainer's index.
    pub trainer: u32,
    /// The number of trainers in the job.
    pub trainers: u32,
}

impl Strategy {
    /// Trainer `trainer` of `trainers` in `mode`.
    pub fn new(mode: Mode, trainer: u32, trainers: u32) -> Result<Strategy> {
        if trainers == 0 || trainer >= trainers {
            return Err(Error::invalid(
                "ps::Strategy",
                format!("trainer {trainer} of {trainers}: the index must be below the count"),
            ));
        }
        mode.check().map_err(ps_err)?;
        Ok(Strategy {
            mode,
            trainer,
            trainers,
        })
    }

    /// Trainer `trainer` of `trainers` in the mode written `sync`, `async` or `geo:K:LR`.
    pub fn from_mode(mode: &str, trainer: u32, trainers: u32) -> Result<Strategy> {
        Strategy::new(mode.parse().map_err(ps_err)?, trainer, trainers)
    }

    /// The job's trainer from the environment `oar ps launch` sets: `OAR_PS_MODE` (`sync`,
    /// `async` or `geo:K:LR`; default sync), `OAR_PS_TRAINER_ID`, `OAR_PS_TRAINERS`
    /// (default: trainer 0 of 1).
    pub fn from_env() -> Result<Strategy> {
        let num = |k: &str, default: u32| -> Result<u32> {
            std::env::var(k).map_or(Ok(default), |v| {
                v.parse()
                    .map_err(|_| Error::invalid("ps::Strategy", format!("{k}={v} is not a number")))
            })
        };
        let mode = std::env::var("OAR_PS_MODE").unwrap_or_else(|_| "sync".into());
        Strategy::from_mode(&mode, num("OAR_PS_TRAINER_ID", 0)?, num("OAR_PS_TRAINERS", 1)?)
    }
}

/// The endpoints `oar ps launch` gives its trainers (`OAR_PS_ENDPOINTS`, comma-separated), if
/// this process is one.
pub fn endpoints_from_env() -> Option<Vec<String>> {
    std::env::var("OAR_PS_ENDPOINTS")
        .ok()
        .map(|v| v.split(',').filter(|e| !e.is_empty()).map(str::to_string).collect())
}

/// A push sent by the background thread (async mode).
enum Job {
    Sparse {
        table: String,
        ids: Vec<u64>,
        grads: Vec<f32>,
        dim: usize,
    },
    Dense {
        table: String,
        grads: Vec<f32>,
    },
    Flush(SyncSender<()>),
}

/// The async mode's sender: a thread that makes the pushes, at most a few steps behind; the
/// first error it meets is reported by the next step.
struct Sender {
    queue: Option<SyncSender<Job>>,
    failed: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Sender {
    fn start(client: Arc<PsClient>) -> Result<Sender> {
        let (tx, rx): (SyncSender<Job>, Receiver<Job>) = sync_channel(4);
        let failed = Arc::new(Mutex::new(None));
        let seen = failed.clone();
        let thread = std::thread::Builder::new()
            .name("oar-ps-push".into())
            .spawn(move || {
                for job in rx {
                    let r = match job {
                        Job::Sparse { table, ids, grads, dim } => client.push_sparse(&table, &ids, &grads, dim),
                        Job::Dense { table, grads } => client.push_dense(&table, &grads),
                        Job::Flush(done) => {
                            let _ = done.send(());
                            Ok(())
                        }
                    };
                    if let Err(e) = r {
                        seen.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e.to_string());
                    }
                }
            })
            .map_err(ps_err)?;
        Ok(Sender {
            queue: Some(tx),
            failed,
            thread: Some(thread),
        })
    }

    fn send(&self, job: Job) -> Result<()> {
        self.check()?;
        self.queue
            .as_ref()
            .and_then(|q| q.send(job).ok())
            .ok_or_else(|| ps_err("the push thread has stopped"))
    }

    fn check(&self) -> Result<()> {
        match self.failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(Error::invalid("parameter server (async push)", e)),
            None => Ok(()),
        }
    }

    /// Wait until every push sent so far is made.
    fn flush(&self) -> Result<()> {
        let (tx, rx) = sync_channel(1);
        self.send(Job::Flush(tx))?;
        rx.recv().map_err(|_| ps_err("the push thread has stopped"))?;
        self.check()
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a trainer's layers share: the connection, the strategy and the async sender.
struct Link {
    client: Arc<PsClient>,
    strategy: Strategy,
    sender: Option<Sender>,
}

impl Link {
    /// Send gradients (sync: ÷ trainers, accumulated; async: applied, in the background;
    /// standalone: applied now).
    fn push_sparse(&self, table: &str, ids: Vec<u64>, mut grads: Vec<f32>, dim: usize) -> Result<()> {
        match (self.strategy.mode, &self.sender) {
            (Mode::Sync, _) => {
                let t = self.strategy.trainers as f32;
                grads.iter_mut().for_each(|g| *g /= t);
                self.client
                    .push_sparse_as(PushMode::Accumulate, table, &ids, &grads, dim)
                    .map_err(ps_err)
            }
            (Mode::Async, Some(s)) => s.send(Job::Sparse {
                table: table.into(),
                ids,
                grads,
                dim,
            }),
            _ => self.client.push_sparse(table, &ids, &grads, dim).map_err(ps_err),
        }
    }
}

/// A trainer of a parameter-server job (see the [module docs](self)).
pub struct PsTrainer {
    link: Arc<Link>,
    steps: Cell<u64>,
    dense: RefCell<Vec<DenseBinding>>,
}

/// Model parameters kept in a dense table: their values side by side, in order.
struct DenseBinding {
    table: String,
    params: Vec<Tensor>,
    /// GEO: the values at the last exchange.
    base: Vec<f32>,
}

fn flatten(params: &[Tensor], grads: bool) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for p in params {
        let v = if grads {
            match p.grad() {
                Some(g) => g.try_data()?.to_vec::<f32>().map_err(ps_err)?,
                None => vec![0.0; p.numel()],
            }
        } else {
            p.try_data()?.to_vec::<f32>().map_err(ps_err)?
        };
        out.extend(v);
    }
    Ok(out)
}

fn scatter(params: &[Tensor], values: &[f32]) -> Result<()> {
    let mut at = 0;
    for p in params {
        let n = p.numel();
        let part = values
            .get(at..at + n)
            .ok_or_else(|| ps_err(format!("a dense table of {} values is too short", values.len())))?;
        p.set_data(TensorData::from_vec(p.shape(), part.to_vec()).map_err(ps_err)?)?;
        at += n;
    }
    Ok(())
}

/// Bind `params` to dense table `table`: push them as `INIT` (the first trainer's are
/// taken), wait at a barrier of `trainers` if given, then set them to the table's values,
/// which are returned.
fn bind(op: &str, ps: &PsClient, table: &str, params: &[Tensor], trainers: Option<u32>) -> Result<Vec<f32>> {
    if let Some(p) = params.iter().find(|p| p.dtype() != DType::F32) {
        return Err(Error::invalid(
            op,
            format!("parameters must be f32, got {}", p.tensor_type()),
        ));
    }
    ps.push_dense_as(PushMode::Init, table, &flatten(params, false)?)
        .map_err(ps_err)?;
    if let Some(t) = trainers {
        ps.barrier(t).map_err(ps_err)?;
    }
    let values = ps.pull_dense(table).map_err(ps_err)?;
    let total: usize = params.iter().map(Tensor::numel).sum();
    if values.len() != total {
        return Err(Error::invalid(
            op,
            format!(
                "dense table `{table}` holds {} values, the parameters {total}",
                values.len()
            ),
        ));
    }
    scatter(params, &values)?;
    Ok(values)
}

impl PsTrainer {
    /// A trainer of the servers `client` talks to, keeping in step as `strategy` says.
    pub fn new(client: Arc<PsClient>, strategy: Strategy) -> Result<PsTrainer> {
        client.set_trainer(strategy.trainer);
        let sender = match strategy.mode {
            Mode::Async => Some(Sender::start(client.clone())?),
            _ => None,
        };
        Ok(PsTrainer {
            link: Arc::new(Link {
                client,
                strategy,
                sender,
            }),
            steps: Cell::new(0),
            dense: RefCell::new(Vec::new()),
        })
    }

    /// This process's place in the job `oar ps launch` started: the shards of
    /// `OAR_PS_ENDPOINTS` and [`Strategy::from_env`]; every call's deadline is `deadline`.
    pub fn from_env(deadline: std::time::Duration) -> Result<PsTrainer> {
        let endpoints = endpoints_from_env().ok_or_else(|| {
            Error::invalid(
                "PsTrainer::from_env",
                "OAR_PS_ENDPOINTS is not set (run under `oar ps launch`)",
            )
        })?;
        let client = PsClient::connect(&endpoints, deadline).map_err(ps_err)?;
        PsTrainer::new(Arc::new(client), Strategy::from_env()?)
    }

    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        self.link.strategy
    }

    /// The client.
    pub fn client(&self) -> &Arc<PsClient> {
        &self.link.client
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps.get()
    }

    /// An embedding layer over sparse table `table` (`dim` values per row) that keeps in step
    /// by this trainer's strategy.
    pub fn sparse_embedding(&self, table: &str, dim: usize) -> Result<SparseEmbedding> {
        SparseEmbedding::with_link(self.link.clone(), table, dim)
    }

    /// Keep `params` (f32, in this order) in dense table `table`, whose length must be their
    /// total size. The first trainer to arrive sets the table to its values (unless the table
    /// has been trained already, e.g. resumed from a snapshot); then every trainer waits for
    /// the others and starts from the table's values. In sync and async mode the servers'
    /// optimizer trains them (no local optimizer); in GEO mode local SGD does.
    pub fn bind_dense(&self, table: &str, params: Vec<Tensor>) -> Result<()> {
        let link = &self.link;
        let values = bind(
            "PsTrainer::bind_dense",
            &link.client,
            table,
            &params,
            Some(link.strategy.trainers),
        )?;
        self.dense.borrow_mut().push(DenseBinding {
            table: table.to_string(),
            params,
            base: values,
        });
        Ok(())
    }

    /// End a step, after `backward`: send what `embeddings` and the bound dense parameters
    /// learnt (see the [module docs](self)), bring the dense parameters up to date and clear
    /// their gradients.
    pub fn step(&self, embeddings: &[&SparseEmbedding]) -> Result<()> {
        let link = &self.link;
        let c = &link.client;
        let t = link.strategy.trainers;
        let step = self.steps.get() + 1;
        self.steps.set(step);
        for e in embeddings {
            e.push_gradients()?;
        }
        let mut dense = self.dense.borrow_mut();
        match link.strategy.mode {
            Mode::Sync => {
                for b in dense.iter() {
                    let mut g = flatten(&b.params, true)?;
                    g.iter_mut().for_each(|g| *g /= t as f32);
                    c.push_dense_as(PushMode::Accumulate, &b.table, &g).map_err(ps_err)?;
                }
                c.barrier(t).map_err(ps_err)?;
                for b in dense.iter() {
                    scatter(&b.params, &c.pull_dense(&b.table).map_err(ps_err)?)?;
                }
            }
            Mode::Async => {
                let sender = link.sender.as_ref().expect("async trainers have a sender");
                for b in dense.iter() {
                    sender.send(Job::Dense {
                        table: b.table.clone(),
                        grads: flatten(&b.params, true)?,
                    })?;
                }
                for b in dense.iter() {
                    scatter(&b.params, &c.pull_dense(&b.table).map_err(ps_err)?)?;
                }
            }
            Mode::Geo { k, lr } => {
                for b in dense.iter() {
                    let mut w = flatten(&b.params, false)?;
                    let g = flatten(&b.params, true)?;
                    w.iter_mut().zip(&g).for_each(|(w, g)| *w -= lr * g);
                    scatter(&b.params, &w)?;
                }
                if step.is_multiple_of(k) {
                    self.geo_exchange(embeddings, &mut dense)?;
                }
            }
        }
        for b in dense.iter() {
            b.params.iter().for_each(Tensor::clear_grad);
        }
        Ok(())
    }

    /// Wait until every push sent so far has been made (async mode; the others push as they
    /// go), and send GEO's pending local changes of `embeddings` and the dense parameters.
    pub fn flush(&self, embeddings: &[&SparseEmbedding]) -> Result<()> {
        if let Some(s) = &self.link.sender {
            s.flush()?;
        }
        if let Mode::Geo { .. } = self.link.strategy.mode {
            self.geo_exchange(embeddings, &mut self.dense.borrow_mut())?;
        }
        Ok(())
    }

    /// GEO: push the local change (÷ trainers) of `embeddings`' rows and of the dense
    /// parameters since the last exchange, and take the servers' values.
    fn geo_exchange(&self, embeddings: &[&SparseEmbedding], dense: &mut [DenseBinding]) -> Result<()> {
        let c = &self.link.client;
        let t = self.link.strategy.trainers as f32;
        for e in embeddings {
            e.geo_exchange()?;
        }
        for b in dense.iter_mut() {
            let w = flatten(&b.params, false)?;
            let delta: Vec<f32> = w.iter().zip(&b.base).map(|(w, b)| (w - b) / t).collect();
            c.push_dense_as(PushMode::Delta, &b.table, &delta).map_err(ps_err)?;
            b.base = c.pull_dense(&b.table).map_err(ps_err)?;
            scatter(&b.params, &b.base)?;
        }
        Ok(())
    }
}

/// GEO: a row's local values and its values at the last exchange.
type LocalRow = (Vec<f32>, Vec<f32>);

/// A prefetched pull: the unique ids and the thread fetching their rows.
type Prefetch = (
    Vec<u64>,
    JoinHandle<std::result::Result<(usize, Vec<f32>), oar_ps::PsError>>,
);

/// An embedding table on a parameter server: `forward` maps integer ids `[*]` to rows
/// `[*, dim]` (see the [module docs](self)). Clones share everything (the rows pulled since
/// the last step, the training flag): give one to a model, e.g.
/// [`WideDeep::with_tables`](crate::rec::models::WideDeep::with_tables), and pass another to
/// [`PsTrainer::step`].
#[derive(Clone)]
pub struct SparseEmbedding {
    link: Arc<Link>,
    table: String,
    dim: usize,
    /// Where `forward` puts the rows (a device trainer's device).
    device: crate::Device,
    state: Arc<EmbeddingState>,
}

#[derive(Default)]
struct EmbeddingState {
    /// Eval mode: unknown ids read as zeros and create nothing.
    eval: AtomicBool,
    /// The pulled rows of each forward since the last push: the ids and their leaf.
    pulled: Mutex<Vec<(Vec<u64>, Tensor)>>,
    /// GEO: the local copy of the rows used since the last exchange, and their values then.
    local: Mutex<HashMap<u64, LocalRow>>,
    prefetched: Mutex<Option<Prefetch>>,
}

/// A lock that a panicked holder did not poison for good.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Unique ids in order of first appearance, and each id's row among them.
fn unique_ids(op: &str, ids: &Tensor) -> Result<(Vec<u64>, Vec<i64>)> {
    if ids.dtype().is_float() || ids.dtype() == DType::Bool {
        return Err(Error::invalid(
            op,
            format!("ids must be integers, got {}", ids.tensor_type()),
        ));
    }
    let all: Vec<i64> = ids.cast(DType::I64)?.try_data()?.to_vec::<i64>().map_err(ps_err)?;
    let mut slot: HashMap<i64, i64> = HashMap::new();
    let mut unique = Vec::new();
    let index = all
        .iter()
        .map(|&id| {
            *slot.entry(id).or_insert_with(|| {
                unique.push(id as u64);
                unique.len() as i64 - 1
            })
        })
        .collect();
    Ok((unique, index))
}

impl SparseEmbedding {
    /// The sparse table `table` (of `dim` values per row) on the servers `client` talks to,
    /// used by a lone trainer: `push_gradients` applies the gradients at once. A trainer of
    /// a job takes its layers from [`PsTrainer::sparse_embedding`].
    pub fn new(client: Arc<PsClient>, table: &str, dim: usize) -> Result<SparseEmbedding> {
        let link = Link {
            client,
            strategy: Strategy::new(Mode::Async, 0, 1)?,
            sender: None,
        };
        SparseEmbedding::with_link(Arc::new(link), table, dim)
    }

    fn with_link(link: Arc<Link>, table: &str, dim: usize) -> Result<SparseEmbedding> {
        if dim == 0 {
            return Err(Error::invalid("SparseEmbedding", "dim must be positive"));
        }
        Ok(SparseEmbedding {
            link,
            table: table.to_string(),
            dim,
            device: crate::Device::CPU,
            state: Arc::default(),
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// This layer with `forward` putting the rows, the lookup and its output on `device` (a
    /// trainer whose model runs on an accelerator); the gradients are brought back to be sent.
    pub fn on(mut self, device: &crate::Device) -> SparseEmbedding {
        self.device = device.clone();
        self
    }

    /// Start pulling the rows of `ids` (the next batch) on another thread; the `forward` of
    /// the same ids uses them instead of pulling. In sync mode call it after the step, so
    /// that it reads the updated rows.
    pub fn prefetch(&self, ids: &Tensor) -> Result<()> {
        let (unique, _) = unique_ids("SparseEmbedding::prefetch", ids)?;
        let (client, table, training) = (
            self.link.client.clone(),
            self.table.clone(),
            !self.state.eval.load(Ordering::Relaxed),
        );
        let ask = unique.clone();
        let handle = std::thread::Builder::new()
            .name("oar-ps-prefetch".into())
            .spawn(move || client.pull_sparse(&table, &ask, training))
            .map_err(ps_err)?;
        // A prefetch nobody used is joined (and dropped) here.
        if let Some((_, old)) = lock(&self.state.prefetched).replace((unique, handle)) {
            let _ = old.join();
        }
        Ok(())
    }

    /// The rows of `unique`, from a matching prefetch or pulled now.
    fn fetch(&self, unique: &[u64], training: bool) -> Result<Vec<f32>> {
        let pre = lock(&self.state.prefetched).take();
        let (dim, values) = match pre {
            Some((ids, h)) if ids == unique => h
                .join()
                .map_err(|_| ps_err("the prefetch thread panicked"))?
                .map_err(ps_err)?,
            other => {
                if let Some((_, h)) = other {
                    let _ = h.join();
                }
                self.link
                    .client
                    .pull_sparse(&self.table, unique, training)
                    .map_err(ps_err)?
            }
        };
        if dim != self.dim {
            return Err(Error::invalid(
                "SparseEmbedding",
                format!("table `{}` has rows of {dim} values, not {}", self.table, self.dim),
            ));
        }
        Ok(values)
    }

    /// Send the gradients of the rows every forward since the last push pulled (rows without
    /// a gradient send none) as the strategy says (GEO: apply them to the local copy); then
    /// forget them. [`PsTrainer::step`] calls it.
    pub fn push_gradients(&self) -> Result<()> {
        let pulled = std::mem::take(&mut *lock(&self.state.pulled));
        for (ids, rows) in pulled {
            let Some(g) = rows.grad() else { continue };
            let g = g.try_data()?.to_vec::<f32>().map_err(ps_err)?;
            if let Mode::Geo { lr, .. } = self.link.strategy.mode {
                let mut local = lock(&self.state.local);
                for (id, g) in ids.iter().zip(g.chunks_exact(self.dim)) {
                    if let Some((w, _)) = local.get_mut(id) {
                        w.iter_mut().zip(g).for_each(|(w, g)| *w -= lr * g);
                    }
                }
            } else {
                self.link.push_sparse(&self.table, ids, g, self.dim)?;
            }
        }
        Ok(())
    }

    /// GEO: push the change of every local row since it was pulled (÷ trainers) and drop the
    /// local copy, so the next forward pulls the servers' values.
    fn geo_exchange(&self) -> Result<()> {
        let local = std::mem::take(&mut *lock(&self.state.local));
        let t = self.link.strategy.trainers as f32;
        let (mut ids, mut deltas) = (Vec::new(), Vec::new());
        for (id, (w, base)) in local {
            if w != base {
                ids.push(id);
                deltas.extend(w.iter().zip(&base).map(|(w, b)| (w - b) / t));
            }
        }
        if ids.is_empty() {
            return Ok(());
        }
        self.link
            .client
            .push_sparse_as(PushMode::Delta, &self.table, &ids, &deltas, self.dim)
            .map_err(ps_err)
    }
}

impl SparseEmbedding {
    /// The unique ids of `ids`, each id's position among them, and their rows (GEO: from the
    /// local copy, pulling the rows it lacks).
    fn rows_of(&self, op: &str, ids: &Tensor, training: bool) -> Result<(Vec<u64>, Vec<i64>, Vec<f32>)> {
        let (unique, index) = unique_ids(op, ids)?;
        let values = if let (Mode::Geo { .. }, true) = (self.link.strategy.mode, training) {
            // The local copy first; rows not in it are pulled and join it.
            let mut local = lock(&self.state.local);
            let missing: Vec<u64> = unique.iter().copied().filter(|id| !local.contains_key(id)).collect();
            if !missing.is_empty() {
                drop(local);
                let got = self.fetch(&missing, true)?;
                local = lock(&self.state.local);
                for (id, row) in missing.iter().zip(got.chunks_exact(self.dim)) {
                    local.insert(*id, (row.to_vec(), row.to_vec()));
                }
            }
            unique.iter().flat_map(|id| local[id].0.iter().copied()).collect()
        } else {
            self.fetch(&unique, training)?
        };
        Ok((unique, index, values))
    }

    /// For a compiled step (`jit::to_static_step`), whose graph cannot pull: the rows of the
    /// batch's unique ids as a block of `capacity` rows (zeros after the last; `capacity` at
    /// least the number of unique ids, e.g. `ids.numel()`, so that every batch has the same
    /// shape) and the index of each id's row, shaped as `ids`. The step looks the index up in
    /// the rows (`nn::functional::embedding`), marks the rows input as needing its gradient
    /// and returns that gradient, which [`SparseEmbedding::set_lookup_gradient`] takes; then
    /// [`PsTrainer::step`] (or `push_gradients`) sends it as for an eager forward.
    pub fn lookup(&self, ids: &Tensor, capacity: usize) -> Result<Lookup> {
        let training = !self.state.eval.load(Ordering::Relaxed);
        let (unique, index, mut values) = self.rows_of("SparseEmbedding::lookup", ids, training)?;
        if unique.len() > capacity {
            return Err(Error::invalid(
                "SparseEmbedding::lookup",
                format!("{} unique ids do not fit a block of {capacity} rows", unique.len()),
            ));
        }
        values.resize(capacity * self.dim, 0.0);
        Ok(Lookup {
            rows: Tensor::from_data(TensorData::from_vec(vec![capacity, self.dim], values).map_err(ps_err)?),
            index: Tensor::from_vec(index, &ids.shape())?,
            ids: unique,
        })
    }

    /// The gradient `[capacity, dim]` a compiled step computed for `lookup`'s rows, to be sent
    /// by the next push (rows past the unique ids are ignored).
    pub fn set_lookup_gradient(&self, lookup: &Lookup, grad: &Tensor) -> Result<()> {
        let (n, dim) = (lookup.ids.len(), self.dim);
        if grad.shape() != lookup.rows.shape() {
            return Err(Error::invalid(
                "SparseEmbedding::set_lookup_gradient",
                format!(
                    "a gradient of shape {:?} for rows of {:?}",
                    grad.shape(),
                    lookup.rows.shape()
                ),
            ));
        }
        let g: Vec<f32> = grad
            .to(&crate::Device::CPU)?
            .try_data()?
            .to_vec::<f32>()
            .map_err(ps_err)?;
        let leaf = Tensor::from_data(TensorData::from_vec(vec![n, dim], vec![0.0; n * dim]).map_err(ps_err)?);
        leaf.set_grad(Some(Tensor::from_data(
            TensorData::from_vec(vec![n, dim], g[..n * dim].to_vec()).map_err(ps_err)?,
        )));
        lock(&self.state.pulled).push((lookup.ids.clone(), leaf));
        Ok(())
    }
}

/// A batch's rows for a compiled step ([`SparseEmbedding::lookup`]).
pub struct Lookup {
    /// `[capacity, dim]`: the unique ids' rows, then zeros.
    pub rows: Tensor,
    /// i64, shaped as the ids: each id's row in `rows`.
    pub index: Tensor,
    ids: Vec<u64>,
}

impl Layer for SparseEmbedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let training = !self.state.eval.load(Ordering::Relaxed);
        let (unique, index, values) = self.rows_of("SparseEmbedding", ids, training)?;
        let data = TensorData::from_vec(vec![unique.len(), self.dim], values).map_err(ps_err)?;
        let rows = Tensor::from_data(data).to(&self.device)?;
        let rows = if training && crate::is_grad_enabled() {
            rows.requires_grad_(true)?
        } else {
            rows
        };
        let index = Tensor::from_vec(index, &ids.shape())?.to(&self.device)?;
        let out = crate::nn::functional::embedding(&index, &rows)?;
        if rows.requires_grad() {
            lock(&self.state.pulled).push((unique, rows));
        }
        Ok(out)
    }

    fn set_training(&mut self, training: bool) {
        self.state.eval.store(!training, Ordering::Relaxed);
    }

    fn is_training(&self) -> bool {
        !self.state.eval.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_are_checked() {
        assert!(Strategy::new(Mode::Sync, 2, 2).is_err());
        assert!(Strategy::new(Mode::Geo { k: 0, lr: 0.1 }, 0, 1).is_err());
        assert!(Strategy::new(Mode::Geo { k: 3, lr: -1.0 }, 0, 1).is_err());
        let s = Strategy::from_mode("geo:4:0.5", 1, 2).unwrap();
        assert_eq!((s.mode, s.trainer), (Mode::Geo { k: 4, lr: 0.5 }, 1));
        let e = Strategy::from_mode("geo:4", 0, 1).unwrap_err().to_string();
        assert!(e.contains("geo:K:LR"), "{e}");
    }
}
