//! Tensor (model) parallelism, as Megatron-LM and Paddle's `fleet.meta_parallel`: layers whose
//! weights are split over the ranks of a group, joined by the collectives of
//! [`super::functional`] so that the sharded model computes what the whole one does.
//!
//! - [`ColumnParallelLinear`]: weight `[in, out]` split by columns; rank `r` computes output
//!   features `r·out/n .. (r+1)·out/n` (gathered on request).
//! - [`RowParallelLinear`]: weight split by rows; each rank multiplies its slice of the input
//!   features and the partial products are summed.
//! - [`VocabParallelEmbedding`]: the table split by rows (token ids); ids outside a rank's
//!   range give zeros there, and the sum over ranks is the lookup.
//! - [`parallel_cross_entropy`]: cross-entropy of logits split over the vocabulary, without
//!   gathering them.
//! - [`ParallelMlp`], [`ParallelSelfAttention`] and [`ParallelTransformerLayer`]: a GPT block
//!   split Megatron's way (two collectives forward, two backward).
//! - [`RngTracker`]: named generator states, so dropout inside a parallel region differs
//!   between ranks while dropout on replicated activations stays the same.
//!
//! Every layer is built from the whole layer's weights, drawn from the global generator as
//! the plain layer would draw them, and keeps its rank's slice: with the same `oar::seed` on
//! every rank, the sharded model is the plain model split, and on a group of one it is the
//! plain model.

use super::ProcessGroup;
use super::functional::{copy_to_parallel, gather_from_parallel, reduce_from_parallel, scatter_to_parallel};
use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::nn::functional::{self as F, Reduction};
use crate::nn::util::ctx;
use crate::nn::{Embedding, LayerNorm, Linear};
use crate::tensor::Tensor;
use oar_ir::DType;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// `size / n`, or an error naming the layer when `n` does not divide `size`.
fn part(layer: &str, what: &str, size: usize, group: &ProcessGroup) -> Result<usize> {
    let n = group.size();
    if !size.is_multiple_of(n) {
        return Err(Error::invalid(
            layer,
            format!("{what} {size} does not split into {n} equal parts (one per rank of the group)"),
        ));
    }
    Ok(size / n)
}

/// This rank's slice `r·k .. (r+1)·k` of `full` along `axis`, as a new trainable leaf.
/// The slice is recorded ([`super::checkpoint::split_of`]) for sharded checkpoints.
fn shard(full: &Tensor, axis: usize, k: usize, group: &ProcessGroup) -> Result<Tensor> {
    let start = (group.rank() * k) as i64;
    let data = crate::autograd::with_no_grad(|| full.slice(axis as i64, start, start + k as i64, 1))?.try_data()?;
    let t = Tensor::parameter(data)?;
    super::checkpoint::mark(
        &t,
        super::checkpoint::Split {
            axis,
            part: group.rank(),
            parts: group.size(),
        },
    );
    Ok(t)
}

/// A linear layer whose weight `[in, out]` is split by columns over `group`: rank `r` holds
/// columns (and bias entries) `r·out/n .. (r+1)·out/n`. The input is replicated; its gradient
/// is summed over the ranks. The output is the rank's slice of the features, or with
/// [`ColumnParallelLinear::gather_output`] all of them.
pub struct ColumnParallelLinear {
    weight: Tensor,
    bias: Option<Tensor>,
    group: ProcessGroup,
    gather_output: bool,
    in_features: usize,
    out_features: usize,
}

impl ColumnParallelLinear {
    /// `Linear::new(in, out)` (drawn from the global generator) split over `group`.
    pub fn new(in_features: usize, out_features: usize, group: &ProcessGroup) -> Result<ColumnParallelLinear> {
        Self::from_linear(&Linear::new(in_features, out_features)?, group)
    }

    /// `linear`'s weight and bias split over `group`.
    pub fn from_linear(linear: &Linear, group: &ProcessGroup) -> Result<ColumnParallelLinear> {
        let k = part("ColumnParallelLinear", "out_features", linear.out_features(), group)?;
        Ok(ColumnParallelLinear {
            weight: shard(linear.weight(), 1, k, group)?,
            bias: linear.bias_tensor().map(|b| shard(b, 0, k, group)).transpose()?,
            group: group.clone(),
            gather_output: false,
            in_features: linear.in_features(),
            out_features: linear.out_features(),
        })
    }

