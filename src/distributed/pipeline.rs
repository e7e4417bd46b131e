//! Pipeline parallelism (Paddle's `PipelineLayer` / `PipelineParallel`, GPipe and PipeDream's
//! 1F1B): a model given as a list of layer descriptions is cut into consecutive stages, one
//! per rank of a group; a batch is split into micro-batches whose activations flow forward
//! from stage to stage and whose gradients flow back.
//!
//! - [`Schedule::OneFOneB`] (the default): each stage runs `stages − stage − 1` forwards to
//!   fill the pipeline, then alternates one forward and one backward, then drains. A stage holds
//!   at most `stages − stage` micro-batches' activations, whatever the number of
//!   micro-batches. Neighbours exchange an activation and a gradient in one `MPI_Sendrecv`, so
//!   blocking transfers never wait on each other (Megatron-LM's schedule).
//! - [`Schedule::GPipe`]: every forward, then every backward; activations of all micro-batches
//!   are held at once.
//!
//! Each micro-batch's loss is divided by the number of micro-batches, so with a mean loss the
//! accumulated gradients are the whole batch's; [`PipelineLayer::train_batch`] then steps the
//! stage's optimizer. The sharded model equals the whole one: every rank builds every layer in
//! order (drawing the same random numbers as a single process would) and keeps its stage's.

use super::ProcessGroup;
use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::optimizer::Optimizer;
use crate::tensor::Tensor;
use oar_ir::DType;
use std::cell::Cell;
use std::collections::VecDeque;

/// How a layer of the pipeline is made (Paddle's `LayerDesc`): built once on every rank, in
/// order, and kept by the stage that runs it.
pub struct LayerDesc(Box<dyn FnOnce() -> Result<Box<dyn Layer>>>);

impl LayerDesc {
    /// The layer `make` builds.
    pub fn new<L: Layer + 'static>(make: impl FnOnce() -> Result<L> + 'static) -> LayerDesc {
        LayerDesc(Box::new(move || Ok(Box::new(make()?) as Box<dyn Layer>)))
    }
}

/// The order of micro-batch forwards and backwards (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// One forward, one backward (PipeDream-Flush / Megatron): activations of at most
    /// `stages − stage` micro-batches in flight.
    #[default]
    OneFOneB,
    /// All forwards, then all backwards: every micro-batch's activations in flight.
    GPipe,
}

/// Activations' dtypes as the first message of a stage boundary states them.
const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::I32, DType::I64];
/// Dims a boundary's activation may have.
const MAX_RANK: usize = 8;

/// One micro-batch between its forward and its backward on this stage.
struct InFlight {
    /// The activation received from the previous stage (a leaf taking the gradient to send
    /// back); `None` on the first stage.
    input: Option<Tensor>,
    /// The activation sent on, or on the last stage the micro-batch's (scaled) loss.
    output: Tensor,
}

/// This rank's stage of a model cut into consecutive stages over `group` (rank `r` runs stage
/// `r`). As a [`Layer`] it is the stage's layers in sequence, named by their index in the whole
/// model (so state dicts of stages merge into the whole model's).
pub struct PipelineLayer {
    layers: Vec<(usize, Box<dyn Layer>)>,
    group: ProcessGroup,
    schedule: Schedule,
    bounds: Vec<usize>,
    max_in_flight: Cell<usize>,
    /// The data-parallel group whose replicas of this stage average their gradients.
    dp: Option<ProcessGroup>,
}

impl PipelineLayer {
    /// Build every layer of `descs` in order and keep this rank's stage: the layers split into
    /// `group.size()` runs of consecutive layers, as equal in count as they can be.
    pub fn new(descs: Vec<LayerDesc>, group: &ProcessGroup) -> Result<PipelineLayer> {
        let (n, stages) = (descs.len(), group.size());
        if n < stages {
            return Err(Error::invalid(
                "PipelineLayer",
                format!("{n} layers cannot fill {stages} stages (one or more layers each)"),
            ));
        }
        // Stage s runs layers bounds[s] .. bounds[s + 1]; the first `n % stages` get one more.
        let mut bounds = vec![0];
        for s in 0..stages {
            bounds.push(bounds[s] + n / stages + usize::from(s < n % stages));
        }
        let stage = group.rank();
        let mut layers = Vec::new();
        for (i, d) in descs.into_iter().enumerate() {
            let layer = (d.0)()?;
            if (bounds[stage]..bounds[stage + 1]).contains(&i) {
                layers.push((i, layer));
            }
        }
        Ok(PipelineLayer {
            layers,
            group: group.clone(),
            schedule: Schedule::default(),
            bounds,
            max_in_flight: Cell::new(0),
            dp: None,
        })
    }

