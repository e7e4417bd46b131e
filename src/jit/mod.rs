//! Dynamic to static: trace eager code into an IR graph (`to_static`), run it on a backend,
//! save it as a `.oar` model (`save`), and load it back as an eager, trainable layer (`load`).
//!
//! Tracing records every op of the function on traced tensors. Input specs may leave dims
//! symbolic (`None` → the batch dim `N` on axis 0), so one graph serves every batch size.
//! Layer parameters and buffers become named graph params; their in-place updates (batch-norm
//! running statistics in training mode) become graph outputs named `@state/<param>`, written
//! back after each call — the functional form of state.

mod control;
mod interp;
mod params;
mod trace;

pub use control::{__macro, MAX_EAGER_ITERATIONS, cond, while_loop};
pub use params::fold_parameters;

pub(crate) use trace::current;

use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::tensor::Tensor;
use oar_ir::file::Model;
use oar_ir::ops::Param;
use oar_ir::{Composite, DType, Dim, Graph, Op, TensorData, Weights};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use trace::TraceCtx;

/// Graph outputs carrying the new value of a param start with this.
pub const STATE_PREFIX: &str = "@state/";

/// The name, dtype and shape of one input; `None` dims are symbolic.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSpec {
    /// Input name in the graph.
    pub name: String,
    /// Dims; `Dim::Sym` for sizes known only at run time.
    pub dims: Vec<Dim>,
    /// Element type.
    pub dtype: DType,
}

impl InputSpec {
    /// Paddle style: `InputSpec::new(&[None, Some(784)], DType::F32, "x")`. A `None` on axis 0
    /// is the batch dim `N`; elsewhere it is `S<axis>`.
    pub fn new(shape: &[Option<usize>], dtype: DType, name: &str) -> InputSpec {
        let dims = shape
            .iter()
            .enumerate()
            .map(|(i, d)| match d {
                Some(n) => Dim::Static(*n),
                None if i == 0 => Dim::sym("N"),
                None => Dim::Sym(format!("S{i}")),
            })
            .collect();
        InputSpec::with_dims(dims, dtype, name)
    }

    /// A spec with explicit (possibly named symbolic) dims.
    pub fn with_dims(dims: Vec<Dim>, dtype: DType, name: &str) -> InputSpec {
        InputSpec {
            name: name.to_string(),
            dims,
            dtype,
        }
    }
}

/// A traced function: an IR graph plus the live parameter tensors it reads.
pub struct StaticFunction {
    graph: Graph,
    params: BTreeMap<String, Tensor>,
    backend: String,
    /// A whole training step: always run on the backend (its gradients are in the graph).
    train_step: bool,
    /// The graph compiled with its parameters as inputs (named `PARAM_INPUT_PREFIX` + name), so
    /// calls feed the current weights without compiling again: `(backend, executable)`.
    compiled: std::sync::Mutex<Option<(String, std::sync::Arc<dyn oar_ir::Executable>)>>,
}

/// Input-name prefix of parameters fed as inputs to a compiled static function.
const PARAM_INPUT_PREFIX: &str = "@param/";

fn trace(
    name: &str,
    specs: &[InputSpec],
    names: BTreeMap<u64, String>,
    train_step: bool,
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<StaticFunction> {
    let ctx = TraceCtx::new(Graph::new(name), names);
    let inputs = specs
        .iter()
        .map(|s| trace::input(&ctx, &s.name, &s.dims, s.dtype))
        .collect::<Result<Vec<_>>>()?;
    let outputs = {
        let _g = crate::autograd::set_grad_enabled(train_step);
        let _current = trace::CurrentGuard::enter(&ctx);
        f(&inputs)?
    };
    let values = outputs.iter().map(|t| ctx.value_of(t)).collect::<Result<Vec<_>>>()?;
    let mut graph = ctx.graph.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (i, v) in values.into_iter().enumerate() {
        let out = if outputs.len() == 1 {
            "output".to_string()
        } else {
            format!("output_{i}")
        };
        graph.add_output(&out, v)?;
    }
    for (param, v) in ctx.updates.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        graph.add_output(&format!("{STATE_PREFIX}{param}"), *v)?;
    }
    oar_ir::verify(&graph)?;
    let params = ctx.params.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(StaticFunction {
        graph,
        params,
        backend: crate::backend::DEFAULT_BACKEND.to_string(),
        train_step,
        compiled: std::sync::Mutex::new(None),
    })
}