    /// Gather every rank's output features (`true`) or give this rank's slice (`false`, the
    /// default, for a [`RowParallelLinear`] with `input_is_parallel` next).
    pub fn gather_output(mut self, on: bool) -> ColumnParallelLinear {
        self.gather_output = on;
        self
    }

    /// This rank's weight `[in, out/n]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Layer for ColumnParallelLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = (|| {
            let x = copy_to_parallel(x, &self.group)?;
            let y = F::linear(&x, &self.weight, self.bias.as_ref())?;
            if self.gather_output {
                gather_from_parallel(&y, -1, &self.group)
            } else {
                Ok(y)
            }
        })();
        ctx(
            || {
                format!(
                    "ColumnParallelLinear(in_features={}, out_features={}, ranks={})",
                    self.in_features,
                    self.out_features,
                    self.group.size()
                )
            },
            y,
        )
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        v.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        v
    }
}

/// A linear layer whose weight `[in, out]` is split by rows over `group`: rank `r` holds rows
/// `r·in/n .. (r+1)·in/n` and multiplies that slice of the input features; the partial
/// products are summed over the ranks, then the (replicated) bias is added. The input is the
/// rank's slice already (`input_is_parallel`, the default: a [`ColumnParallelLinear`]'s
/// output) or the whole input, which each rank slices.
pub struct RowParallelLinear {
    weight: Tensor,
    bias: Option<Tensor>,
    group: ProcessGroup,
    input_is_parallel: bool,
    in_features: usize,
    out_features: usize,
}

impl RowParallelLinear {
    /// `Linear::new(in, out)` (drawn from the global generator) split over `group`.
    pub fn new(in_features: usize, out_features: usize, group: &ProcessGroup) -> Result<RowParallelLinear> {
        Self::from_linear(&Linear::new(in_features, out_features)?, group)
    }

    /// `linear`'s weight split over `group` (the bias is kept whole on every rank).
    pub fn from_linear(linear: &Linear, group: &ProcessGroup) -> Result<RowParallelLinear> {
        let k = part("RowParallelLinear", "in_features", linear.in_features(), group)?;
        let bias = match linear.bias_tensor() {
            Some(b) => Some(Tensor::parameter(b.detach().try_data()?)?),
            None => None,
        };
        Ok(RowParallelLinear {
            weight: shard(linear.weight(), 0, k, group)?,
            bias,
            group: group.clone(),
            input_is_parallel: true,
            in_features: linear.in_features(),
            out_features: linear.out_features(),
        })
    }

    /// Whether the input is this rank's slice of the features (`true`, the default) or the
    /// whole input.
    pub fn input_is_parallel(mut self, on: bool) -> RowParallelLinear {
        self.input_is_parallel = on;
        self
    }

    /// This rank's weight `[in/n, out]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Layer for RowParallelLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = (|| {
            let x = if self.input_is_parallel {
                x.clone()
            } else {
                scatter_to_parallel(x, -1, &self.group)?
            };
            let y = reduce_from_parallel(&x.matmul(&self.weight)?, &self.group)?;
            match &self.bias {
                Some(b) => &y + b,
                None => Ok(y),
            }
        })();
        ctx(
            || {
                format!(
                    "RowParallelLinear(in_features={}, out_features={}, ranks={})",
                    self.in_features,
                    self.out_features,
                    self.group.size()
                )
            },
            y,
        )
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        v.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        v
    }
}

/// The ids of `ids` that fall in `start .. start + len`, shifted to `0 .. len`, and `len` for
/// the others (an index one-hot and the masked lookups read as "none").
fn local_ids(ids: &Tensor, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
    let local = ids.binary_scalar(oar_ir::ops::BinaryOp::Sub, start as f64)?;
    let inside = local
        .greater_equal(&local.scalar_like(0.0)?)?
        .logical_and(&local.less_than(&local.scalar_like(len as f64)?)?)?;
    let clamped = Tensor::where_(&inside, &local, &local.scalar_like(len as f64)?)?;
    Ok((clamped, inside))
}

