//! `DataLoader`: batches of a [`Dataset`], optionally shuffled, optionally loaded by worker threads.
//!
//! Workers split the epoch's batches round-robin (worker `w` loads batches `w, w + k, ...`) and
//! each hands its results over its own bounded channel; the iterator reads the channels in the
//! same round-robin order. So batches arrive in exactly the order a single thread would produce
//! them, whatever the worker count, while up to `prefetch_factor` batches per worker load ahead.
//!
//! A loader with a [`seed`](DataLoader::seed) also pins what happens inside each sample: every
//! random draw while a sample loads (random transforms, `oar::rand`) comes from a generator
//! seeded by the loader's seed, the epoch and the sample index, so augmented batches are the
//! same for any worker count and a resumed run sees the same ones.

use super::collate::Collate;
use super::dataset::Dataset;
use crate::error::{Error, Result};
use crate::tensor::{with_rng, with_sample_rng};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A function that turns a list of samples into a batch.
pub type CollateFn<T, B> = dyn Fn(Vec<T>) -> Result<B> + Send + Sync;

/// Iterates over a dataset in batches (Paddle `paddle.io.DataLoader`); each [`iter`](Self::iter)
/// call is one epoch.
pub struct DataLoader<D: Dataset, B> {
    dataset: Arc<D>,
    collate: Arc<CollateFn<D::Item, B>>,
    batch_size: usize,
    shuffle: bool,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    /// The loader's own generator once [`seed`](Self::seed) is called; otherwise shuffling
    /// draws from the global generator (`oar::seed`).
    generator: Option<Mutex<StdRng>>,
    /// The seed given to [`seed`](Self::seed): per-sample generators derive from it.
    seed: Option<u64>,
    /// Epochs started (orders drawn) so far.
    epochs: AtomicUsize,
    /// `(rank, world)`: load only this rank's share of each epoch (`shard`).
    shard: Option<(usize, usize)>,
}

impl<D: Dataset + 'static> DataLoader<D, <D::Item as Collate>::Batch>
where
    D::Item: Collate,
    <D::Item as Collate>::Batch: Send + 'static,
{
    /// A loader with Paddle's defaults: batch size 1, no shuffling, keep the last partial batch,
    /// no workers, default collation.
    pub fn new(dataset: D) -> Self {
        DataLoader::with_collate(dataset, <D::Item as Collate>::collate)
    }
}

impl<D: Dataset + 'static, B: Send + 'static> DataLoader<D, B> {
    /// A loader whose batches are made by `collate` (for samples without a [`Collate`] impl).
    pub fn with_collate(dataset: D, collate: impl Fn(Vec<D::Item>) -> Result<B> + Send + Sync + 'static) -> Self {
        DataLoader {
            dataset: Arc::new(dataset),
            collate: Arc::new(collate),
            batch_size: 1,
            shuffle: false,
            drop_last: false,
            num_workers: 0,
            prefetch_factor: 2,
            generator: None,
            seed: None,
            epochs: AtomicUsize::new(0),
            shard: None,
        }
    }

