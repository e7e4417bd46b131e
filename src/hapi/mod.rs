//! The high-level API, as Paddle's `paddle.Model`: wrap a network, `prepare` it with an
//! optimizer, a loss and metrics, then `fit`, `evaluate`, `predict`, `save` and `load` —
//! training in a few lines, while the low-level API stays usable inside (`train_batch` is one
//! step; the network, the optimizer and the loss are ordinary values).
//!
//! ```no_run
//! use oar::io::{DataLoader, datasets::{Digits, Split}};
//! use oar::metric::Accuracy;
//! use oar::nn::functional::{cross_entropy, Reduction};
//! use oar::nn::{Flatten, Layer, Linear, ReLU, Sequential};
//! use oar::optimizer::Adam;
//! # fn main() -> oar::Result<()> {
//! let net = Sequential::new()
//!     .add(Flatten::new(1, -1))
//!     .add(Linear::new(64, 32)?)
//!     .add(ReLU::new())
//!     .add(Linear::new(32, 10)?);
//! let opt = Adam::new(net.named_parameters(), 1e-2);
//! let mut model = oar::Model::new(net);
//! model.prepare(opt, |y, t| cross_entropy(y, t, Reduction::Mean), vec![Box::new(Accuracy::new())]);
//! let train = DataLoader::new(Digits::new(Split::Train)?).batch_size(64).shuffle(true).seed(7);
//! let test = DataLoader::new(Digits::new(Split::Test)?).batch_size(256);
//! let history = model.fit(&train, Some(&test), 5)?;
//! println!("{:?}", history.last());
//! # Ok(()) }
//! ```

pub mod callbacks;

pub use callbacks::{Callback, Control};

use crate::amp::{AmpConfig, GradScaler};
use crate::error::{Error, Result};
use crate::io::{DataLoader, Dataset};
use crate::jit::{InputSpec, StaticFunction};
use crate::metric::Metric;
use crate::nn::Layer;
use crate::optimizer::Optimizer;
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData};
use std::collections::BTreeMap;
use std::path::Path;

/// A loss: `loss(output, label)` → a scalar tensor.
pub type LossFn = Box<dyn Fn(&Tensor, &Tensor) -> Result<Tensor>>;

/// A custom training step ([`Model::custom_step`]): given the model's parts and a batch, do
/// forward, loss, backward and the update, and return the loss and the network's output.
pub type StepFn = Box<dyn FnMut(&mut StepContext<'_>, &Tensor, &Tensor) -> Result<(Tensor, Tensor)>>;

/// What a custom training step works with: the network, the loss, the optimizer, the loss
/// scaler and the AMP configuration the model was given.
pub struct StepContext<'a> {
    network: &'a dyn Layer,
    loss: &'a LossFn,
    optimizer: &'a mut dyn Optimizer,
    scaler: Option<&'a mut GradScaler>,
    amp: Option<&'a AmpConfig>,
    group: Option<&'a crate::distributed::ProcessGroup>,
}

impl StepContext<'_> {
    /// The network (in training mode).
    pub fn network(&self) -> &dyn Layer {
        self.network
    }

    /// The loss given to [`Model::prepare`].
    pub fn loss(&self, output: &Tensor, label: &Tensor) -> Result<Tensor> {
        (self.loss)(output, label)
    }

    /// The optimizer given to [`Model::prepare`].
    pub fn optimizer(&mut self) -> &mut dyn Optimizer {
        &mut *self.optimizer
    }

    /// The loss scaler given to [`Model::amp`], if any.
    pub fn scaler(&mut self) -> Option<&mut GradScaler> {
        self.scaler.as_deref_mut()
    }

    /// An AMP scope for the forward pass and the loss when the model has an AMP configuration
    /// (hold the guard while they run, drop it before backward); `None` otherwise.
    pub fn autocast(&self) -> Option<crate::amp::AutoCastGuard> {
        self.amp.cloned().map(crate::amp::auto_cast_with)
    }

    /// Average the gradients over the data-parallel group ([`Model::data_parallel`]; nothing
    /// without one): call between backward and the update in a custom step.
    pub fn sync_gradients(&self) -> Result<()> {
        average_over(self.network, self.group)
    }

    /// The step [`Model`] runs without a custom one: forward and loss (in the AMP scope),
    /// backward (of the scaled loss with a scaler), gradients averaged over the data-parallel
    /// group if any, the update, gradients cleared; the loss and the output, detached.
    pub fn default_step(&mut self, x: &Tensor, label: &Tensor) -> Result<(Tensor, Tensor)> {
        let (network, group) = (self.network, self.group);
        let sync = || average_over(network, group);
        let (out, l) = {
            let _amp = self.autocast();
            let out = self.network.forward(x)?;
            let l = (self.loss)(&out, label)?;
            (out, l)
        };
        match self.scaler.as_deref_mut() {
            Some(s) => {
                s.scale(&l)?.backward()?;
                sync()?;
                s.step(&mut *self.optimizer)?;
                s.update()?;
            }
            None => {
                l.backward()?;
                sync()?;
                self.optimizer.step()?;
            }
        }
        self.optimizer.clear_grad();
        Ok((l.detach(), out.detach()))
    }
}