/// An embedding table `[vocab, dim]` split by rows over `group`: rank `r` holds ids
/// `r·vocab/n .. (r+1)·vocab/n`. Each rank looks up the ids in its range (zeros for the
/// others) and the lookups are summed over the ranks.
pub struct VocabParallelEmbedding {
    weight: Tensor,
    group: ProcessGroup,
    vocab: usize,
    dim: usize,
}

impl VocabParallelEmbedding {
    /// `Embedding::new(vocab, dim)` (drawn from the global generator) split over `group`.
    pub fn new(vocab: usize, dim: usize, group: &ProcessGroup) -> Result<VocabParallelEmbedding> {
        Self::from_embedding(&Embedding::new(vocab, dim)?, group)
    }

    /// `embedding`'s table split over `group`.
    pub fn from_embedding(embedding: &Embedding, group: &ProcessGroup) -> Result<VocabParallelEmbedding> {
        let shape = embedding.weight().shape();
        let k = part("VocabParallelEmbedding", "vocabulary size", shape[0], group)?;
        Ok(VocabParallelEmbedding {
            weight: shard(embedding.weight(), 0, k, group)?,
            group: group.clone(),
            vocab: shape[0],
            dim: shape[1],
        })
    }

    /// This rank's rows `[vocab/n, dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Layer for VocabParallelEmbedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let y = (|| {
            if ids.dtype().is_float() || ids.dtype() == DType::Bool {
                return Err(Error::invalid(
                    "embedding",
                    format!("indices must be integers, got {}", ids.tensor_type()),
                ));
            }
            let k = self.vocab / self.group.size();
            let (local, inside) = local_ids(ids, self.group.rank() * k, k)?;
            // The out-of-range rows look up row 0 and are zeroed.
            let safe = Tensor::where_(&inside, &local, &local.scalar_like(0.0)?)?;
            let rows = F::embedding(&safe, &self.weight)?;
            let keep = inside.cast(self.weight.dtype())?.unsqueeze(-1)?;
            reduce_from_parallel(&(&rows * &keep)?, &self.group)
        })();
        ctx(
            || {
                format!(
                    "VocabParallelEmbedding(vocab={}, dim={}, ranks={})",
                    self.vocab,
                    self.dim,
                    self.group.size()
                )
            },
            y,
        )
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}

/// Cross-entropy of logits `[N, V/n]` split over the vocabulary (a [`ColumnParallelLinear`]
/// without `gather_output`) against integer labels `[N]` in `0..V`, without gathering the
/// logits: the row maxima and the sums of exponentials are combined over the ranks, and the
/// rank holding each label contributes its logit. Equals `cross_entropy` of the gathered
/// logits; its gradient is this rank's slice of that one's.
pub fn parallel_cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    group: &ProcessGroup,
    reduction: Reduction,
) -> Result<Tensor> {
    if group.size() == 1 {
        return F::cross_entropy(logits, labels, reduction);
    }
    let [rows, k] = logits.shape()[..] else {
        return Err(Error::invalid(
            "parallel_cross_entropy",
            format!("expects logits [N, V/ranks], got {}", logits.tensor_type()),
        ));
    };
    if labels.shape() != [rows] || labels.dtype().is_float() {
        return Err(Error::invalid(
            "parallel_cross_entropy",
            format!(
                "expects integer labels [{rows}] for logits {}, got {}",
                logits.tensor_type(),
                labels.tensor_type()
            ),
        ));
    }
    // The maximum only steadies the exponentials: it cancels, so it takes no gradient.
    let max = super::functional::all_reduce(&logits.detach().max(&[-1], true)?, super::ReduceOp::Max, group)?;
    let shifted = (logits - &max)?;
    let sum_exp = reduce_from_parallel(&shifted.exp()?.sum(&[-1], false)?, group)?;
    let (local, _) = local_ids(labels, group.rank() * k, k)?;
    let picked = (&shifted * &F::one_hot(&local, k, logits.dtype())?)?.sum(&[-1], false)?;
    let picked = reduce_from_parallel(&picked, group)?;
    let loss = (&sum_exp.log()? - &picked)?;
    match reduction {
        Reduction::None => Ok(loss),
        Reduction::Sum => loss.sum(&[], false),
        Reduction::Mean => loss.mean(&[], false),
    }
}