    /// Samples per batch (must be ≥ 1; checked when iterating).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Visit samples in a new random order every epoch.
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }

    /// Give the loader its own generator: the sequence of epoch orders is then fixed by `seed`,
    /// and so are the random draws made while each sample loads (see the module docs).
    pub fn seed(mut self, seed: u64) -> Self {
        self.generator = Some(Mutex::new(StdRng::seed_from_u64(seed)));
        self.seed = Some(seed);
        self
    }

    /// Load only rank `rank`'s share of each epoch, for data-parallel training over `world`
    /// ranks (PyTorch's `DistributedSampler`, Paddle's `DistributedBatchSampler`): the epoch's
    /// order (the same on every rank: give every rank the same [`seed`](Self::seed)) is padded
    /// by repeating its start to a multiple of `world`, and rank `r` takes positions `r`,
    /// `r + world`, …. With batch size `B / world` per rank, batch `j` of all ranks together
    /// is batch `j` of one process at batch size `B`. `rank` must be below `world`.
    pub fn shard(mut self, rank: usize, world: usize) -> Self {
        self.shard = Some((rank, world));
        self
    }

    /// Drop the last batch if it is smaller than the batch size.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }

    /// Load batches on `k` threads (0: in the iterating thread). The batches are the same for any `k`.
    pub fn num_workers(mut self, k: usize) -> Self {
        self.num_workers = k;
        self
    }

    /// Batches each worker may load ahead of the consumer (default 2, at least 1).
    pub fn prefetch_factor(mut self, n: usize) -> Self {
        self.prefetch_factor = n.max(1);
        self
    }

    /// Replace the collation function (Paddle's `collate_fn`).
    pub fn collate_fn<B2: Send + 'static>(
        self,
        f: impl Fn(Vec<D::Item>) -> Result<B2> + Send + Sync + 'static,
    ) -> DataLoader<D, B2> {
        DataLoader {
            dataset: self.dataset,
            collate: Arc::new(f),
            batch_size: self.batch_size,
            shuffle: self.shuffle,
            drop_last: self.drop_last,
            num_workers: self.num_workers,
            prefetch_factor: self.prefetch_factor,
            generator: self.generator,
            seed: self.seed,
            epochs: self.epochs,
            shard: self.shard,
        }
    }

    /// The dataset being loaded.
    pub fn dataset(&self) -> &D {
        &self.dataset
    }

    /// Batches per epoch.
    pub fn len(&self) -> usize {
        let n = match self.shard {
            Some((_, world)) if world > 0 => self.dataset.len().div_ceil(world),
            _ => self.dataset.len(),
        };
        match self.batch_size {
            0 => 0,
            bs if self.drop_last => n / bs,
            bs => n.div_ceil(bs),
        }
    }

    /// True if an epoch yields no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Epochs started so far (each [`iter`](Self::iter) starts one).
    pub fn epochs_started(&self) -> usize {
        self.epochs.load(Ordering::Relaxed)
    }

    /// Draw (and drop) the orders of the epochs before `epoch` that this loader has not
    /// started, so that its next epoch is the one a loader that never stopped would give: with
    /// [`seed`](Self::seed), a resumed training run sees the same batches (`Model::fit` calls
    /// it with the epochs the model has trained). Loaders drawing from the global generator,
    /// or not shuffling, only count.
    pub fn skip_to_epoch(&self, epoch: usize) {
        while self.epochs_started() < epoch {
            if self.shuffle && self.generator.is_some() {
                self.order();
            }
            self.epochs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The sample order of one epoch (advances the shuffling generator), this rank's share of
    /// it when sharded.
    fn order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.dataset.len()).collect();
        if self.shuffle {
            match &self.generator {
                Some(g) => order.shuffle(&mut *g.lock().unwrap_or_else(|e| e.into_inner())),
                None => with_rng(|r| order.shuffle(r)),
            }
        }
        match self.shard {
            Some((rank, world)) if world > 0 && !order.is_empty() => {
                let padded = order.len().div_ceil(world) * world;
                (0..padded)
                    .skip(rank)
                    .step_by(world)
                    .map(|i| order[i % order.len()])
                    .collect()
            }
            _ => order,
        }
    }

    /// The sample indices of each batch for one epoch (advances the shuffling generator), and
    /// the epoch's number.
    fn epoch_batches(&self) -> (Vec<Vec<usize>>, usize) {
        let epoch = self.epochs.fetch_add(1, Ordering::Relaxed);
        let order = self.order();
        let mut batches: Vec<Vec<usize>> = order.chunks(self.batch_size).map(<[usize]>::to_vec).collect();
        if self.drop_last && batches.last().is_some_and(|b| b.len() < self.batch_size) {
            batches.pop();
        }
        (batches, epoch)
    }

    /// Start one epoch: an iterator over `Result<batch>`.
    pub fn iter(&self) -> DataLoaderIter<D, B> {
        let mut it = DataLoaderIter {
            dataset: self.dataset.clone(),
            collate: self.collate.clone(),
            batches: Arc::new(Vec::new()),
            epoch_seed: None,
            next: 0,
            workers: None,
            pending_error: None,
        };
        if self.batch_size == 0 {
            it.pending_error = Some(Error::invalid("DataLoader", "batch_size must be at least 1"));
            return it;
        }
        if let Some((rank, world)) = self.shard
            && rank >= world
        {
            it.pending_error = Some(Error::invalid(
                "DataLoader",
                format!("shard: rank {rank} is not below the world size {world}"),
            ));
            return it;
        }
        let (batches, epoch) = self.epoch_batches();
        it.batches = Arc::new(batches);
        it.epoch_seed = self.seed.map(|s| mix(s, epoch as u64));
        let k = self.num_workers.min(it.batches.len());
        if k > 0 {
            it.workers = Some(Workers::spawn(
                k,
                self.prefetch_factor,
                &it.dataset,
                &it.collate,
                &it.batches,
                it.epoch_seed,
            ));
        }
        it
    }
}

