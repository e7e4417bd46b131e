//! `DataParallel`: replicas of one layer on every rank of a group, kept equal by starting from
//! rank 0's state and averaging gradients before each update.

use super::{ProcessGroup, ReduceOp};
use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::tensor::{Tensor, concat};

/// PyTorch's default gradient bucket size.
pub(crate) const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Give every rank of `group` rank 0's parameters and buffers.
pub(crate) fn broadcast_state(layer: &dyn Layer, group: &ProcessGroup) -> Result<()> {
    let _ng = crate::no_grad();
    for (_, t) in layer.state_dict() {
        let synced = group.broadcast(&t, 0)?;
        t.set_data(synced.try_data()?)?;
    }
    Ok(())
}

/// Give each of `params`, in order, its slice of the flat `sums` divided by `ranks` as its
/// gradient.
fn set_averages<'a>(params: impl Iterator<Item = &'a Tensor>, sums: &[f32], ranks: usize) -> Result<()> {
    let scale = 1.0 / ranks as f32;
    let mut offset = 0;
    for p in params {
        let k = p.numel();
        let avg: Vec<f32> = sums[offset..offset + k].iter().map(|x| x * scale).collect();
        let data = oar_ir::TensorData::from_vec(p.shape(), avg)
            .map_err(|e| Error::invalid("sync_gradients", e.to_string()))?;
        p.set_grad(Some(Tensor::from_data(data)));
        offset += k;
    }
    Ok(())
}

/// `params` cut into runs of consecutive same-dtype parameters of about `bucket_bytes` each
/// (at least one parameter per run).
fn buckets(params: &[Tensor], bucket_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < params.len() {
        let dtype = params[start].dtype();
        let (mut end, mut bytes) = (start, 0);
        while end < params.len() && params[end].dtype() == dtype && (end == start || bytes < bucket_bytes) {
            bytes += params[end].numel() * dtype.size_bytes();
            end += 1;
        }
        out.push(start..end);
        start = end;
    }
    out
}

/// Replace each of `params`' gradients by its average over `group`, one all-reduce per bucket
/// of consecutive same-dtype parameters of about `bucket_bytes`; a missing gradient counts as
/// zeros.
pub(crate) fn average_gradients(params: &[Tensor], group: &ProcessGroup, bucket_bytes: usize) -> Result<()> {
    if group.size() == 1 {
        return Ok(());
    }
    let _ng = crate::no_grad();
    if params.iter().any(|p| p.grad().is_some_and(|g| g.is_traced())) {
        return average_traced(params, group, bucket_bytes);
    }
    for range in buckets(params, bucket_bytes) {
        let dtype = params[range.start].dtype();
        let bucket = &params[range];
        if dtype == oar_ir::DType::F32 {
            // The common case without tensor ops: gradients copied once into a send buffer,
            // summed by MPI into a receive buffer (both kept from step to step, so their pages
            // are not faulted in again), scaled into the new gradients.
            thread_local! {
                static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
            }
            SCRATCH.with(|scratch| -> Result<()> {
                let (send, recv) = &mut *scratch.borrow_mut();
                send.clear();
                append_grads(bucket.iter(), send)?;
                recv.resize(send.len(), 0.0);
                group.comm.sum_f32(send, recv)?;
                set_averages(bucket.iter(), recv, group.size())
            })?;
        } else {
            average_bucket_ops(bucket, group)?;
        }
    }
    Ok(())
}

/// [`average_gradients`] while `to_static` traces a training step: each bucket averaged by
/// tensor ops, so the compiled step communicates by itself.
fn average_traced(params: &[Tensor], group: &ProcessGroup, bucket_bytes: usize) -> Result<()> {
    for range in buckets(params, bucket_bytes) {
        average_bucket_ops(&params[range], group)?;
    }
    Ok(())
}

/// Average one bucket's gradients with tensor ops: joined, averaged by an `all_reduce_avg` op
/// (recorded in the graph while tracing, run through MPI eagerly), split back.
fn average_bucket_ops(bucket: &[Tensor], group: &ProcessGroup) -> Result<()> {
    let flat: Vec<Tensor> = bucket
        .iter()
        .map(|p| match p.grad() {
            Some(g) => g.flatten(0, -1),
            None => crate::tensor::zeros(&[p.numel()], p.dtype()),
        })
        .collect::<Result<_>>()?;
    let joined = concat(&flat.iter().collect::<Vec<_>>(), 0)?;
    let avg = super::functional::all_reduce(&joined, ReduceOp::Avg, group)?;
    let mut offset = 0i64;
    for p in bucket {
        let n = p.numel() as i64;
        let shape: Vec<i64> = p.shape().iter().map(|&d| d as i64).collect();
        p.set_grad(Some(avg.slice(0, offset, offset + n, 1)?.reshape(&shape)?));
        offset += n;
    }
    Ok(())
}