    /// Replicate this stage over the data-parallel group `dp` (hybrid parallelism): its
    /// parameters and buffers now are `dp` rank 0's, and every `train_batch` averages the
    /// gradients over `dp` before the update. Give each replica its share of the batch.
    pub fn data_parallel(mut self, dp: &ProcessGroup) -> Result<PipelineLayer> {
        super::data_parallel::broadcast_state(&self, dp)?;
        self.dp = Some(dp.clone());
        Ok(self)
    }

    /// Run micro-batches in `schedule`'s order.
    pub fn schedule(mut self, schedule: Schedule) -> PipelineLayer {
        self.schedule = schedule;
        self
    }

    /// This rank's stage (its rank in the group).
    pub fn stage(&self) -> usize {
        self.group.rank()
    }

    /// The number of stages (the group's size).
    pub fn num_stages(&self) -> usize {
        self.group.size()
    }

    /// The layers stage `s` runs, as indices into the whole model's list.
    pub fn stage_layers(&self, s: usize) -> std::ops::Range<usize> {
        self.bounds[s]..self.bounds[s + 1]
    }

    /// The most micro-batches whose activations this stage held at once in the last
    /// [`PipelineLayer::train_batch`].
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.get()
    }

    fn first(&self) -> bool {
        self.stage() == 0
    }

    fn last(&self) -> bool {
        self.stage() + 1 == self.num_stages()
    }

    /// One training step on a batch: `x` and `labels` (the whole batch on every rank; the
    /// first stage reads `x`, the last `labels`) split along axis 0 into `micro_batches`
    /// micro-batches, run through the pipeline in the schedule's order with `loss` on the last
    /// stage, gradients accumulated, then `optimizer` (over this stage's parameters) steps
    /// and its gradients are cleared. Returns the batch's loss (the mean of the micro-batches'
    /// losses, averaged over the data-parallel replicas if any) on every stage.
    pub fn train_batch(
        &self,
        x: &Tensor,
        labels: &Tensor,
        micro_batches: usize,
        loss: impl Fn(&Tensor, &Tensor) -> Result<Tensor>,
        optimizer: &mut dyn Optimizer,
    ) -> Result<f64> {
        let m = micro_batches;
        let n = x.shape().first().copied().unwrap_or(0);
        if m == 0 || n % m != 0 || labels.shape().first() != Some(&n) {
            return Err(Error::invalid(
                "PipelineLayer::train_batch",
                format!(
                    "a batch of {} inputs and {} labels does not split into {m} equal micro-batches",
                    x.tensor_type(),
                    labels.tensor_type()
                ),
            ));
        }
        let k = (n / m) as i64;
        let part = |t: &Tensor, i: usize| t.slice(0, i as i64 * k, (i as i64 + 1) * k, 1);
        let mut run = Run {
            pipe: self,
            boundary_in: None,
            sent_meta: false,
        };
        let loss_sum = Cell::new(0.0);
        let forward = |i: usize, input: Option<Tensor>| -> Result<InFlight> {
            let h = match &input {
                Some(a) => self.forward(a)?,
                None if self.first() => self.forward(&part(x, i)?)?,
                None => {
                    return Err(Error::invalid(
                        "PipelineLayer::train_batch",
                        "no activation from the previous stage",
                    ));
                }
            };
            let output = if self.last() {
                let l = loss(&h, &part(labels, i)?)?.binary_scalar(oar_ir::ops::BinaryOp::Div, m as f64)?;
                loss_sum.set(loss_sum.get() + l.item()?);
                l
            } else {
                h
            };
            Ok(InFlight { input, output })
        };
        let mut queue: VecDeque<InFlight> = VecDeque::new();
        let mut most = 0;
        match self.schedule {
            Schedule::GPipe => {
                for i in 0..m {
                    let a = run.recv_forward()?;
                    let f = forward(i, a)?;
                    run.send_forward(&f.output)?;
                    queue.push_back(f);
                    most = most.max(queue.len());
                }
                while let Some(f) = queue.pop_front() {
                    let g = run.recv_backward(&f.output)?;
                    let dx = backward(f, g)?;
                    run.send_backward(dx)?;
                }
            }
            Schedule::OneFOneB => {
                let warm = (self.num_stages() - self.stage() - 1).min(m);
                for i in 0..warm {
                    let a = run.recv_forward()?;
                    let f = forward(i, a)?;
                    run.send_forward(&f.output)?;
                    queue.push_back(f);
                    most = most.max(queue.len());
                }
                let steady = m - warm;
                let mut a = if steady > 0 { run.recv_forward()? } else { None };
                for j in 0..steady {
                    let f = forward(warm + j, a.take())?;
                    let g = run.send_forward_recv_backward(&f.output)?;
                    queue.push_back(f);
                    most = most.max(queue.len());
                    let Some(oldest) = queue.pop_front() else { break };
                    let dx = backward(oldest, g)?;
                    if j + 1 == steady {
                        run.send_backward(dx)?;
                    } else {
                        a = run.send_backward_recv_forward(dx)?;
                    }
                }
                while let Some(f) = queue.pop_front() {
                    let g = run.recv_backward(&f.output)?;
                    let dx = backward(f, g)?;
                    run.send_backward(dx)?;
                }
            }
        }
        self.max_in_flight.set(most);
        let mut loss_sum = loss_sum.get();
        if let Some(dp) = &self.dp {
            super::data_parallel::average_gradients(
                &self.parameters(),
                dp,
                super::data_parallel::DEFAULT_BUCKET_BYTES,
            )?;
            // The replicas' losses, averaged like their gradients.
            if dp.size() > 1 {
                let all = dp.all_reduce(&Tensor::from_vec(vec![loss_sum], &[1])?, super::ReduceOp::Avg)?;
                loss_sum = all.to_vec::<f64>()?[0];
            }
        }
        optimizer.step()?;
        optimizer.clear_grad();
        // The loss lives on the last stage; every stage returns it.
        let last = self.num_stages() - 1;
        let l = self.group.broadcast(&Tensor::from_vec(vec![loss_sum], &[1])?, last)?;
        Ok(l.to_vec::<f64>()?[0])
    }
}

