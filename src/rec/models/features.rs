//! The pieces both click-through-rate models share: the configuration, input checks, the field
//! embedding table, the first-order (linear) term and the MLP.

use crate::error::{Error, Result};
use crate::nn::{Dropout, Embedding, Layer, Linear, ReLU, Sequential};
use crate::tensor::Tensor;
use oar_ir::DType;

/// The hyper-parameters of [`super::WideDeep`] and [`super::DeepFM`].
#[derive(Clone, Debug, PartialEq)]
pub struct CtrConfig {
    /// Vocabulary size of each sparse field (`F = field_dims.len()` fields).
    pub field_dims: Vec<usize>,
    /// Number of dense features `D` (may be 0).
    pub dense_dim: usize,
    /// Width `K` of each field embedding.
    pub embed_dim: usize,
    /// Hidden widths of the deep MLP (ReLU after each; a final linear layer gives one logit).
    pub hidden_sizes: Vec<usize>,
    /// Dropout after each hidden layer of the MLP (training only).
    pub dropout: f64,
}

impl CtrConfig {
    pub(super) fn validate(&self, model: &str) -> Result<()> {
        if self.field_dims.is_empty() || self.field_dims.contains(&0) {
            return Err(Error::invalid(
                model,
                format!("field_dims must be non-empty and positive, got {:?}", self.field_dims),
            ));
        }
        if self.embed_dim == 0 || self.hidden_sizes.contains(&0) {
            return Err(Error::invalid(
                model,
                format!(
                    "embed_dim ({}) and hidden_sizes ({:?}) must be positive",
                    self.embed_dim, self.hidden_sizes
                ),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::invalid(
                model,
                format!("dropout {} must be in [0, 1)", self.dropout),
            ));
        }
        Ok(())
    }

    /// Number of sparse fields `F`.
    pub(super) fn num_fields(&self) -> usize {
        self.field_dims.len()
    }
}

/// Checked model inputs: dense `[N, D]` in the parameter dtype (`None` when `D = 0`) and
/// sparse ids `[N, F]` as i64.
pub(super) struct Inputs {
    pub(super) dense: Option<Tensor>,
    pub(super) sparse: Tensor,
}

/// Ids given as f64 values, row-major `[N, F]`: each must be a whole number in its field's range.
fn check_ids(model: &str, ids: &[f64], field_dims: &[usize]) -> Result<()> {
    let f = field_dims.len();
    match ids
        .iter()
        .enumerate()
        .find(|&(k, &id)| id.fract() != 0.0 || id < 0.0 || id >= field_dims[k % f] as f64)
    {
        Some((k, id)) => Err(Error::invalid(
            model,
            format!(
                "sparse id {id} of field {} (example {}) is not in 0..{}",
                k % f,
                k / f,
                field_dims[k % f]
            ),
        )),
        None => Ok(()),
    }
}

impl Inputs {
    /// Check `dense [N, D]` and `sparse [N, F]` against `c` and the parameter dtype `dtype`.
    /// With `vocab`, ids are checked against `field_dims` (a local table).
    pub(super) fn parts(
        model: &str,
        c: &CtrConfig,
        dtype: DType,
        vocab: bool,
        dense: &Tensor,
        sparse: &Tensor,
    ) -> Result<Inputs> {
        let (ds, ss) = (dense.shape(), sparse.shape());
        let sd = sparse.dtype();
        let ok = ds.len() == 2
            && ss.len() == 2
            && ds[0] == ss[0]
            && ds[1] == c.dense_dim
            && ss[1] == c.num_fields()
            && dense.dtype() == dtype
            && !sd.is_float()
            && sd != DType::Bool;
        if !ok {
            return Err(Error::invalid(
                model,
                format!(
                    "expects dense {dtype}[N, {}] and integer sparse ids [N, {}], got {} and {}",
                    c.dense_dim,
                    c.num_fields(),
                    dense.tensor_type(),
                    sparse.tensor_type()
                ),
            ));
        }
        if vocab && !sparse.is_traced() {
            check_ids(model, &sparse.try_data()?.to_f64_vec(), &c.field_dims)?;
        }
        Ok(Inputs {
            dense: (c.dense_dim > 0).then(|| dense.clone()),
            sparse: sparse.cast(DType::I64)?,
        })
    }