/// Trace `f` on inputs described by `specs`. Eager tensors the function captures are baked
/// in as constants; use [`to_static_layer`] so a layer's parameters stay named and trainable.
pub fn to_static(f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>, specs: &[InputSpec]) -> Result<StaticFunction> {
    trace("main", specs, BTreeMap::new(), false, f)
}

/// Trace a layer's `forward` on one input.
pub fn to_static_layer(layer: &dyn Layer, spec: &InputSpec) -> Result<StaticFunction> {
    let names = layer.state_dict().into_iter().map(|(n, t)| (t.id(), n)).collect();
    trace("forward", std::slice::from_ref(spec), names, false, |xs| {
        Ok(vec![layer.forward(&xs[0])?])
    })
}

/// Trace a whole training step — `loss_fn` (forward and loss), `backward()`, the optimizer's
/// update — into one graph in functional form: parameters and optimizer state (`@opt/...`)
/// are graph params, and their new values are `@state/...` outputs written back after each
/// call. Calling it returns the loss. SGD, Momentum, Adam and AdamW are supported.
pub fn to_static_train_step(
    model: &dyn Layer,
    opt: &mut dyn crate::optimizer::Optimizer,
    specs: &[InputSpec],
    loss_fn: impl FnOnce(&[Tensor]) -> Result<Tensor>,
) -> Result<StaticFunction> {
    let names = model.state_dict().into_iter().map(|(n, t)| (t.id(), n)).collect();
    let result = trace("train_step", specs, names, true, |xs| {
        let loss = loss_fn(xs)?;
        loss.backward()?;
        opt.step()?;
        opt.clear_grad();
        Ok(vec![loss.detach()])
    });
    // Leave no traced gradient behind on the eager parameters, whatever happened.
    opt.clear_grad();
    result
}

