//! DeepFM (Guo et al. 2017), as PaddleRec's `deepfm`: a first-order term, the factorization
//! machine's second-order term and an MLP, all three reading the same field embeddings;
//! `sigmoid(first + second + deep)`.

use super::features::{CtrConfig, FieldEmbedding, FirstOrder, Inputs, mlp};
use crate::error::Result;
use crate::nn::functional as F;
use crate::nn::{Layer, Sequential};
use crate::tensor::{Tensor, concat};

/// The factorization machine's pairwise term of field embeddings `e [N, M, K]`:
/// `Σ_{i<j} ⟨e_i, e_j⟩ = ½ Σ_k ((Σ_i e_ik)² − Σ_i e_ik²)`, as `[N, 1]`.
fn fm_second_order(e: &Tensor) -> Result<Tensor> {
    let sum = e.sum(&[1], false)?;
    let sum_sq = e.multiply(e)?.sum(&[1], false)?;
    sum.multiply(&sum)?.subtract(&sum_sq)?.sum(&[1], true)?.scale(0.5, 0.0)
}

/// DeepFM: the first-order term `linear.sparse.weight [Σ field_dims, 1]`, `linear.dense.weight
/// [D, 1]`, `linear.bias [1]`; `M = F + D` field embeddings `[N, M, K]` — each sparse field's row
/// of `embedding.weight [Σ field_dims, K]`, and each dense feature `j` as `x_j · v_j` with `v =
/// dense_embedding [D, K]` (PaddleRec's dense fields); the FM second-order term over those `M`
/// embeddings; and an MLP (`deep.{i}.…`) over their concatenation `[N, M·K]`. The prediction is
/// `sigmoid(first + second + deep)`. Inputs: see [the module docs](super).
pub struct DeepFM {
    config: CtrConfig,
    linear: FirstOrder,
    embedding: FieldEmbedding,
    dense_embedding: Option<Tensor>,
    deep: Sequential,
}

impl DeepFM {
    /// A randomly initialized model (f32); `dense_embedding` is Xavier-uniform like the table.
    pub fn new(config: &CtrConfig) -> Result<DeepFM> {
        DeepFM::build(
            config,
            FieldEmbedding::new(&config.field_dims, 1)?,
            FieldEmbedding::new(&config.field_dims, config.embed_dim)?,
        )
    }

    /// A model whose tables live elsewhere, e.g. on a parameter server
    /// (`oar::ps::SparseEmbedding`): `linear` maps ids `[N, F]` to their first-order weights
    /// `[N, F, 1]`, `embedding` to their embeddings `[N, F, K]`. Ids are then global feature
    /// ids, not checked against `field_dims` (whose length still gives `F`); the model's own
    /// parameters are the dense ones.
    pub fn with_tables(config: &CtrConfig, linear: Box<dyn Layer>, embedding: Box<dyn Layer>) -> Result<DeepFM> {
        DeepFM::build(
            config,
            FieldEmbedding::External(linear),
            FieldEmbedding::External(embedding),
        )
    }