/// Named generator states (Megatron's and Paddle's `RNGStatesTracker`): [`RngTracker::fork`]
/// runs code with every draw (dropout masks, initializers) from the named state instead of
/// the global generator, and keeps the state for the next time. Seed the tensor-parallel
/// state differently on each rank (`base + rank`) and dropout inside parallel regions differs
/// between ranks, as their slices are different features; draws outside stay in step.
#[derive(Default)]
pub struct RngTracker {
    states: Mutex<BTreeMap<String, StdRng>>,
}

impl RngTracker {
    /// No states.
    pub fn new() -> RngTracker {
        RngTracker::default()
    }

    /// Add the state `name` seeded with `seed`; an existing name is an error.
    pub fn add(&self, name: &str, seed: u64) -> Result<()> {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        if states.contains_key(name) {
            return Err(Error::invalid("RngTracker::add", format!("state `{name}` exists")));
        }
        states.insert(name.to_string(), StdRng::seed_from_u64(seed));
        Ok(())
    }

    /// Run `f` drawing from the state `name` (this thread's draws only), then keep the state
    /// where `f` left it.
    pub fn fork<T>(&self, name: &str, f: impl FnOnce() -> T) -> Result<T> {
        let generator = self
            .states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name)
            .ok_or_else(|| {
                Error::invalid(
                    "RngTracker::fork",
                    format!("no state `{name}` (add it first, or it is forked already)"),
                )
            })?;
        let (out, after) = crate::tensor::with_generator(generator, f);
        self.states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), after);
        Ok(out)
    }
}

/// The feed-forward half of a transformer block split Megatron's way: `fc1` column-parallel
/// (`d_model → d_ff`, each rank `d_ff/n` features), GELU (tanh form), `fc2` row-parallel
/// (`d_ff → d_model`, partial sums combined): one collective forward and one backward.
pub struct ParallelMlp {
    fc1: ColumnParallelLinear,
    fc2: RowParallelLinear,
}

impl ParallelMlp {
    /// `Linear(d_model, d_ff)`, `Linear(d_ff, d_model)` split over `group`.
    pub fn new(d_model: usize, d_ff: usize, group: &ProcessGroup) -> Result<ParallelMlp> {
        Ok(ParallelMlp {
            fc1: ColumnParallelLinear::new(d_model, d_ff, group)?,
            fc2: RowParallelLinear::new(d_ff, d_model, group)?,
        })
    }
}

impl Layer for ParallelMlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&F::gelu(&self.fc1.forward(x)?, true)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("fc1".into(), &self.fc1), ("fc2".into(), &self.fc2)]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![("fc1".into(), &mut self.fc1), ("fc2".into(), &mut self.fc2)]
    }
}

/// Causal multi-head self-attention split by heads: `q`, `k`, `v` column-parallel (each rank
/// computes `heads/n` heads), `out` row-parallel.
pub struct ParallelSelfAttention {
    q: ColumnParallelLinear,
    k: ColumnParallelLinear,
    v: ColumnParallelLinear,
    out: RowParallelLinear,
    local_heads: usize,
    head_dim: usize,
}

impl ParallelSelfAttention {
    /// `heads` heads over `d_model` features, split over `group` (which must divide `heads`).
    pub fn new(d_model: usize, heads: usize, group: &ProcessGroup) -> Result<ParallelSelfAttention> {
        if heads == 0 || !d_model.is_multiple_of(heads) {
            return Err(Error::invalid(
                "ParallelSelfAttention",
                format!("d_model {d_model} does not split into {heads} heads"),
            ));
        }
        let local_heads = part("ParallelSelfAttention", "heads", heads, group)?;
        Ok(ParallelSelfAttention {
            q: ColumnParallelLinear::new(d_model, d_model, group)?,
            k: ColumnParallelLinear::new(d_model, d_model, group)?,
            v: ColumnParallelLinear::new(d_model, d_model, group)?,
            out: RowParallelLinear::new(d_model, d_model, group)?,
            local_heads,
            head_dim: d_model / heads,
        })
    }
}