/// Trace a whole custom training step: `step` runs the forward, `backward()` and the update
/// itself (with a `GradScaler`, gradient accumulation, several losses …) and returns the
/// outputs. As in [`to_static_train_step`], the model's parameters and the optimizer's state
/// become graph params whose new values (`@state/...`) are written back after each call.
pub fn to_static_step(
    model: &dyn Layer,
    specs: &[InputSpec],
    step: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<StaticFunction> {
    let names = model.state_dict().into_iter().map(|(n, t)| (t.id(), n)).collect();
    let result = trace("train_step", specs, names, true, step);
    // Leave no traced gradient behind on the eager parameters, whatever happened.
    model.clear_gradients();
    result
}

impl StaticFunction {
    /// The traced graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The backend it runs on (its registry name; [`crate::backend::DEFAULT_BACKEND`] unless
    /// [`StaticFunction::with_backend`] picked another).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Run on another registered backend (any name in [`crate::backend::registry`], including
    /// one a vendor crate registered); an unknown name is an error listing the registered ones.
    pub fn with_backend(mut self, name: &str) -> Result<StaticFunction> {
        crate::backend::get(name)?;
        self.backend = name.to_string();
        Ok(self)
    }

    /// The parameters' current values (see [`Tensor::data`]; [`StaticFunction::try_weights`]
    /// reports a failed download of a device parameter instead).
    pub fn weights(&self) -> Weights {
        self.params.iter().map(|(k, t)| (k.clone(), t.data())).collect()
    }

    /// The parameters' current values, or the error of the first that cannot be read.
    pub fn try_weights(&self) -> Result<Weights> {
        self.params
            .iter()
            .map(|(k, t)| Ok((k.clone(), t.try_data()?)))
            .collect()
    }

    /// Call with eager tensors, in the order of the input specs. Runs the graph on the
    /// backend; when a gradient is needed (a parameter or input takes gradients and grad mode
    /// is on), runs it op by op eagerly so autograd records it. State outputs are written back.
    pub fn call(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let specs = self.graph.input_specs();
        if inputs.len() != specs.len() {
            return Err(Error::invalid(
                "call",
                format!("the static function takes {} inputs, got {}", specs.len(), inputs.len()),
            ));
        }
        let needs_grad = !self.train_step
            && crate::is_grad_enabled()
            && (self.params.values().any(Tensor::requires_grad) || inputs.iter().any(|t| t.requires_grad()));
        let outs = if needs_grad {
            let feeds = specs
                .iter()
                .map(|(n, _)| n.clone())
                .zip(inputs.iter().map(|t| (*t).clone()))
                .collect();
            interp::run_eager(&self.graph, &feeds, &self.params)?
        } else {
            let feeds: BTreeMap<String, TensorData> = specs
                .iter()
                .map(|(n, _)| n.clone())
                .zip(inputs.iter().map(|t| t.try_data()))
                .map(|(n, d)| d.map(|d| (n, d)))
                .collect::<Result<_>>()?;
            self.run_compiled(feeds)?
                .into_iter()
                .map(|(_, t)| Tensor::from_data(t))
                .collect()
        };
        write_back(&self.graph, outs, &self.params)
    }

    /// Run on the backend: the graph is compiled once per backend with its parameters as
    /// inputs, and every call feeds the parameters' current values. (Graphs with regions are
    /// compiled with their weights on every call: region bodies may read parameters.)
    fn run_compiled(&self, mut feeds: BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>> {
        let has_regions = self.graph.node_ids().any(|n| !self.graph.node(n).regions.is_empty());
        if has_regions {
            let exe = crate::backend::get(&self.backend)?.compile(&self.graph, &self.weights())?;
            return Ok(exe.run(&feeds)?);
        }
        let exe = {
            let mut slot = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
            match &*slot {
                Some((b, exe)) if *b == self.backend => exe.clone(),
                _ => {
                    let mut g = self.graph.clone();
                    g.params_as_inputs(PARAM_INPUT_PREFIX)?;
                    let exe: std::sync::Arc<dyn oar_ir::Executable> =
                        crate::backend::get(&self.backend)?.compile(&g, &Weights::new())?.into();
                    *slot = Some((self.backend.clone(), exe.clone()));
                    exe
                }
            }
        };
        for (name, t) in &self.params {
            feeds.insert(format!("{PARAM_INPUT_PREFIX}{name}"), t.try_data()?);
        }
        Ok(exe.run(&feeds)?)
    }

    /// This function partitioned over `group` by the sharding annotations (`oar_passes::spmd`):
    /// the program every rank runs on its shards, with the collectives the pass inserted. Each
    /// rank calls it with its shard of every split input (slice `rank` along the axis);
    /// parameters split by the annotations (and their optimizer state) are sliced here and
    /// owned by the new function (read them with [`StaticFunction::weights`]); replicated ones
    /// stay shared with this function's. Outputs are whole on every rank.
    pub fn partition(
        &self,
        group: &crate::distributed::ProcessGroup,
        shardings: &BTreeMap<String, oar_passes::Sharding>,
    ) -> Result<StaticFunction> {
        let config = oar_passes::SpmdConfig {
            group: group.id(),
            nranks: group.size(),
            shardings: shardings.clone(),
        };
        let p = oar_passes::partition(&self.graph, &config)?;
        let mut params = BTreeMap::new();
        for (name, t) in &self.params {
            let local = match p.inputs.get(name) {
                Some(oar_passes::Sharding::Split(axis)) => {
                    let k = (t.shape()[*axis] / group.size()) as i64;
                    let r = group.rank() as i64;
                    let slice = crate::autograd::with_no_grad(|| t.slice(*axis as i64, r * k, (r + 1) * k, 1))?;
                    Tensor::from_data(slice.try_data()?)
                }
                _ => t.clone(),
            };
            params.insert(name.clone(), local);
        }
        Ok(StaticFunction {
            graph: p.graph,
            params,
            backend: self.backend.clone(),
            train_step: self.train_step,
            compiled: std::sync::Mutex::new(None),
        })
    }

    /// Set the learning rate a traced training step uses from now on.
    pub fn set_lr(&self, lr: f64) -> Result<()> {
        let key = format!("{}@lr", crate::optimizer::OPT_PREFIX);
        let t = self
            .params
            .get(&key)
            .ok_or_else(|| Error::invalid("set_lr", "this static function is not a training step"))?;
        t.set_data(TensorData::scalar(lr))
    }

    /// Copy the optimizer state the static steps have advanced back into `opt`, so eager
    /// training can continue from here.
    pub fn sync_optimizer(&self, opt: &mut dyn crate::optimizer::Optimizer) -> Result<()> {
        let state = self.optimizer_state(opt)?;
        opt.set_state_dict(&state)
    }

    /// `opt`'s state dict as the static steps have advanced it (what
    /// [`StaticFunction::sync_optimizer`] copies into `opt`), leaving `opt` as it is.
    pub fn optimizer_state(&self, opt: &dyn crate::optimizer::Optimizer) -> Result<BTreeMap<String, TensorData>> {
        let mut state: BTreeMap<String, TensorData> = opt
            .state_dict()
            .into_iter()
            .filter(|(k, _)| k.starts_with('@'))
            .collect();
        for (name, t) in &self.params {
            let Some(key) = name.strip_prefix(crate::optimizer::OPT_PREFIX) else {
                continue;
            };
            if key.starts_with('@') {
                continue;
            }
            let d = t.try_data()?;
            let d = if key.ends_with(".step") {
                TensorData::scalar(d.to_f64_vec()[0].round() as i64)
            } else {
                d
            };
            state.insert(key.to_string(), d);
        }
        Ok(state)
    }

    /// Save as a `.oar` model (graph + current weights).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let model = Model {
            graph: self.graph.clone(),
            weights: self.try_weights()?,
        };
        model.save(path.as_ref()).map_err(|e| Error::Io {
            path: path.as_ref().display().to_string(),
            detail: e.to_string(),
        })
    }
}