/// One epoch's results: the mean loss over its samples and each metric's accumulated values,
/// by name (`loss`, `acc_top1`, …), for training and (when given) evaluation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpochLogs {
    /// The epoch (0-based, counting every epoch this model has trained, loads included).
    pub epoch: usize,
    /// Training values.
    pub train: BTreeMap<String, f64>,
    /// Evaluation values (empty without evaluation data).
    pub eval: BTreeMap<String, f64>,
}

/// A network with what training needs: an optimizer, a loss and metrics.
pub struct Model {
    network: Box<dyn Layer>,
    optimizer: Option<Box<dyn Optimizer>>,
    loss: Option<LossFn>,
    metrics: Vec<Box<dyn Metric>>,
    /// Epochs trained so far.
    epoch: usize,
    /// Show a progress bar while fitting (drawn only on a terminal).
    verbose: bool,
    /// Run training steps as traced, compiled graphs.
    to_static: bool,
    /// The compiled training step and the per-sample shapes and dtypes it was traced for.
    compiled: Option<(BatchKey, StaticFunction)>,
    /// Automatic mixed precision for the forward pass and the loss.
    amp: Option<AmpConfig>,
    /// Dynamic loss scaling.
    scaler: Option<GradScaler>,
    /// A training step that replaces the standard one.
    custom_step: Option<StepFn>,
    /// Data-parallel training: the group whose ranks average gradients and logs.
    group: Option<crate::distributed::ProcessGroup>,
}

/// The per-sample shapes (all but the batch dim) and dtypes of a batch's input and label.
type BatchKey = (Vec<usize>, DType, Vec<usize>, DType);

impl Model {
    /// Wrap `network` (not yet prepared: `evaluate` without a loss and `predict` work).
    pub fn new(network: impl Layer + 'static) -> Model {
        Model {
            network: Box::new(network),
            optimizer: None,
            loss: None,
            metrics: Vec::new(),
            epoch: 0,
            verbose: true,
            to_static: false,
            compiled: None,
            amp: None,
            scaler: None,
            custom_step: None,
            group: None,
        }
    }

    /// Train data-parallel over `group` (Paddle's `fleet.distributed_model` for `Model`): rank
    /// 0's weights go to every rank now, each training step averages the gradients over the
    /// group before the update, and `fit` reports each epoch's values averaged over the ranks.
    /// Give each rank its share of the data (`DataLoader::shard`) with batch size `B / ranks`:
    /// training then follows one process at batch `B`. With `to_static(true)` the averaging is
    /// part of the compiled step (an `all_reduce_avg` per bucket of gradients in its graph).
    pub fn data_parallel(&mut self, group: &crate::distributed::ProcessGroup) -> Result<&mut Model> {
        crate::distributed::data_parallel::broadcast_state(self.network.as_ref(), group)?;
        self.group = Some(group.clone());
        Ok(self)
    }