    fn build(config: &CtrConfig, linear: FieldEmbedding, embedding: FieldEmbedding) -> Result<DeepFM> {
        config.validate("DeepFM")?;
        let (d, k) = (config.dense_dim, config.embed_dim);
        let dense_embedding = (d > 0)
            .then(|| {
                let v = Tensor::parameter(crate::tensor::zeros(&[d, k], oar_ir::DType::F32)?.data())?;
                crate::nn::init::xavier_uniform(&v, 1.0)?;
                Ok::<_, crate::Error>(v)
            })
            .transpose()?;
        Ok(DeepFM {
            config: config.clone(),
            linear: FirstOrder::with_table(config, linear)?,
            embedding,
            dense_embedding,
            deep: mlp((config.num_fields() + d) * k, &config.hidden_sizes, config.dropout)?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CtrConfig {
        &self.config
    }

    fn param_dtype(&self) -> oar_ir::DType {
        self.embedding.dtype()
    }

    fn logit(&self, x: &Inputs) -> Result<Tensor> {
        let sparse = self.embedding.forward(&x.sparse)?;
        let fields = match (&x.dense, &self.dense_embedding) {
            // [N, D, 1] · [D, K] → [N, D, K].
            (Some(d), Some(v)) => concat(&[&sparse, &d.unsqueeze(-1)?.multiply(v)?], 1)?,
            _ => sparse,
        };
        let first = self.linear.logit(x)?;
        let second = fm_second_order(&fields)?;
        let deep = self.deep.forward(&fields.flatten(1, -1)?)?;
        &(&first + &second)? + &deep
    }

    /// The logit `first + second + deep` `[N, 1]` of dense features `[N, D]` and sparse ids
    /// `[N, F]` (for `BCEWithLogitsLoss`).
    pub fn logits(&self, dense: &Tensor, sparse: &Tensor) -> Result<Tensor> {
        self.logit(&Inputs::parts(
            "DeepFM",
            &self.config,
            self.param_dtype(),
            self.embedding.checks_vocabulary(),
            dense,
            sparse,
        )?)
    }

    /// The click probability `[N, 1]` of dense features `[N, D]` and sparse ids `[N, F]`.
    pub fn forward_parts(&self, dense: &Tensor, sparse: &Tensor) -> Result<Tensor> {
        F::sigmoid(&self.logits(dense, sparse)?)
    }
}

impl Layer for DeepFM {
    /// The click probability `[N, 1]` of the packed input `[N, D + F]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::sigmoid(&self.logit(&Inputs::packed(
            "DeepFM",
            &self.config,
            self.param_dtype(),
            self.embedding.checks_vocabulary(),
            x,
        )?)?)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        self.dense_embedding
            .iter()
            .map(|v| ("dense_embedding".to_string(), v.clone()))
            .collect()
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("linear".into(), &self.linear as &dyn Layer),
            ("embedding".into(), &self.embedding),
            ("deep".into(), &self.deep),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("linear".into(), &mut self.linear as &mut dyn Layer),
            ("embedding".into(), &mut self.embedding),
            ("deep".into(), &mut self.deep),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::{DType, TensorData};
    use std::collections::BTreeMap;

    fn count(l: &dyn Layer) -> usize {
        l.parameters().iter().map(Tensor::numel).sum()
    }

    fn vals(t: &Tensor) -> Vec<f64> {
        t.to_vec::<f64>().unwrap()
    }

    /// Deterministic values in (-0.9, 0.9).
    fn pattern(n: usize, seed: u64) -> Vec<f64> {
        (0..n)
            .map(|i| (((i as u64 * 2654435761 + seed * 40503) % 1000) as f64 / 500.0 - 1.0) * 0.9)
            .collect()
    }

    /// Two fields of 3 and 2 ids, 2 dense features, embeddings of 2, one hidden layer of 3.
    fn tiny() -> CtrConfig {
        CtrConfig {
            field_dims: vec![3, 2],
            dense_dim: 2,
            embed_dim: 2,
            hidden_sizes: vec![3],
            dropout: 0.0,
        }
    }

    /// The tiny model in f64 with every parameter set to distinct values.
    fn tiny_f64() -> (DeepFM, BTreeMap<String, Vec<f64>>) {
        let m = DeepFM::new(&tiny()).unwrap();
        m.to_dtype(DType::F64).unwrap();
        for (i, (_, p)) in m.named_parameters().into_iter().enumerate() {
            p.set_data(TensorData::from_vec(p.shape(), pattern(p.numel(), 7 + i as u64)).unwrap())
                .unwrap();
        }
        let p = m.named_parameters().into_iter().map(|(k, v)| (k, vals(&v))).collect();
        (m, p)
    }

    /// `x W + b` for one row, Paddle's `W [in, out]`.
    fn affine(x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
        (0..b.len())
            .map(|o| b[o] + x.iter().enumerate().map(|(i, xi)| xi * w[i * b.len() + o]).sum::<f64>())
            .collect()
    }