/// Append each of `params`' f32 gradients (zeros for a missing one) to `out`.
fn append_grads<'a>(params: impl Iterator<Item = &'a Tensor>, out: &mut Vec<f32>) -> Result<()> {
    for p in params {
        match p.grad() {
            Some(g) => {
                let d = g.try_data()?;
                match bytemuck::try_cast_slice::<u8, f32>(d.bytes()) {
                    Ok(v) => out.extend_from_slice(v),
                    Err(_) => out.extend(
                        d.to_vec::<f32>()
                            .map_err(|e| Error::invalid("sync_gradients", e.to_string()))?,
                    ),
                }
            }
            None => out.resize(out.len() + p.numel(), 0.0),
        }
    }
    Ok(())
}

/// Paddle's `paddle.DataParallel` / PyTorch's `DistributedDataParallel`: `new` copies rank 0's
/// parameters and buffers to every rank; after `backward`, [`sync_gradients`](Self::sync_gradients)
/// replaces each parameter's gradient by its average over the group (in buckets of about
/// `bucket_bytes`, one all-reduce each). N ranks each training on batch B/N then step exactly as
/// one process on batch B does. The wrapper's parameters, state-dict names and `forward` are
/// the layer's.
pub struct DataParallel<L> {
    layer: L,
    group: ProcessGroup,
    bucket_bytes: usize,
    /// Buckets the last [`DataParallel::backward`] handed to the communication thread before
    /// backward finished.
    overlapped: std::cell::Cell<usize>,
}

impl<L: Layer> DataParallel<L> {
    /// Wrap `layer` for `group`, broadcasting rank 0's state (every rank must call it).
    pub fn new(layer: L, group: &ProcessGroup) -> Result<DataParallel<L>> {
        broadcast_state(&layer, group)?;
        Ok(DataParallel {
            layer,
            group: group.clone(),
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            overlapped: std::cell::Cell::new(0),
        })
    }

    /// Gradient buckets of about `bytes` (default 25 MiB, PyTorch's): fewer, larger messages
    /// or more, smaller ones.
    pub fn bucket_bytes(mut self, bytes: usize) -> DataParallel<L> {
        self.bucket_bytes = bytes.max(1);
        self
    }

    /// Average every parameter's gradient over the group (a parameter without a gradient
    /// counts as zeros, so ranks that skipped it stay in step). Call after `backward`, before
    /// the optimizer's `step`; for gradient accumulation, call it only on the step that updates.
    pub fn sync_gradients(&self) -> Result<()> {
        average_gradients(&self.layer.parameters(), &self.group, self.bucket_bytes)
    }

