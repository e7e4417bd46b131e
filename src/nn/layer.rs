//! The `Layer` trait: Paddle's `nn.Layer` / PyTorch's `nn.Module` for oar.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::{DType, TensorData};
use std::collections::BTreeMap;

/// A building block of models. Implement [`Layer::forward`] and list what the layer owns
/// (`own_parameters`, `own_buffers`, `sublayers`); everything else — recursive parameter
/// lists, `state_dict`, train/eval — comes from the provided methods.
///
/// Parameters and buffers are [`Tensor`] handles shared with the layer, so an optimizer that
/// updates them (`set_data`) updates the layer.
pub trait Layer {
    /// Run the layer on one input.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Trainable tensors owned directly by this layer (not its sublayers), by local name.
    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Non-trainable state owned directly (e.g. batch-norm running statistics).
    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Direct sublayers, by local name.
    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        Vec::new()
    }

    /// Direct sublayers, mutably (for train/eval).
    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        Vec::new()
    }

    /// Give this layer's quantizable parts fake quantization made by `q`
    /// ([`crate::quantization`]: `QAT` / `PTQ`) and pass `q` on to the sublayers; returns how
    /// many layers took it. `Linear` and `Conv2D` quantize their input and weight; other layers
    /// pass it on.
    fn quantize_with(&mut self, q: &dyn crate::quantization::Quantizer) -> Result<usize> {
        let mut n = 0;
        for (_, s) in self.sublayers_mut() {
            n += s.quantize_with(q)?;
        }
        Ok(n)
    }

    /// Fold a per-output-channel affine map `y · scale + shift` applied to this layer's output
    /// into its weight and bias ([`crate::quantization::fold_batch_norms`]); `None` for layers
    /// that cannot (only `Conv2D` can).
    fn fold_affine(&mut self, _scale: &[f32], _shift: &[f32]) -> Option<Result<()>> {
        None
    }

    /// Become the identity, as a batch norm folded into the layer before it
    /// ([`crate::quantization::fold_batch_norms`]): no parameters or buffers left. False for
    /// layers that cannot.
    fn fold_away(&mut self) -> bool {
        false
    }

    /// Set this layer's own training flag (layers without one ignore it).
    fn set_training(&mut self, _training: bool) {}

    /// This layer's training flag (true unless it tracks one and was put in eval mode).
    fn is_training(&self) -> bool {
        true
    }

    /// Every parameter, named by its path (`encoder.0.linear1.weight`).
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = self.own_parameters();
        for (name, sub) in self.sublayers() {
            out.extend(
                sub.named_parameters()
                    .into_iter()
                    .map(|(n, t)| (format!("{name}.{n}"), t)),
            );
        }
        out
    }

    /// Every parameter.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// Every buffer, named by its path.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = self.own_buffers();
        for (name, sub) in self.sublayers() {
            out.extend(sub.named_buffers().into_iter().map(|(n, t)| (format!("{name}.{n}"), t)));
        }
        out
    }

    /// Parameters and buffers by path: what `oar::save` writes.
    fn state_dict(&self) -> BTreeMap<String, Tensor> {
        self.named_parameters()
            .into_iter()
            .chain(self.named_buffers())
            .collect()
    }

    /// Load values by path. Every entry must exist with the same dtype and shape, and every
    /// parameter and buffer must be given; otherwise nothing is changed and the error names
    /// the missing, unexpected or mismatched entries.
    fn set_state_dict(&self, state: &BTreeMap<String, TensorData>) -> Result<()> {
        let own = self.state_dict();
        let mut problems = Vec::new();
        for (name, t) in &own {
            match state.get(name) {
                None => problems.push(format!("missing `{name}`")),
                Some(v) if v.tensor_type() != t.tensor_type() => problems.push(format!(
                    "`{name}` is {} in the layer but {} in the state",
                    t.tensor_type(),
                    v.tensor_type()
                )),
                Some(_) => {}
            }
        }
        problems.extend(
            state
                .keys()
                .filter(|k| !own.contains_key(*k))
                .map(|k| format!("unexpected `{k}`")),
        );
        if !problems.is_empty() {
            return Err(Error::invalid("set_state_dict", problems.join("; ")));
        }
        for (name, t) in own {
            t.set_data(state[&name].clone())?;
        }
        Ok(())
    }

    /// Training mode, recursively.
    fn train(&mut self) {
        self.set_training(true);
        for (_, s) in self.sublayers_mut() {
            s.train();
        }
    }

    /// Inference mode, recursively.
    fn eval(&mut self) {
        self.set_training(false);
        for (_, s) in self.sublayers_mut() {
            s.eval();
        }
    }

    /// Move every parameter and buffer to `device` in place (PyTorch `module.to(device)`,
    /// Paddle `layer.to(device=...)`): the same handles, so optimizers built on
    /// `parameters()` keep working. All or nothing: if any tensor cannot be moved, none is.
    /// Gradients are dropped.
    fn to(&self, device: &Device) -> Result<()> {
        let state: Vec<Tensor> = self.state_dict().into_values().collect();
        let moved = state.iter().map(|t| t.storage_on(device)).collect::<Result<Vec<_>>>()?;
        for (t, s) in state.iter().zip(moved) {
            t.replace_storage(s);
        }
        Ok(())
    }

    /// Store every float parameter and buffer in `dtype` in place (PyTorch's
    /// `module.to(torch.bfloat16)` / `.half()`, Paddle's `layer.to(dtype=...)`): the same
    /// handles, so optimizers built on `parameters()` keep working. Integer and bool tensors
    /// stay as they are; `dtype` must be a float type. Gradients are dropped. All or nothing.
    fn to_dtype(&self, dtype: DType) -> Result<()> {
        if !dtype.is_float() {
            return Err(Error::invalid("to_dtype", format!("{dtype} is not a float dtype")));
        }
        let state: Vec<Tensor> = self
            .state_dict()
            .into_values()
            .filter(|t| t.dtype().is_float())
            .collect();
        let _ng = crate::autograd::no_grad();
        let _amp = crate::amp::disable();
        let cast = state
            .iter()
            .map(|t| t.detach().cast(dtype))
            .collect::<Result<Vec<_>>>()?;
        for (t, c) in state.iter().zip(cast) {
            t.replace_storage(c.storage());
        }
        Ok(())
    }

    /// Forget every parameter's gradient.
    fn clear_gradients(&self) {
        for p in self.parameters() {
            p.clear_grad();
        }
    }
}