    #[test]
    fn parameter_count_follows_the_formula() {
        let c = CtrConfig {
            field_dims: vec![10, 20, 30],
            dense_dim: 13,
            embed_dim: 8,
            hidden_sizes: vec![64, 32],
            dropout: 0.5,
        };
        let (v, f, d, k) = (60, 3, 13, 8);
        // First order (Σ field_dims + D + 1), embeddings, dense embeddings, MLP over (F + D)·K.
        let mlp = ((f + d) * k * 64 + 64) + (64 * 32 + 32) + (32 + 1);
        assert_eq!(count(&DeepFM::new(&c).unwrap()), (v + d + 1) + v * k + d * k + mlp);
        let c = CtrConfig { dense_dim: 0, ..c };
        let mlp = (f * k * 64 + 64) + (64 * 32 + 32) + (32 + 1);
        assert_eq!(count(&DeepFM::new(&c).unwrap()), (v + 1) + v * k + mlp);
        let names: Vec<String> = DeepFM::new(&tiny())
            .unwrap()
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names,
            [
                "dense_embedding",
                "linear.bias",
                "linear.sparse.weight",
                "linear.dense.weight",
                "embedding.weight",
                "deep.0.weight",
                "deep.0.bias",
                "deep.2.weight",
                "deep.2.bias"
            ]
        );
    }

    #[test]
    fn fm_term_equals_the_explicit_pairwise_sum() {
        let (n, m, k) = (2, 3, 4);
        let e = pattern(n * m * k, 3);
        let y = vals(&fm_second_order(&Tensor::from_vec(e.clone(), &[n, m, k]).unwrap()).unwrap());
        let mut expect = Vec::new();
        for s in 0..n {
            let v = |i: usize, c: usize| e[(s * m + i) * k + c];
            let mut total = 0.0;
            for i in 0..m {
                for j in i + 1..m {
                    total += (0..k).map(|c| v(i, c) * v(j, c)).sum::<f64>();
                }
            }
            expect.push(total);
        }
        assert_eq!(y.len(), 2);
        assert!(
            y.iter().zip(&expect).all(|(a, b)| (a - b).abs() < 1e-12),
            "{y:?} vs {expect:?}"
        );
    }

    #[test]
    fn logits_match_a_computation_by_hand() {
        let (m, p) = tiny_f64();
        let dense = [[0.5, -1.0], [2.0, 0.25]];
        let sparse = [[2i64, 1], [0, 0]];
        let dense_t = Tensor::from_vec(dense.concat(), &[2, 2]).unwrap();
        let sparse_t = Tensor::from_vec(sparse.concat(), &[2, 2]).unwrap();
        let y = vals(&m.logits(&dense_t, &sparse_t).unwrap());
        let (emb, v) = (&p["embedding.weight"], &p["dense_embedding"]);
        for s in 0..2 {
            let rows = [sparse[s][0] as usize, 3 + sparse[s][1] as usize];
            let first = rows.iter().map(|&r| p["linear.sparse.weight"][r]).sum::<f64>()
                + dense[s][0] * p["linear.dense.weight"][0]
                + dense[s][1] * p["linear.dense.weight"][1]
                + p["linear.bias"][0];
            // Field embeddings: two sparse rows, then x_j · v_j for each dense feature.
            let mut fields: Vec<Vec<f64>> = rows.iter().map(|&r| emb[r * 2..r * 2 + 2].to_vec()).collect();
            fields.extend((0..2).map(|j| vec![dense[s][j] * v[j * 2], dense[s][j] * v[j * 2 + 1]]));
            let mut second = 0.0;
            for i in 0..4 {
                for j in i + 1..4 {
                    second += fields[i][0] * fields[j][0] + fields[i][1] * fields[j][1];
                }
            }
            let hidden: Vec<f64> = affine(&fields.concat(), &p["deep.0.weight"], &p["deep.0.bias"])
                .into_iter()
                .map(|x| x.max(0.0))
                .collect();
            let deep = affine(&hidden, &p["deep.2.weight"], &p["deep.2.bias"])[0];
            let expect = first + second + deep;
            assert!((y[s] - expect).abs() < 1e-12, "example {s}: {} vs {expect}", y[s]);
        }
        // The probability, and the packed layout (dense features, then ids) give the same.
        let prob = vals(&m.forward_parts(&dense_t, &sparse_t).unwrap());
        assert!((prob[0] - 1.0 / (1.0 + (-y[0]).exp())).abs() < 1e-12);
        let packed = Tensor::from_vec(vec![0.5, -1.0, 2.0, 1.0, 2.0, 0.25, 0.0, 0.0], &[2, 4]).unwrap();
        assert_eq!(vals(&m.forward(&packed).unwrap()), prob);
    }

    /// Check `d loss / d p[k]` from `backward` against central differences.
    fn check_grad(p: &Tensor, entries: &[usize], loss: &dyn Fn() -> Tensor, what: &str) {
        p.clear_grad();
        loss().backward().unwrap();
        let g = vals(&p.grad().unwrap());
        let orig = vals(p);
        for &k in entries {
            let eval = |d: f64| {
                let mut v = orig.clone();
                v[k] += d;
                p.set_data(TensorData::from_vec(p.shape(), v).unwrap()).unwrap();
                let _g = crate::autograd::no_grad();
                loss().item().unwrap()
            };
            let numeric = (eval(1e-6) - eval(-1e-6)) / 2e-6;
            p.set_data(TensorData::from_vec(p.shape(), orig.clone()).unwrap())
                .unwrap();
            assert!(
                (numeric - g[k]).abs() <= 1e-6 + 1e-5 * numeric.abs(),
                "{what}[{k}]: backward {} vs finite difference {numeric}",
                g[k]
            );
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        let (m, _) = tiny_f64();
        let params: BTreeMap<String, Tensor> = m.named_parameters().into_iter().collect();
        let dense = Tensor::from_vec(vec![0.5, -1.0, 2.0, 0.25], &[2, 2]).unwrap();
        let sparse = Tensor::from_vec(vec![2i64, 1, 0, 1], &[2, 2]).unwrap();
        let loss = || m.forward_parts(&dense, &sparse).unwrap().sum(&[], false).unwrap();
        // Rows 0, 2 (field 0) and 4 (field 1, id 1) of the shared table are used.
        check_grad(&params["embedding.weight"], &[0, 5, 9], &loss, "embedding");
        check_grad(&params["dense_embedding"], &[0, 3], &loss, "dense_embedding");
        check_grad(&params["linear.sparse.weight"], &[2, 4], &loss, "linear.sparse");
        check_grad(&params["deep.0.weight"], &[1, 7, 20], &loss, "deep.0.weight");
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let m = DeepFM::new(&tiny()).unwrap();
        let dense = Tensor::from_vec(vec![0f32; 4], &[2, 2]).unwrap();
        let ids = |v: Vec<i64>| Tensor::from_vec(v, &[2, 2]).unwrap();
        let e = m.logits(&dense, &ids(vec![0, 0, 1, 2])).unwrap_err().to_string();
        assert!(
            e.contains("DeepFM") && e.contains("field 1") && e.contains("0..2"),
            "{e}"
        );
        assert!(m.logits(&dense, &ids(vec![0, 0, -1, 0])).is_err());
        let e = m
            .logits(&dense, &Tensor::from_vec(vec![0i64; 3], &[1, 3]).unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("[N, 2]"), "{e}");
        let dense64 = Tensor::from_vec(vec![0f64; 4], &[2, 2]).unwrap();
        assert!(m.logits(&dense64, &ids(vec![0; 4])).is_err());
        assert!(
            m.logits(&dense, &Tensor::from_vec(vec![0f32; 4], &[2, 2]).unwrap())
                .is_err()
        );
        let packed = |v: Vec<f32>| Tensor::from_vec(v, &[1, 4]).unwrap();
        let e = m.forward(&packed(vec![0.0, 0.0, 1.5, 0.0])).unwrap_err().to_string();
        assert!(e.contains("1.5") && e.contains("field 0"), "{e}");
        assert!(m.forward(&Tensor::from_vec(vec![0f32; 3], &[1, 3]).unwrap()).is_err());
        for bad in [
            CtrConfig {
                field_dims: vec![],
                ..tiny()
            },
            CtrConfig {
                field_dims: vec![3, 0],
                ..tiny()
            },
            CtrConfig {
                hidden_sizes: vec![0],
                ..tiny()
            },
            CtrConfig {
                dropout: -0.1,
                ..tiny()
            },
        ] {
            assert!(DeepFM::new(&bad).is_err(), "{bad:?}");
        }
    }
}