    /// Replace the training step that `train_batch` and `fit` run (forward, loss, backward,
    /// update) with `step`, which gets the model's parts in a [`StepContext`] and the batch and
    /// returns the loss and the network's output (metrics are computed from it): gradient
    /// clipping, extra loss terms, several optimizer calls — the low-level API inside `fit`.
    /// `StepContext::default_step` is the standard step, to wrap. With `to_static(true)` the
    /// custom step is traced into the compiled graph like the standard one.
    pub fn custom_step(
        &mut self,
        step: impl FnMut(&mut StepContext<'_>, &Tensor, &Tensor) -> Result<(Tensor, Tensor)> + 'static,
    ) -> &mut Model {
        self.custom_step = Some(Box::new(step));
        self.compiled = None;
        self
    }

    /// Train with automatic mixed precision: each step's forward pass and loss run inside
    /// [`crate::amp::auto_cast_with`]`(config)` (matmuls and convolutions in f16/bf16, the deny
    /// list in f32), and with `scaler` the loss is scaled before `backward` and the step is
    /// skipped on overflow ([`GradScaler`]; f16 wants it, bf16 does not). Compiled steps
    /// ([`Model::to_static`]) trace the same. Checkpoints carry the scaler's state.
    pub fn amp(&mut self, config: AmpConfig, scaler: Option<GradScaler>) -> &mut Model {
        self.amp = Some(config);
        self.scaler = scaler;
        self.compiled = None;
        self
    }

    /// The loss scaler, if training uses one.
    pub fn scaler(&self) -> Option<&GradScaler> {
        self.scaler.as_ref()
    }

    /// Run each training step as one compiled graph (`true`) or eagerly (`false`, the
    /// default): the whole step — forward, loss, backward, the optimizer's update — is traced
    /// once, with a symbolic batch size ([`crate::jit::to_static_step`]), and runs on the
    /// compiled backend, its parameters and the optimizer's state written back after every
    /// call. Batches must keep their per-sample shapes and dtypes (another shape is an error
    /// saying so). Evaluation and prediction stay eager.
    pub fn to_static(&mut self, on: bool) -> Result<&mut Model> {
        if !on {
            // Eager steps continue from the state the compiled ones reached.
            self.sync_optimizer()?;
            self.compiled = None;
        }
        self.to_static = on;
        Ok(self)
    }

    /// Copy the optimizer state a compiled step keeps as its own graph params (step counts,
    /// moments) into the optimizer.
    fn sync_optimizer(&mut self) -> Result<()> {
        if let (Some((_, step)), Some(opt)) = (&self.compiled, self.optimizer.as_mut()) {
            step.sync_optimizer(opt.as_mut())?;
        }
        Ok(())
    }

    /// Show (the default) or hide `fit`'s progress bar: per epoch the batches done, the running
    /// loss and metrics, samples per second and the time left. It is drawn on standard error
    /// only when that is a terminal.
    pub fn verbose(&mut self, on: bool) -> &mut Model {
        self.verbose = on;
        self
    }

    /// Set the optimizer (built over the network's parameters), the loss and the metrics.
    pub fn prepare(
        &mut self,
        optimizer: impl Optimizer + 'static,
        loss: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + 'static,
        metrics: Vec<Box<dyn Metric>>,
    ) {
        self.optimizer = Some(Box::new(optimizer));
        self.loss = Some(Box::new(loss));
        self.metrics = metrics;
        self.compiled = None;
    }

    /// The network.
    pub fn network(&self) -> &dyn Layer {
        self.network.as_ref()
    }

    /// The network, mutably (train/eval, quantization, …).
    pub fn network_mut(&mut self) -> &mut dyn Layer {
        self.network.as_mut()
    }

    /// The optimizer, once prepared (its state synchronized with a compiled step's).
    pub fn optimizer_mut(&mut self) -> Option<&mut (dyn Optimizer + 'static)> {
        // A failed copy leaves the optimizer as it was; the compiled step keeps running.
        let _ = self.sync_optimizer();
        self.optimizer.as_deref_mut()
    }

    /// Epochs trained so far (restored by [`Model::load`]).
    pub fn epochs_trained(&self) -> usize {
        self.epoch
    }

    /// One training step on a batch: forward, loss, backward, the optimizer's update; the
    /// metrics are updated. Returns the loss and the metrics' values on this batch.
    pub fn train_batch(&mut self, x: &Tensor, label: &Tensor) -> Result<(f64, Vec<f64>)> {
        need_loss(&self.loss, "Model::train_batch")?;
        if self.optimizer.is_none() {
            return Err(Error::invalid(
                "Model::train_batch",
                "the model has no optimizer: call prepare first",
            ));
        }
        self.network.train();
        if self.to_static {
            let (loss, out) = self.compiled_step(x, label)?;
            let values = self.update_metrics(&out, label)?;
            return Ok((loss, values));
        }
        let opt = self.optimizer.as_mut().expect("checked above");
        opt.clear_grad();
        let mut ctx = StepContext {
            network: self.network.as_ref(),
            loss: need_loss(&self.loss, "Model::train_batch")?,
            optimizer: opt.as_mut(),
            scaler: self.scaler.as_mut(),
            amp: self.amp.as_ref(),
            group: self.group.as_ref(),
        };
        let (loss, out) = run_step(self.custom_step.as_mut(), &mut ctx, x, label)?;
        let values = self.update_metrics(&out, label)?;
        Ok((loss.item()?, values))
    }

    /// One training step through its compiled graph (traced on the first batch): the loss and
    /// the network's output.
    fn compiled_step(&mut self, x: &Tensor, label: &Tensor) -> Result<(f64, Tensor)> {
        let tail = |t: &Tensor| t.shape().get(1..).map(<[usize]>::to_vec).unwrap_or_default();
        let key = (tail(x), x.dtype(), tail(label), label.dtype());
        if let Some((other, _)) = &self.compiled
            && *other != key
        {
            // A second trace would start from the optimizer's eager state, which the first
            // step's graph keeps to itself.
            return Err(Error::invalid(
                "Model::train_batch",
                format!(
                    "the compiled step was traced for inputs [N, {:?}] {} and labels [N, {:?}] {}; a batch of [_, {:?}] {} / [_, {:?}] {} needs eager mode (to_static(false))",
                    other.0, other.1, other.2, other.3, key.0, key.1, key.2, key.3
                ),
            ));
        }
        if self.compiled.is_none() {
            // The batch dim symbolic: one trace serves every batch size.
            let spec = |t: &Tensor, name: &str| {
                let dims: Vec<Option<usize>> = t
                    .shape()
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| (i > 0).then_some(d))
                    .collect();
                InputSpec::new(&dims, t.dtype(), name)
            };
            let specs = [spec(x, "x"), spec(label, "label")];
            let net = self.network.as_ref();
            let mut ctx = StepContext {
                network: net,
                loss: need_loss(&self.loss, "Model::train_batch")?,
                optimizer: self.optimizer.as_mut().expect("checked by train_batch").as_mut(),
                scaler: self.scaler.as_mut(),
                amp: self.amp.as_ref(),
                group: self.group.as_ref(),
            };
            let custom = self.custom_step.as_mut();
            let traced = crate::jit::to_static_step(net, &specs, |xs| {
                let (l, out) = run_step(custom, &mut ctx, &xs[0], &xs[1])?;
                Ok(vec![l, out])
            })?;
            self.compiled = Some((key, traced));
        }
        let (_, step) = self.compiled.as_ref().expect("traced above");
        // The learning rate as the optimizer has it now (a schedule, a plateau's reduction).
        if let Some(opt) = &self.optimizer {
            step.set_lr(opt.get_lr())?;
        }
        let outs = step.call(&[x, label])?;
        match outs.as_slice() {
            [loss, out] => Ok((loss.item()?, out.clone())),
            _ => Err(Error::invalid(
                "Model::train_batch",
                format!("the compiled step returned {} values, not 2", outs.len()),
            )),
        }
    }