/// Split outputs into the function's results and state updates; apply the updates.
fn write_back(graph: &Graph, outs: Vec<Tensor>, params: &BTreeMap<String, Tensor>) -> Result<Vec<Tensor>> {
    let mut results = Vec::new();
    for (o, t) in graph.outputs().iter().zip(outs) {
        match o.name.strip_prefix(STATE_PREFIX) {
            Some(p) => {
                if let Some(param) = params.get(p) {
                    param.set_data(t.try_data()?)?;
                }
            }
            None => results.push(t),
        }
    }
    Ok(results)
}

/// Trace `layer.forward` on `spec` and save graph + weights as a `.oar` model.
pub fn save(layer: &dyn Layer, path: impl AsRef<Path>, spec: &InputSpec) -> Result<()> {
    to_static_layer(layer, spec)?.save(path)
}

/// A model loaded from a `.oar` file, usable as an ordinary eager layer: callable, trainable
/// (float params that are not running statistics take gradients) and saveable again.
pub struct TranslatedLayer {
    graph: Graph,
    params: BTreeMap<String, Tensor>,
    /// Parameter names in the order the graph first reads them (the saved layer's order),
    /// then any weight the graph does not read.
    order: Vec<String>,
    buffers: BTreeSet<String>,
    training: bool,
}

/// Load a `.oar` model as a [`TranslatedLayer`].
pub fn load(path: impl AsRef<Path>) -> Result<TranslatedLayer> {
    let model = Model::load(path.as_ref()).map_err(|e| Error::Io {
        path: path.as_ref().display().to_string(),
        detail: e.to_string(),
    })?;
    TranslatedLayer::new(model)
}