/// Backpropagate one micro-batch: its loss (last stage) or its output with the gradient `g`
/// from the next stage; the gradient of its input, for the previous stage.
fn backward(f: InFlight, g: Option<Tensor>) -> Result<Option<Tensor>> {
    match g {
        Some(g) => f.output.backward_with(Some(&g), false)?,
        None => f.output.backward()?,
    }
    Ok(match f.input {
        Some(a) => Some(match a.grad() {
            Some(g) => g,
            None => crate::tensor::zeros(&a.shape(), a.dtype())?,
        }),
        None => None,
    })
}

/// One `train_batch`'s transfers: what crosses this stage's two boundaries.
struct Run<'a> {
    pipe: &'a PipelineLayer,
    /// The activations' type at the boundary with the previous stage, once its first message
    /// said it.
    boundary_in: Option<(Vec<usize>, DType)>,
    sent_meta: bool,
}

impl Run<'_> {
    fn prev(&self) -> usize {
        self.pipe.stage() - 1
    }

    fn next(&self) -> usize {
        self.pipe.stage() + 1
    }

    /// Before the first activation: its dtype and shape, so the next stage can receive it.
    fn send_meta(&mut self, y: &Tensor) -> Result<()> {
        if self.sent_meta {
            return Ok(());
        }
        let shape = y.shape();
        let code = DTYPES.iter().position(|&d| d == y.dtype());
        let (Some(code), true) = (code, shape.len() <= MAX_RANK) else {
            return Err(Error::invalid(
                "PipelineLayer",
                format!(
                    "stage {} sends {}: activations between stages must be f32, f64, i32 or i64 with at most {MAX_RANK} dims",
                    self.pipe.stage(),
                    y.tensor_type()
                ),
            ));
        };
        let mut meta = vec![-1i64; MAX_RANK + 2];
        meta[0] = shape.len() as i64;
        meta[1] = code as i64;
        for (i, &d) in shape.iter().enumerate() {
            meta[2 + i] = d as i64;
        }
        self.pipe
            .group
            .send(&Tensor::from_vec(meta, &[MAX_RANK + 2])?, self.next())?;
        self.sent_meta = true;
        Ok(())
    }

    /// A received activation (a fresh tensor) as a leaf that takes its gradient.
    fn leaf(t: Tensor) -> Result<Tensor> {
        if t.dtype().is_float() {
            t.requires_grad_(true)
        } else {
            Ok(t)
        }
    }

    /// The next activation from the previous stage (`None` on the first stage).
    fn recv_forward(&mut self) -> Result<Option<Tensor>> {
        if self.pipe.first() {
            return Ok(None);
        }
        let (shape, dtype) = match &self.boundary_in {
            Some(b) => b.clone(),
            None => {
                let meta = self.pipe.group.recv(&[MAX_RANK + 2], DType::I64, self.prev())?;
                let meta = meta.to_vec::<i64>()?;
                let rank = usize::try_from(meta[0]).unwrap_or(usize::MAX).min(MAX_RANK);
                let dtype = usize::try_from(meta[1])
                    .ok()
                    .and_then(|c| DTYPES.get(c).copied())
                    .ok_or_else(|| Error::invalid("PipelineLayer", format!("bad activation header {meta:?}")))?;
                let shape: Vec<usize> = meta[2..2 + rank].iter().map(|&d| d.max(0) as usize).collect();
                self.boundary_in = Some((shape.clone(), dtype));
                (shape, dtype)
            }
        };
        let a = self.pipe.group.recv(&shape, dtype, self.prev())?;
        Ok(Some(Self::leaf(a)?))
    }

    /// Send an activation on (nothing from the last stage).
    fn send_forward(&mut self, y: &Tensor) -> Result<()> {
        if self.pipe.last() {
            return Ok(());
        }
        self.send_meta(y)?;
        self.pipe.group.send(&y.detach(), self.next())
    }

    /// The gradient of `output` from the next stage (`None` on the last stage).
    fn recv_backward(&mut self, output: &Tensor) -> Result<Option<Tensor>> {
        if self.pipe.last() {
            return Ok(None);
        }
        let g = self.pipe.group.recv(&output.shape(), output.dtype(), self.next())?;
        Ok(Some(g))
    }

    /// Send an input gradient back (nothing from the first stage).
    fn send_backward(&mut self, dx: Option<Tensor>) -> Result<()> {
        match dx {
            Some(dx) if !self.pipe.first() => self.pipe.group.send(&dx.detach(), self.prev()),
            _ => Ok(()),
        }
    }

    /// Send an activation on and receive the gradient of the oldest output in flight, in one
    /// exchange with the next stage.
    fn send_forward_recv_backward(&mut self, y: &Tensor) -> Result<Option<Tensor>> {
        if self.pipe.last() {
            return Ok(None);
        }
        self.send_meta(y)?;
        let shape = y.shape();
        Ok(Some(self.pipe.group.send_recv(
            &y.detach(),
            self.next(),
            &shape,
            self.next(),
        )?))
    }

    /// Send an input gradient back and receive the next activation, in one exchange with the
    /// previous stage (`None` on the first stage, which reads its input itself).
    fn send_backward_recv_forward(&mut self, dx: Option<Tensor>) -> Result<Option<Tensor>> {
        if self.pipe.first() {
            return Ok(None);
        }
        let dx = dx.ok_or_else(|| Error::invalid("PipelineLayer", "no input gradient to send back"))?;
        let (shape, _) = self
            .boundary_in
            .clone()
            .ok_or_else(|| Error::invalid("PipelineLayer", "no activation received yet"))?;
        let a = self
            .pipe
            .group
            .send_recv(&dx.detach(), self.prev(), &shape, self.prev())?;
        Ok(Some(Self::leaf(a)?))
    }
}

impl Layer for PipelineLayer {
    /// This stage's layers in sequence.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (_, l) in &self.layers {
            h = l.forward(&h)?;
        }
        Ok(h)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        self.layers.iter().map(|(i, l)| (i.to_string(), l.as_ref())).collect()
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        self.layers
            .iter_mut()
            .map(|(i, l)| (i.to_string(), l.as_mut() as &mut dyn Layer))
            .collect()
    }
}