    /// `loss.backward()` with the gradients averaged over the group while it runs (PyTorch's
    /// DDP): the parameters are bucketed in reverse order (about `bucket_bytes` each, the last
    /// layers' gradients are complete first), and each bucket, once backward has completed all
    /// its gradients and the buckets before it are on their way, is summed by a communication
    /// thread while backward goes on through the earlier layers. Buckets whose parameters got
    /// no gradient go after backward, as zeros. The result equals `backward` then
    /// [`DataParallel::sync_gradients`].
    ///
    /// The model's own backward must not communicate (no tensor-parallel layers inside: two
    /// threads would then wait in collectives in orders the ranks may not share); for f64 or
    /// traced gradients it is `backward` then `sync_gradients`.
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        let params = self.layer.parameters();
        self.overlapped.set(0);
        if self.group.size() == 1 {
            return loss.backward();
        }
        if loss.is_traced() || params.iter().any(|p| p.dtype() != oar_ir::DType::F32) {
            loss.backward()?;
            return self.sync_gradients();
        }
        // Buckets over the parameters in reverse order.
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let mut bytes = 0;
        for i in (0..params.len()).rev() {
            if buckets.is_empty() || bytes >= self.bucket_bytes {
                buckets.push(Vec::new());
                bytes = 0;
            }
            buckets.last_mut().expect("pushed above").push(i);
            bytes += params[i].numel() * 4;
        }
        let flat = |params: &[Tensor], bucket: &[usize]| -> Result<Vec<f32>> {
            let mut v = Vec::new();
            append_grads(bucket.iter().map(|&i| &params[i]), &mut v)?;
            Ok(v)
        };
        let nb = buckets.len();
        let comm = self.group.comm.clone();
        let (to_comm, from_main) = std::sync::mpsc::channel::<(usize, Vec<f32>)>();
        let (to_main, from_comm) = std::sync::mpsc::channel::<Result<(usize, Vec<f32>)>>();
        let worker = std::thread::Builder::new()
            .name("oar-ddp-allreduce".into())
            .spawn(move || {
                for (b, send) in from_main {
                    let mut recv = vec![0.0f32; send.len()];
                    let r = comm.sum_f32(&send, &mut recv).map(|()| (b, recv));
                    if to_main.send(r).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| {
                Error::invalid(
                    "DataParallel::backward",
                    format!("cannot start the communication thread: {e}"),
                )
            })?;
        // Which bucket each parameter is in, and what each still waits for.
        struct State {
            params: Vec<Tensor>,
            buckets: Vec<Vec<usize>>,
            slot: std::collections::HashMap<u64, usize>,
            waiting: Vec<usize>,
            next: usize,
            error: Option<Error>,
        }
        let mut slot = std::collections::HashMap::new();
        for (b, bucket) in buckets.iter().enumerate() {
            for &i in bucket {
                slot.insert(params[i].id(), b);
            }
        }
        let state = std::rc::Rc::new(std::cell::RefCell::new(State {
            waiting: buckets.iter().map(Vec::len).collect(),
            params: params.clone(),
            buckets,
            slot,
            next: 0,
            error: None,
        }));
        let hook_state = state.clone();
        let hook_tx = to_comm.clone();
        let hook = move |leaf: &Tensor| {
            let mut st = hook_state.borrow_mut();
            let Some(&b) = st.slot.get(&leaf.id()) else { return };
            st.waiting[b] = st.waiting[b].saturating_sub(1);
            // Buckets go in order, so every rank issues the same sequence of all-reduces.
            while st.next < st.buckets.len() && st.waiting[st.next] == 0 && st.error.is_none() {
                let i = st.next;
                match flat(&st.params, &st.buckets[i]) {
                    Ok(v) => {
                        let _ = hook_tx.send((i, v));
                    }
                    Err(e) => st.error = Some(e),
                }
                st.next += 1;
            }
        };
        let result = crate::autograd::with_grad_hook(hook, || loss.backward());
        let mut st = state.borrow_mut();
        self.overlapped.set(st.next);
        while st.next < nb {
            let i = st.next;
            let v = flat(&st.params, &st.buckets[i])?;
            let _ = to_comm.send((i, v));
            st.next += 1;
        }
        drop(to_comm);
        let mut sums: Vec<Option<Vec<f32>>> = vec![None; nb];
        for _ in 0..nb {
            match from_comm.recv() {
                Ok(Ok((b, v))) => sums[b] = Some(v),
                Ok(Err(e)) => return Err(e),
                Err(_) => break,
            }
        }
        let _ = worker.join();
        result?;
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        for (b, bucket) in st.buckets.iter().enumerate() {
            let sum = sums[b]
                .take()
                .ok_or_else(|| Error::invalid("DataParallel::backward", "the communication thread stopped"))?;
            set_averages(bucket.iter().map(|&i| &st.params[i]), &sum, self.group.size())?;
        }
        Ok(())
    }

    /// How many gradient buckets the last [`DataParallel::backward`] started reducing before
    /// backward had finished.
    pub fn overlapped_buckets(&self) -> usize {
        self.overlapped.get()
    }

    /// The group the replicas live in.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// The wrapped layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }

    /// The wrapped layer, mutably.
    pub fn layer_mut(&mut self) -> &mut L {
        &mut self.layer
    }

    /// Unwrap.
    pub fn into_inner(self) -> L {
        self.layer
    }
}

impl<L: Layer> Layer for DataParallel<L> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.layer.forward(x)
    }
    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        self.layer.own_parameters()
    }
    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        self.layer.own_buffers()
    }
    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        self.layer.sublayers()
    }
    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        self.layer.sublayers_mut()
    }
    fn set_training(&mut self, training: bool) {
        self.layer.set_training(training)
    }
    fn is_training(&self) -> bool {
        self.layer.is_training()
    }
}