impl Layer for ParallelSelfAttention {
    /// `x`: `[batch, seq, d_model]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [b, s, _] = x.shape()[..] else {
            return Err(Error::invalid(
                "ParallelSelfAttention",
                format!("expects [batch, seq, d_model], got {}", x.tensor_type()),
            ));
        };
        let (h, d) = (self.local_heads as i64, self.head_dim as i64);
        let heads = |t: Tensor| t.reshape(&[b as i64, s as i64, h, d])?.transpose(&[0, 2, 1, 3]);
        let q = heads(self.q.forward(x)?)?;
        let k = heads(self.k.forward(x)?)?;
        let v = heads(self.v.forward(x)?)?;
        let a = F::scaled_dot_product_attention(&q, &k, &v, None, true, None)?;
        let a = a.transpose(&[0, 2, 1, 3])?.reshape(&[b as i64, s as i64, h * d])?;
        self.out.forward(&a)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("q".into(), &self.q),
            ("k".into(), &self.k),
            ("v".into(), &self.v),
            ("out".into(), &self.out),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("q".into(), &mut self.q),
            ("k".into(), &mut self.k),
            ("v".into(), &mut self.v),
            ("out".into(), &mut self.out),
        ]
    }
}

/// A pre-norm GPT block split over `group`: `x + attn(ln1(x))`, then `h + mlp(ln2(h))`, with
/// the layer norms replicated.
pub struct ParallelTransformerLayer {
    ln1: LayerNorm,
    attn: ParallelSelfAttention,
    ln2: LayerNorm,
    mlp: ParallelMlp,
}

impl ParallelTransformerLayer {
    /// A block of `d_model` features, `heads` heads and a `d_ff`-wide MLP, split over `group`.
    pub fn new(d_model: usize, heads: usize, d_ff: usize, group: &ProcessGroup) -> Result<ParallelTransformerLayer> {
        Ok(ParallelTransformerLayer {
            ln1: LayerNorm::new(&[d_model])?,
            attn: ParallelSelfAttention::new(d_model, heads, group)?,
            ln2: LayerNorm::new(&[d_model])?,
            mlp: ParallelMlp::new(d_model, d_ff, group)?,
        })
    }
}

impl Layer for ParallelTransformerLayer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = (x + &self.attn.forward(&self.ln1.forward(x)?)?)?;
        &h + &self.mlp.forward(&self.ln2.forward(&h)?)?
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("ln1".into(), &self.ln1),
            ("attn".into(), &self.attn),
            ("ln2".into(), &self.ln2),
            ("mlp".into(), &self.mlp),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("ln1".into(), &mut self.ln1),
            ("attn".into(), &mut self.attn),
            ("ln2".into(), &mut self.ln2),
            ("mlp".into(), &mut self.mlp),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask() -> Vec<f32> {
        let ones = crate::tensor::ones(&[32], DType::F32).unwrap();
        F::dropout(&ones, 0.5, true).unwrap().to_vec::<f32>().unwrap()
    }

    #[test]
    fn a_tracked_state_goes_on_where_it_stopped() {
        // (Only tracked draws: other tests share the global generator.)
        let tracker = RngTracker::new();
        tracker.add("tp", 7).unwrap();
        assert!(tracker.add("tp", 8).is_err());
        let first = tracker.fork("tp", mask).unwrap();
        let second = tracker.fork("tp", mask).unwrap();
        assert_ne!(first, second, "the state advanced");
        let again = RngTracker::new();
        again.add("tp", 7).unwrap();
        assert_eq!(again.fork("tp", mask).unwrap(), first);
        assert_eq!(again.fork("tp", mask).unwrap(), second);
        assert!(
            tracker
                .fork("none", mask)
                .unwrap_err()
                .to_string()
                .contains("no state `none`")
        );
    }

    #[test]
    fn layers_refuse_sizes_the_group_does_not_divide() {
        // A group of one divides everything; the checks name the layer and the size.
        let world = crate::distributed::init().unwrap();
        assert!(ColumnParallelLinear::new(4, 6, &world).is_ok());
        let e = part("RowParallelLinear", "in_features", 7, &world);
        assert_eq!(e.unwrap(), 7);
        let e = ParallelSelfAttention::new(10, 4, &world).err().unwrap().to_string();
        assert!(e.contains("does not split into 4 heads"), "{e}");
    }
}