    /// One evaluation step on a batch (eval mode, no gradients): the loss (NaN without one)
    /// and the metrics' values on this batch, the metrics updated.
    pub fn eval_batch(&mut self, x: &Tensor, label: &Tensor) -> Result<(f64, Vec<f64>)> {
        self.network.eval();
        let _ng = crate::no_grad();
        let out = self.network.forward(x)?;
        let loss = match &self.loss {
            Some(f) => f(&out, label)?.item()?,
            None => f64::NAN,
        };
        let values = self.update_metrics(&out, label)?;
        Ok((loss, values))
    }

    fn update_metrics(&mut self, out: &Tensor, label: &Tensor) -> Result<Vec<f64>> {
        let mut values = Vec::new();
        for m in &mut self.metrics {
            values.extend(m.update(out, label)?);
        }
        Ok(values)
    }

    /// The metrics' accumulated values by name, then reset.
    fn take_metrics(&mut self, logs: &mut BTreeMap<String, f64>) {
        for m in &mut self.metrics {
            for (name, v) in m.names().into_iter().zip(m.accumulate()) {
                logs.insert(name, v);
            }
            m.reset();
        }
    }

    /// Train for `epochs` epochs over `train` (batches of `(input, label)`), evaluating on
    /// `eval` after each; returns each epoch's logs. The epoch count continues from earlier
    /// `fit` calls and [`Model::load`], and a seeded loader made afresh after a `load` first
    /// draws the orders of the epochs already trained ([`DataLoader::skip_to_epoch`]), so a
    /// resumed run sees the batches an uninterrupted one would.
    pub fn fit<D: Dataset + 'static>(
        &mut self,
        train: &DataLoader<D, (Tensor, Tensor)>,
        eval: Option<&DataLoader<D, (Tensor, Tensor)>>,
        epochs: usize,
    ) -> Result<Vec<EpochLogs>> {
        self.fit_with(train, eval, epochs, &mut [])
    }

    /// [`Model::fit`] with `callbacks` ([`callbacks`]: early stopping, checkpoints, learning
    /// rate schedules, logs), called in order at each hook; training stops after an epoch at
    /// which any returns [`Control::Stop`].
    pub fn fit_with<D: Dataset + 'static>(
        &mut self,
        train: &DataLoader<D, (Tensor, Tensor)>,
        eval: Option<&DataLoader<D, (Tensor, Tensor)>>,
        epochs: usize,
        callbacks: &mut [&mut dyn Callback],
    ) -> Result<Vec<EpochLogs>> {
        need_loss(&self.loss, "Model::fit")?;
        for c in callbacks.iter_mut() {
            c.on_train_begin(self)?;
        }
        let mut history = Vec::with_capacity(epochs);
        let last = self.epoch + epochs;
        for _ in 0..epochs {
            for c in callbacks.iter_mut() {
                c.on_epoch_begin(self, self.epoch)?;
            }
            for m in &mut self.metrics {
                m.reset();
            }
            // A loader made afresh for a resumed run draws the orders it skipped.
            train.skip_to_epoch(self.epoch);
            let batches = train.iter();
            let bar = self.progress(batches.len(), last);
            let start = std::time::Instant::now();
            let (mut total, mut samples) = (0.0, 0usize);
            for (index, batch) in batches.enumerate() {
                let (x, y) = batch?;
                let n = x.shape().first().copied().unwrap_or(1);
                let (loss, _) = self.train_batch(&x, &y)?;
                total += loss * n as f64;
                samples += n;
                for c in callbacks.iter_mut() {
                    c.on_batch_end(self, index, loss)?;
                }
                bar.inc(1);
                // The running metrics (an AUC's accumulate walks its bins) only for a bar shown.
                if !bar.is_hidden() {
                    bar.set_message(self.progress_message(mean(total, samples), samples, start));
                }
            }
            bar.finish();
            let mut logs = EpochLogs {
                epoch: self.epoch,
                ..EpochLogs::default()
            };
            logs.train.insert("loss".into(), mean(total, samples));
            self.take_metrics(&mut logs.train);
            if let Some(eval) = eval {
                logs.eval = self.evaluate(eval)?;
            }
            if let Some(g) = &self.group {
                average_logs(g, &mut logs.train)?;
                average_logs(g, &mut logs.eval)?;
            }
            self.epoch += 1;
            let mut stop = false;
            for c in callbacks.iter_mut() {
                stop |= c.on_epoch_end(self, &logs)? == Control::Stop;
            }
            history.push(logs);
            if stop {
                break;
            }
        }
        for c in callbacks.iter_mut() {
            c.on_train_end(self, &history)?;
        }
        Ok(history)
    }

    /// The progress bar's message: the running loss and metrics, samples per second.
    fn progress_message(&self, loss: f64, samples: usize, start: std::time::Instant) -> String {
        let mut msg = format!("loss {loss:.4}");
        for m in &self.metrics {
            for (name, v) in m.names().iter().zip(m.accumulate()) {
                msg.push_str(&format!(" {name} {v:.4}"));
            }
        }
        let secs = start.elapsed().as_secs_f64();
        if secs > 0.0 {
            msg.push_str(&format!(" {:.0} samples/s", samples as f64 / secs));
        }
        msg
    }

    /// A progress bar over `batches` for the epoch being trained (hidden unless verbose).
    fn progress(&self, batches: usize, last: usize) -> indicatif::ProgressBar {
        if !self.verbose {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::new(batches as u64);
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(format!("{}/{last}", self.epoch + 1));
        bar
    }

    /// The loss (mean over samples; NaN without a loss) and the metrics over `data`, by name.
    pub fn evaluate<D: Dataset + 'static>(
        &mut self,
        data: &DataLoader<D, (Tensor, Tensor)>,
    ) -> Result<BTreeMap<String, f64>> {
        for m in &mut self.metrics {
            m.reset();
        }
        let (mut total, mut samples) = (0.0, 0usize);
        for batch in data {
            let (x, y) = batch?;
            let n = x.shape().first().copied().unwrap_or(1);
            let (loss, _) = self.eval_batch(&x, &y)?;
            total += loss * n as f64;
            samples += n;
        }
        let mut logs = BTreeMap::new();
        logs.insert("loss".into(), mean(total, samples));
        self.take_metrics(&mut logs);
        Ok(logs)
    }

    /// The network's outputs (eval mode, no gradients) for each batch of inputs.
    pub fn predict(&mut self, inputs: impl IntoIterator<Item = Result<Tensor>>) -> Result<Vec<Tensor>> {
        self.network.eval();
        let _ng = crate::no_grad();
        inputs.into_iter().map(|x| self.network.forward(&x?)).collect()
    }

    /// Write a training checkpoint to `path` (safetensors, written to a temporary file and
    /// renamed, so an earlier checkpoint survives a crash): the network's parameters and
    /// buffers (`network/<name>`), the optimizer's state (`optimizer/<name>`) and the epochs
    /// trained (`meta/epoch`).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let mut state: BTreeMap<String, TensorData> = BTreeMap::new();
        for (k, v) in self.network.state_dict() {
            state.insert(format!("network/{k}"), v.try_data()?);
        }
        if let Some(opt) = &self.optimizer {
            // A compiled step keeps the optimizer's state as its own graph params.
            let opt_state = match &self.compiled {
                Some((_, step)) => step.optimizer_state(opt.as_ref())?,
                None => opt.state_dict(),
            };
            for (k, v) in opt_state {
                state.insert(format!("optimizer/{k}"), v);
            }
        }
        if let Some(sc) = &self.scaler {
            for (k, v) in sc.state_dict() {
                state.insert(format!("scaler/{k}"), TensorData::scalar(v));
            }
        }
        state.insert(
            "meta/epoch".into(),
            TensorData::from_vec(vec![], vec![self.epoch as i64])?,
        );
        crate::serialization::save(&state, path)
    }

    /// Restore a checkpoint written by [`Model::save`]: the network's state (every entry must
    /// match), the optimizer's (when the model has one and the file does) and the epoch count.
    /// A plain state dict (as [`crate::save_layer`] or `tools/torchvision_to_oar.py` writes:
    /// no `meta/epoch`, no `network/` prefix) loads the network's weights only, as Paddle's
    /// `Model.load` of a `.pdparams` file; the optimizer and the epoch count stay, and float
    /// values stored in another float dtype (f16 weights for an f32 network) are converted, as
    /// PyTorch's `load_state_dict` copies them. On a mismatch nothing changes and the error
    /// names the file.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let state = crate::serialization::load(path)?;
        if !state.contains_key("meta/epoch") && !state.keys().any(|k| k.starts_with("network/")) {
            let state = float_cast_to(&self.network.state_dict(), state)?;
            self.network.set_state_dict(&state).map_err(|e| Error::Io {
                path: path.display().to_string(),
                detail: format!("network: {e}"),
            })?;
            // A compiled step traced before kept the old weights.
            self.compiled = None;
            return Ok(());
        }
        let part = |prefix: &str| -> BTreeMap<String, TensorData> {
            state
                .iter()
                .filter_map(|(k, v)| k.strip_prefix(prefix).map(|k| (k.to_string(), v.clone())))
                .collect()
        };
        let bad = |detail: String| Error::Io {
            path: path.display().to_string(),
            detail,
        };
        let epoch = state
            .get("meta/epoch")
            .ok_or_else(|| bad("not a Model checkpoint: no `meta/epoch`".into()))?
            .to_f64_vec()
            .first()
            .copied()
            .filter(|e| *e >= 0.0 && e.fract() == 0.0)
            .ok_or_else(|| bad("`meta/epoch` is not an epoch count".into()))?;
        let net = part("network/");
        let opt = part("optimizer/");
        let scaler: BTreeMap<String, f64> = part("scaler/")
            .into_iter()
            .map(|(k, v)| (k, v.to_f64_vec().first().copied().unwrap_or(f64::NAN)))
            .collect();
        // set_state_dict changes nothing on a mismatch; the network's old state comes back if
        // the optimizer's does not fit.
        let before: BTreeMap<String, TensorData> = self
            .network
            .state_dict()
            .into_iter()
            .map(|(k, v)| Ok((k, v.try_data()?)))
            .collect::<Result<_>>()?;
        // The scaler first (it changes nothing on a bad entry), restored if a later part fails.
        let scaler_before = self.scaler.as_ref().map(GradScaler::state_dict);
        if let Some(sc) = self.scaler.as_mut()
            && !scaler.is_empty()
        {
            sc.load_state_dict(&scaler).map_err(|e| bad(format!("scaler: {e}")))?;
        }
        let restore_scaler = |m: &mut Model| {
            if let (Some(sc), Some(s)) = (m.scaler.as_mut(), &scaler_before) {
                let _ = sc.load_state_dict(s);
            }
        };
        if let Err(e) = self.network.set_state_dict(&net) {
            restore_scaler(self);
            return Err(bad(format!("network: {e}")));
        }
        if let Some(o) = self.optimizer.as_mut()
            && !opt.is_empty()
            && let Err(e) = o.set_state_dict(&opt)
        {
            self.network.set_state_dict(&before)?;
            restore_scaler(self);
            return Err(bad(format!("optimizer: {e}")));
        }
        self.epoch = epoch as usize;
        // A compiled step traced before kept the old state: trace again from the loaded one.
        self.compiled = None;
        Ok(())
    }

    /// The network's layers as a table: each layer with parameters (its path), its parameter
    /// count and shapes, then the totals.
    pub fn summary(&self) -> String {
        self.table(None)
    }

    /// [`Model::summary`] with each layer's output shape, as `paddle.summary(net, input_size)`:
    /// the network is traced on `input` and a layer's output is the result of the first
    /// operation that reads its first parameter (a symbolic batch shows as `N`).
    pub fn summary_for(&self, input: &InputSpec) -> Result<String> {
        let traced = crate::jit::to_static_layer(self.network.as_ref(), input)?;
        let g = traced.graph();
        let mut shapes = BTreeMap::new();
        for n in g.topo_order() {
            let node = g.node(n);
            for v in node.inputs() {
                if let oar_ir::Op::Param(oar_ir::ops::Param { name, .. }) = &g.node(v.node).op
                    && let Some(out) = node.outputs().first()
                {
                    shapes.entry(name.clone()).or_insert_with(|| out.shape.to_string());
                }
            }
        }
        Ok(self.table(Some(&shapes)))
    }

    fn table(&self, outputs: Option<&BTreeMap<String, String>>) -> String {
        let mut rows = Vec::new();
        walk(self.network.as_ref(), "", &mut rows);
        let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(5).max(5);
        let out_of =
            |r: &(String, String, usize, String)| outputs.map(|o| o.get(&r.3).cloned().unwrap_or_else(|| "?".into()));
        let ow = rows
            .iter()
            .filter_map(|r| out_of(r).map(|s| s.len()))
            .max()
            .unwrap_or(0)
            .max(6);
        let mut s = format!("{:<width$}  ", "layer");
        if outputs.is_some() {
            s.push_str(&format!("{:<ow$}  ", "output"));
        }
        s.push_str(&format!("{:>12}  parameters\n", "count"));
        let mut total = 0usize;
        for r in &rows {
            s.push_str(&format!("{:<width$}  ", r.0));
            if let Some(o) = out_of(r) {
                s.push_str(&format!("{o:<ow$}  "));
            }
            s.push_str(&format!("{:>12}  {}\n", r.2, r.1));
            total += r.2;
        }
        let trainable: usize = self
            .network
            .parameters()
            .iter()
            .filter(|p| p.requires_grad())
            .map(Tensor::numel)
            .sum();
        s.push_str(&format!("total parameters: {total}, trainable: {trainable}\n"));
        s
    }
}