    /// Split the packed `x [N, D + F]` (dense features, then ids as whole numbers).
    pub(super) fn packed(model: &str, c: &CtrConfig, dtype: DType, vocab: bool, x: &Tensor) -> Result<Inputs> {
        let (d, f) = (c.dense_dim, c.num_fields());
        let s = x.shape();
        if s.len() != 2 || s[1] != d + f || x.dtype() != dtype {
            return Err(Error::invalid(
                model,
                format!(
                    "expects packed input {dtype}[N, D + F = {d} + {f}] (dense features, then sparse ids), got {}",
                    x.tensor_type()
                ),
            ));
        }
        let ids = x.slice(1, d as i64, (d + f) as i64, 1)?;
        if vocab && !ids.is_traced() {
            check_ids(model, &ids.try_data()?.to_f64_vec(), &c.field_dims)?;
        }
        Ok(Inputs {
            dense: (d > 0).then(|| x.slice(1, 0, d as i64, 1)).transpose()?,
            sparse: ids.cast(DType::I64)?,
        })
    }
}

/// The field embeddings: one table for every field, either here (field `f`'s id `i` is row
/// `offsets[f] + i`) or elsewhere — a layer such as `oar::ps::SparseEmbedding` that maps the
/// ids, global feature ids then, as they are.
pub(super) enum FieldEmbedding {
    Local { table: Embedding, offsets: Tensor },
    External(Box<dyn Layer>),
}

impl FieldEmbedding {
    pub(super) fn new(field_dims: &[usize], dim: usize) -> Result<FieldEmbedding> {
        let offsets: Vec<i64> = field_dims
            .iter()
            .scan(0i64, |acc, &n| {
                let start = *acc;
                *acc += n as i64;
                Some(start)
            })
            .collect();
        Ok(FieldEmbedding::Local {
            table: Embedding::new(field_dims.iter().sum(), dim)?,
            offsets: Tensor::from_vec(offsets, &[field_dims.len()])?,
        })
    }

    /// The parameters' dtype (an external table's rows are f32).
    pub(super) fn dtype(&self) -> DType {
        match self {
            FieldEmbedding::Local { table, .. } => table.weight().dtype(),
            FieldEmbedding::External(_) => DType::F32,
        }
    }

    /// Whether ids are checked against `field_dims` (local tables) or global (external).
    pub(super) fn checks_vocabulary(&self) -> bool {
        matches!(self, FieldEmbedding::Local { .. })
    }
}

impl Layer for FieldEmbedding {
    /// Rows `[N, F, dim]` of checked i64 ids `[N, F]`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            FieldEmbedding::Local { table, offsets } => table.forward(&(ids + offsets)?),
            FieldEmbedding::External(layer) => layer.forward(ids),
        }
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        match self {
            FieldEmbedding::Local { table, .. } => table.own_parameters(),
            FieldEmbedding::External(_) => Vec::new(),
        }
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        match self {
            FieldEmbedding::Local { .. } => Vec::new(),
            FieldEmbedding::External(layer) => vec![("table".into(), layer.as_ref())],
        }
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        match self {
            FieldEmbedding::Local { .. } => Vec::new(),
            FieldEmbedding::External(layer) => vec![("table".into(), layer.as_mut())],
        }
    }
}

/// The first-order term `Σ_f w[id_f] + dense · w_dense + b` (`sparse.weight [Σ field_dims, 1]`,
/// `dense.weight [D, 1]`, `bias [1]`).
pub(super) struct FirstOrder {
    config: CtrConfig,
    sparse: FieldEmbedding,
    dense: Option<Linear>,
    bias: Tensor,
}

impl FirstOrder {
    /// With `sparse` as the weights of the ids (rows of width 1).
    pub(super) fn with_table(c: &CtrConfig, sparse: FieldEmbedding) -> Result<FirstOrder> {
        Ok(FirstOrder {
            config: c.clone(),
            sparse,
            dense: (c.dense_dim > 0)
                .then(|| Ok::<_, Error>(Linear::new(c.dense_dim, 1)?.bias(false)))
                .transpose()?,
            bias: Tensor::parameter(crate::tensor::zeros(&[1], DType::F32)?.data())?,
        })
    }

    /// `[N, 1]`.
    pub(super) fn logit(&self, x: &Inputs) -> Result<Tensor> {
        let mut y = (&self.sparse.forward(&x.sparse)?.sum(&[1], false)? + &self.bias)?;
        if let (Some(lin), Some(dense)) = (&self.dense, &x.dense) {
            y = (&y + &lin.forward(dense)?)?;
        }
        Ok(y)
    }
}

impl Layer for FirstOrder {
    /// The first-order logit `[N, 1]` of a packed input (see the module docs).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.logit(&Inputs::packed(
            "FirstOrder",
            &self.config,
            self.bias.dtype(),
            self.sparse.checks_vocabulary(),
            x,
        )?)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("bias".into(), self.bias.clone())]
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        let mut v: Vec<(String, &dyn Layer)> = vec![("sparse".into(), &self.sparse)];
        if let Some(d) = &self.dense {
            v.push(("dense".into(), d));
        }
        v
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        let mut v: Vec<(String, &mut dyn Layer)> = vec![("sparse".into(), &mut self.sparse)];
        if let Some(d) = &mut self.dense {
            v.push(("dense".into(), d));
        }
        v
    }
}

/// `Linear → ReLU (→ Dropout)` per hidden width, then `Linear(last, 1)`.
pub(super) fn mlp(input: usize, hidden: &[usize], dropout: f64) -> Result<Sequential> {
    let mut seq = Sequential::new();
    let mut width = input;
    for &h in hidden {
        seq = seq.add(Linear::new(width, h)?).add(ReLU);
        if dropout > 0.0 {
            seq = seq.add(Dropout::new(dropout)?);
        }
        width = h;
    }
    Ok(seq.add(Linear::new(width, 1)?))
}