impl TranslatedLayer {
    /// Wrap a model (graph + weights).
    pub fn new(model: Model) -> Result<TranslatedLayer> {
        let mut buffers: BTreeSet<String> = model
            .graph
            .outputs()
            .iter()
            .filter_map(|o| o.name.strip_prefix(STATE_PREFIX).map(str::to_string))
            .collect();
        // Running statistics of batch norm are state, not trainable weights.
        let g = &model.graph;
        for id in g.node_ids() {
            if let Op::Composite(Composite::BatchNorm(_)) = g.node(id).op {
                for v in &g.node(id).inputs()[3..] {
                    if let Op::Param(Param { name, .. }) = &g.node(v.node).op {
                        buffers.insert(name.clone());
                    }
                }
            }
        }
        let mut params = interp::tensors_of(&model.weights);
        for (name, t) in &mut params {
            if !buffers.contains(name) && t.dtype().is_float() {
                t.set_stop_gradient(false)?;
            }
        }
        let mut order: Vec<String> = Vec::new();
        for id in model.graph.topo_order() {
            if let Op::Param(Param { name, .. }) = &model.graph.node(id).op
                && params.contains_key(name)
                && !order.contains(name)
            {
                order.push(name.clone());
            }
        }
        let read: BTreeSet<String> = order.iter().cloned().collect();
        order.extend(params.keys().filter(|k| !read.contains(*k)).cloned());
        Ok(TranslatedLayer {
            graph: model.graph,
            params,
            order,
            buffers,
            training: false,
        })
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The weights in parameter order.
    fn ordered(&self) -> impl Iterator<Item = (&String, &Tensor)> {
        self.order.iter().filter_map(|k| self.params.get_key_value(k))
    }

    /// Call with inputs in the graph's input order; returns the results (state updates are
    /// applied to the buffers in training mode, dropped otherwise).
    pub fn call(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let specs = self.graph.input_specs();
        if inputs.len() != specs.len() {
            return Err(Error::invalid(
                "TranslatedLayer",
                format!("the model takes {} inputs, got {}", specs.len(), inputs.len()),
            ));
        }
        let feeds = specs
            .iter()
            .map(|(n, _)| n.clone())
            .zip(inputs.iter().map(|t| (*t).clone()))
            .collect();
        let outs = interp::run_eager(&self.graph, &feeds, &self.params)?;
        let empty = BTreeMap::new();
        write_back(&self.graph, outs, if self.training { &self.params } else { &empty })
    }

    /// Save the graph with the current weights.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let model = Model {
            graph: self.graph.clone(),
            weights: self
                .params
                .iter()
                .map(|(k, t)| Ok((k.clone(), t.try_data()?)))
                .collect::<Result<_>>()?,
        };
        model.save(path.as_ref()).map_err(|e| Error::Io {
            path: path.as_ref().display().to_string(),
            detail: e.to_string(),
        })
    }
}

impl Layer for TranslatedLayer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.call(&[x])?
            .into_iter()
            .next()
            .ok_or_else(|| Error::invalid("TranslatedLayer", "the model has no outputs"))
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        self.ordered()
            .filter(|(k, t)| !self.buffers.contains(*k) && t.dtype().is_float())
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect()
    }

    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        self.ordered()
            .filter(|(k, t)| self.buffers.contains(*k) || !t.dtype().is_float())
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

impl Tensor {
    /// Set this tensor's value to `value`'s (same dtype and shape). Eagerly it copies the data;
    /// while tracing, it records a state update of this parameter (a graph output).
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        match &value.0.trace {
            None => self.set_value(value),
            Some(tr) => {
                let ctx: &Arc<TraceCtx> = &trace::traced_ctx(tr)?;
                let name = ctx.name_of(self).ok_or_else(|| {
                    Error::invalid(
                        "assign",
                        "while tracing, only a layer's parameters and buffers can be assigned",
                    )
                })?;
                ctx.value_of(self)?;
                ctx.updates
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((name, tr.value));
                Ok(())
            }
        }
    }
}