/// The loss a model was prepared with, or the error `what` reports without one.
fn need_loss<'a>(loss: &'a Option<LossFn>, what: &str) -> Result<&'a LossFn> {
    loss.as_ref()
        .ok_or_else(|| Error::invalid(what, "the model has no loss: call prepare first"))
}

/// Average `network`'s gradients over `group` (nothing without one).
fn average_over(network: &dyn Layer, group: Option<&crate::distributed::ProcessGroup>) -> Result<()> {
    match group {
        Some(g) => crate::distributed::data_parallel::average_gradients(
            &network.parameters(),
            g,
            crate::distributed::data_parallel::DEFAULT_BUCKET_BYTES,
        ),
        None => Ok(()),
    }
}

/// Replace every value of `logs` by its mean over the ranks of `g` (every rank has the same keys).
fn average_logs(g: &crate::distributed::ProcessGroup, logs: &mut BTreeMap<String, f64>) -> Result<()> {
    if g.size() == 1 || logs.is_empty() {
        return Ok(());
    }
    let values: Vec<f64> = logs.values().copied().collect();
    let n = values.len();
    let avg = g.all_reduce(&Tensor::from_vec(values, &[n])?, crate::distributed::ReduceOp::Avg)?;
    for (v, a) in logs.values_mut().zip(avg.to_vec::<f64>()?) {
        *v = a;
    }
    Ok(())
}