impl<D: Dataset + 'static, B: Send + 'static> IntoIterator for &DataLoader<D, B> {
    type Item = Result<B>;
    type IntoIter = DataLoaderIter<D, B>;
    fn into_iter(self) -> DataLoaderIter<D, B> {
        self.iter()
    }
}

/// SplitMix64's finalizer over `a` and `b`: seeds for an epoch and for a sample in it.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b
        .wrapping_add(0x9e37_79b9_7f4a_7c15)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fetch the samples of one batch and collate them; with an epoch seed, each sample loads
/// under its own generator (seeded by the epoch seed and the sample index).
fn load_batch<D: Dataset, B>(
    dataset: &D,
    collate: &CollateFn<D::Item, B>,
    indices: &[usize],
    epoch_seed: Option<u64>,
) -> Result<B> {
    let samples = indices
        .iter()
        .map(|&i| match epoch_seed {
            Some(s) => with_sample_rng(mix(s, i as u64), || dataset.get(i)),
            None => dataset.get(i),
        })
        .collect::<Result<Vec<_>>>()?;
    collate(samples)
}

/// Worker threads for one epoch, each with its own bounded channel.
struct Workers<B> {
    receivers: Vec<Receiver<Result<B>>>,
    handles: Vec<JoinHandle<()>>,
}

impl<B: Send + 'static> Workers<B> {
    fn spawn<D: Dataset + 'static>(
        k: usize,
        prefetch: usize,
        dataset: &Arc<D>,
        collate: &Arc<CollateFn<D::Item, B>>,
        batches: &Arc<Vec<Vec<usize>>>,
        epoch_seed: Option<u64>,
    ) -> Workers<B> {
        let mut receivers = Vec::with_capacity(k);
        let mut handles = Vec::with_capacity(k);
        for w in 0..k {
            let (tx, rx): (SyncSender<Result<B>>, _) = sync_channel(prefetch);
            let (dataset, collate, batches) = (dataset.clone(), collate.clone(), batches.clone());
            handles.push(std::thread::spawn(move || {
                for indices in batches.iter().skip(w).step_by(k) {
                    // A closed channel means the iterator was dropped: stop quietly.
                    if tx.send(load_batch(&*dataset, &*collate, indices, epoch_seed)).is_err() {
                        break;
                    }
                }
            }));
            receivers.push(rx);
        }
        Workers { receivers, handles }
    }
}

impl<B> Drop for Workers<B> {
    fn drop(&mut self) {
        // Closing the channels first unblocks workers waiting to hand over a prefetched batch.
        self.receivers.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// One epoch of a [`DataLoader`]: yields `Result<batch>` in order.
pub struct DataLoaderIter<D: Dataset, B> {
    dataset: Arc<D>,
    collate: Arc<CollateFn<D::Item, B>>,
    batches: Arc<Vec<Vec<usize>>>,
    /// Per-sample generators derive from it (a seeded loader only).
    epoch_seed: Option<u64>,
    next: usize,
    workers: Option<Workers<B>>,
    /// A configuration error, reported by the first `next()`.
    pending_error: Option<Error>,
}

impl<D: Dataset, B> Iterator for DataLoaderIter<D, B> {
    type Item = Result<B>;

    fn next(&mut self) -> Option<Result<B>> {
        if let Some(e) = self.pending_error.take() {
            return Some(Err(e));
        }
        let j = self.next;
        let indices = self.batches.get(j)?;
        self.next += 1;
        let Some(workers) = &self.workers else {
            return Some(load_batch(&*self.dataset, &*self.collate, indices, self.epoch_seed));
        };
        let k = workers.receivers.len();
        match workers.receivers[j % k].recv() {
            Ok(batch) => Some(batch),
            Err(_) => {
                // The worker died (a panic in the dataset or collate function): end the epoch.
                self.next = self.batches.len();
                Some(Err(Error::invalid(
                    "DataLoader",
                    format!("worker {} stopped before delivering batch {j} (it panicked)", j % k),
                )))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.batches.len() - self.next + usize::from(self.pending_error.is_some());
        (left, Some(left))
    }
}

impl<D: Dataset, B> ExactSizeIterator for DataLoaderIter<D, B> {}