/// A boxed layer is a layer (`Box<dyn Layer>` from a model registry or a builder that picks
/// the architecture at run time goes wherever a layer does, e.g. `Model::new`): every method
/// forwards to the box's content, so its overrides hold.
impl<L: Layer + ?Sized> Layer for Box<L> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        (**self).own_parameters()
    }
    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        (**self).own_buffers()
    }
    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        (**self).sublayers()
    }
    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        (**self).sublayers_mut()
    }
    fn quantize_with(&mut self, q: &dyn crate::quantization::Quantizer) -> Result<usize> {
        (**self).quantize_with(q)
    }
    fn fold_affine(&mut self, scale: &[f32], shift: &[f32]) -> Option<Result<()>> {
        (**self).fold_affine(scale, shift)
    }
    fn fold_away(&mut self) -> bool {
        (**self).fold_away()
    }
    fn set_training(&mut self, training: bool) {
        (**self).set_training(training)
    }
    fn is_training(&self) -> bool {
        (**self).is_training()
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        (**self).named_parameters()
    }
    fn parameters(&self) -> Vec<Tensor> {
        (**self).parameters()
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        (**self).named_buffers()
    }
    fn state_dict(&self) -> BTreeMap<String, Tensor> {
        (**self).state_dict()
    }
    fn set_state_dict(&self, state: &BTreeMap<String, TensorData>) -> Result<()> {
        (**self).set_state_dict(state)
    }
    fn train(&mut self) {
        (**self).train()
    }
    fn eval(&mut self) {
        (**self).eval()
    }
    fn to(&self, device: &Device) -> Result<()> {
        (**self).to(device)
    }
    fn to_dtype(&self, dtype: DType) -> Result<()> {
        (**self).to_dtype(dtype)
    }
    fn clear_gradients(&self) {
        (**self).clear_gradients()
    }
}

impl Tensor {
    /// A trainable leaf holding `data` (a layer parameter).
    pub fn parameter(data: TensorData) -> Result<Tensor> {
        Tensor::from_data(data).requires_grad_(true)
    }
}