/// The custom step if there is one, else the standard step; the loss and output detached.
fn run_step(
    custom: Option<&mut StepFn>,
    ctx: &mut StepContext<'_>,
    x: &Tensor,
    label: &Tensor,
) -> Result<(Tensor, Tensor)> {
    match custom {
        Some(f) => {
            let (l, out) = f(ctx, x, label)?;
            Ok((l.detach(), out.detach()))
        }
        None => ctx.default_step(x, label),
    }
}

/// Each layer with its own parameters: `(path, shapes, count, its first parameter's full
/// name)`, depth first.
fn walk(l: &dyn Layer, path: &str, rows: &mut Vec<(String, String, usize, String)>) {
    let own = l.own_parameters();
    if let Some((first, _)) = own.first() {
        let shapes = own
            .iter()
            .map(|(n, t)| format!("{n} {:?}", t.shape()))
            .collect::<Vec<_>>()
            .join(", ");
        let count = own.iter().map(|(_, t)| t.numel()).sum();
        let (row, full) = if path.is_empty() {
            ("(root)".to_string(), first.clone())
        } else {
            (path.to_string(), format!("{path}.{first}"))
        };
        rows.push((row, shapes, count, full));
    }
    for (name, sub) in l.sublayers() {
        let p = if path.is_empty() {
            name
        } else {
            format!("{path}.{name}")
        };
        walk(sub, &p, rows);
    }
}

fn mean(total: f64, n: usize) -> f64 {
    if n == 0 { f64::NAN } else { total / n as f64 }
}

/// `state` with each float entry whose dtype differs from the float tensor of the same name in
/// `own` cast to that tensor's dtype; everything else as it is (`set_state_dict` checks it).
fn float_cast_to(
    own: &BTreeMap<String, Tensor>,
    state: BTreeMap<String, TensorData>,
) -> Result<BTreeMap<String, TensorData>> {
    state
        .into_iter()
        .map(|(k, v)| {
            let target = own.get(&k).map(Tensor::dtype);
            match target {
                Some(dt) if dt.is_float() && v.dtype().is_float() && v.dtype() != dt => {
                    let cast = Tensor::from_data(v).cast(dt)?.try_data()?;
                    Ok((k, cast))
                }
                _ => Ok((k, v)),
            }
        })
        .collect()
}
