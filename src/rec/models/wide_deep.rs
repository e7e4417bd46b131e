//! Wide & Deep (Cheng et al. 2016), as PaddleRec's `wide_deep` with a wide part over the sparse
//! fields too: `sigmoid(wide + deep)`.

use super::features::{CtrConfig, FieldEmbedding, FirstOrder, Inputs, mlp};
use crate::error::Result;
use crate::nn::functional as F;
use crate::nn::{Layer, Sequential};
use crate::tensor::{Tensor, concat};

/// Wide & Deep: the wide part is linear in the features (`wide.sparse.weight [Σ field_dims, 1]`
/// — an embedding of width 1 per field —, `wide.dense.weight [D, 1]`, `wide.bias [1]`); the deep
/// part embeds each field (`embedding.weight [Σ field_dims, K]`), concatenates the `F` embeddings
/// with the dense features and runs an MLP (`deep.{i}.…`) to one logit. The prediction is
/// `sigmoid(wide + deep)`. Inputs: see [the module docs](super).
pub struct WideDeep {
    config: CtrConfig,
    wide: FirstOrder,
    embedding: FieldEmbedding,
    deep: Sequential,
}

impl WideDeep {
    /// A randomly initialized model (f32).
    pub fn new(config: &CtrConfig) -> Result<WideDeep> {
        WideDeep::build(
            config,
            FieldEmbedding::new(&config.field_dims, 1)?,
            FieldEmbedding::new(&config.field_dims, config.embed_dim)?,
        )
    }

    /// A model whose tables live elsewhere, e.g. on a parameter server
    /// (`oar::ps::SparseEmbedding`): `wide` maps ids `[N, F]` to their weights `[N, F, 1]`,
    /// `embedding` to their embeddings `[N, F, K]`. Ids are then global feature ids, not
    /// checked against `field_dims` (whose length still gives `F`); the model's own
    /// parameters are the dense ones.
    pub fn with_tables(config: &CtrConfig, wide: Box<dyn Layer>, embedding: Box<dyn Layer>) -> Result<WideDeep> {
        WideDeep::build(
            config,
            FieldEmbedding::External(wide),
            FieldEmbedding::External(embedding),
        )
    }

    fn build(config: &CtrConfig, wide: FieldEmbedding, embedding: FieldEmbedding) -> Result<WideDeep> {
        config.validate("WideDeep")?;
        let deep_in = config.num_fields() * config.embed_dim + config.dense_dim;
        Ok(WideDeep {
            config: config.clone(),
            wide: FirstOrder::with_table(config, wide)?,
            embedding,
            deep: mlp(deep_in, &config.hidden_sizes, config.dropout)?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CtrConfig {
        &self.config
    }

    fn logit(&self, x: &Inputs) -> Result<Tensor> {
        let emb = self.embedding.forward(&x.sparse)?.flatten(1, -1)?;
        let deep_in = match &x.dense {
            Some(d) => concat(&[&emb, d], 1)?,
            None => emb,
        };
        &self.wide.logit(x)? + &self.deep.forward(&deep_in)?
    }

    fn param_dtype(&self) -> oar_ir::DType {
        self.embedding.dtype()
    }

    /// The logit `wide + deep` `[N, 1]` of dense features `[N, D]` and sparse ids `[N, F]` (for
    /// `BCEWithLogitsLoss`).
    pub fn logits(&self, dense: &Tensor, sparse: &Tensor) -> Result<Tensor> {
        self.logit(&Inputs::parts(
            "WideDeep",
            &self.config,
            self.param_dtype(),
            self.embedding.checks_vocabulary(),
            dense,
            sparse,
        )?)
    }

    /// The click probability `sigmoid(wide + deep)` `[N, 1]` of dense features `[N, D]` and
    /// sparse ids `[N, F]`.
    pub fn forward_parts(&self, dense: &Tensor, sparse: &Tensor) -> Result<Tensor> {
        F::sigmoid(&self.logits(dense, sparse)?)
    }
}

impl Layer for WideDeep {
    /// The click probability `[N, 1]` of the packed input `[N, D + F]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::sigmoid(&self.logit(&Inputs::packed(
            "WideDeep",
            &self.config,
            self.param_dtype(),
            self.embedding.checks_vocabulary(),
            x,
        )?)?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("wide".into(), &self.wide as &dyn Layer),
            ("embedding".into(), &self.embedding),
            ("deep".into(), &self.deep),
        ]
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        vec![
            ("wide".into(), &mut self.wide as &mut dyn Layer),
            ("embedding".into(), &mut self.embedding),
            ("deep".into(), &mut self.deep),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::{DType, TensorData};

    fn count(l: &dyn Layer) -> usize {
        l.parameters().iter().map(Tensor::numel).sum()
    }

    fn config(dense_dim: usize) -> CtrConfig {
        CtrConfig {
            field_dims: vec![3, 2],
            dense_dim,
            embed_dim: 2,
            hidden_sizes: vec![3],
            dropout: 0.0,
        }
    }

    #[test]
    fn parameter_count_follows_the_formula() {
        let c = CtrConfig {
            field_dims: vec![10, 20, 30],
            dense_dim: 13,
            embed_dim: 8,
            hidden_sizes: vec![64, 32],
            dropout: 0.2,
        };
        let (v, f, d, k) = (60, 3, 13, 8);
        // Wide (Σ field_dims + D + 1), embeddings, MLP over F·K + D.
        let mlp = |input: usize| (input * 64 + 64) + (64 * 32 + 32) + (32 + 1);
        assert_eq!(count(&WideDeep::new(&c).unwrap()), (v + d + 1) + v * k + mlp(f * k + d));
        let c = CtrConfig { dense_dim: 0, ..c };
        assert_eq!(count(&WideDeep::new(&c).unwrap()), (v + 1) + v * k + mlp(f * k));
        let sd = WideDeep::new(&config(2)).unwrap().state_dict();
        let shapes: Vec<(&str, Vec<usize>)> = sd.iter().map(|(k, v)| (k.as_str(), v.shape())).collect();
        assert_eq!(
            shapes,
            [
                ("deep.0.bias", vec![3]),
                ("deep.0.weight", vec![6, 3]),
                ("deep.2.bias", vec![1]),
                ("deep.2.weight", vec![3, 1]),
                ("embedding.weight", vec![5, 2]),
                ("wide.bias", vec![1]),
                ("wide.dense.weight", vec![2, 1]),
                ("wide.sparse.weight", vec![5, 1]),
            ]
        );
    }

    #[test]
    fn logits_match_a_computation_by_hand() {
        for d in [2, 0] {
            let m = WideDeep::new(&config(d)).unwrap();
            m.to_dtype(DType::F64).unwrap();
            for (i, (_, p)) in m.named_parameters().into_iter().enumerate() {
                let v: Vec<f64> = (0..p.numel())
                    .map(|k| ((k * 7 + i * 3) % 11) as f64 / 5.0 - 1.0)
                    .collect();
                p.set_data(TensorData::from_vec(p.shape(), v).unwrap()).unwrap();
            }
            let p: std::collections::BTreeMap<String, Vec<f64>> = m
                .state_dict()
                .into_iter()
                .map(|(k, v)| (k, v.to_vec::<f64>().unwrap()))
                .collect();
            let dense = [[0.5, -1.0], [2.0, 0.25]];
            let sparse = [[2i64, 1], [0, 0]];
            let dense_t = Tensor::from_vec(dense.iter().flat_map(|r| r[..d].to_vec()).collect(), &[2, d]).unwrap();
            let sparse_t = Tensor::from_vec(sparse.concat(), &[2, 2]).unwrap();
            let y = m.logits(&dense_t, &sparse_t).unwrap().to_vec::<f64>().unwrap();
            for s in 0..2 {
                let rows = [sparse[s][0] as usize, 3 + sparse[s][1] as usize];
                let mut wide = rows.iter().map(|&r| p["wide.sparse.weight"][r]).sum::<f64>() + p["wide.bias"][0];
                let mut deep_in: Vec<f64> = rows
                    .iter()
                    .flat_map(|&r| p["embedding.weight"][r * 2..r * 2 + 2].to_vec())
                    .collect();
                for j in 0..d {
                    wide += dense[s][j] * p["wide.dense.weight"][j];
                    deep_in.push(dense[s][j]);
                }
                let (w1, b1, w2, b2) = (
                    &p["deep.0.weight"],
                    &p["deep.0.bias"],
                    &p["deep.2.weight"],
                    &p["deep.2.bias"],
                );
                let hidden: Vec<f64> = (0..3)
                    .map(|o| (b1[o] + deep_in.iter().enumerate().map(|(i, x)| x * w1[i * 3 + o]).sum::<f64>()).max(0.0))
                    .collect();
                let deep = b2[0] + (0..3).map(|i| hidden[i] * w2[i]).sum::<f64>();
                assert!(
                    (y[s] - (wide + deep)).abs() < 1e-12,
                    "D={d} example {s}: {} vs {}",
                    y[s],
                    wide + deep
                );
            }
            // The packed layout gives the same probabilities.
            let packed: Vec<f64> = (0..2)
                .flat_map(|s| {
                    dense[s][..d]
                        .iter()
                        .copied()
                        .chain(sparse[s].iter().map(|&i| i as f64))
                        .collect::<Vec<_>>()
                })
                .collect();
            let packed = Tensor::from_vec(packed, &[2, d + 2]).unwrap();
            assert_eq!(
                m.forward(&packed).unwrap().to_vec::<f64>().unwrap(),
                m.forward_parts(&dense_t, &sparse_t).unwrap().to_vec::<f64>().unwrap()
            );
        }
    }

    #[test]
    fn dropout_acts_in_training_only() {
        let mut m = WideDeep::new(&CtrConfig {
            dropout: 0.5,
            hidden_sizes: vec![64],
            ..config(2)
        })
        .unwrap();
        let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 1.0], &[1, 4]).unwrap();
        let run = |m: &WideDeep| m.forward(&x).unwrap().to_vec::<f32>().unwrap();
        assert!((0..5).any(|_| run(&m) != run(&m)));
        m.eval();
        assert_eq!(run(&m), run(&m));
        let e = m.forward(&Tensor::from_vec(vec![0.5f32, -1.0, 3.0, 1.0], &[1, 4]).unwrap());
        assert!(e.unwrap_err().to_string().contains("WideDeep"));
    }

    /// Tables given from outside (as a parameter server's): ids are global (field `f`'s id `i`
    /// is `offset_f + i` here), the model's own parameters are the dense ones, and with the
    /// same values it computes what the model with its own tables does; eval mode reaches the
    /// tables.
    #[test]
    fn external_tables_compute_as_own_ones() {
        let c = config(2);
        let own = WideDeep::new(&c).unwrap();
        let named: std::collections::BTreeMap<String, Tensor> = own.named_parameters().into_iter().collect();
        let table = |name: &str, dim: usize| {
            let e = crate::nn::Embedding::new(5, dim).unwrap();
            e.weight().set_data(named[name].data()).unwrap();
            e
        };
        /// A table that tracks its training flag.
        struct Probe(crate::nn::Embedding, std::rc::Rc<std::cell::Cell<bool>>);
        impl Layer for Probe {
            fn forward(&self, x: &Tensor) -> crate::Result<Tensor> {
                self.0.forward(x)
            }
            fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
                vec![("0".into(), &self.0)]
            }
            fn set_training(&mut self, training: bool) {
                self.1.set(training);
            }
        }
        let flag = std::rc::Rc::new(std::cell::Cell::new(true));
        let wide = table("wide.sparse.weight", 1);
        let deep = Probe(table("embedding.weight", 2), flag.clone());
        let mut ext = WideDeep::with_tables(&c, Box::new(wide), Box::new(deep)).unwrap();
        // A local layer given as a table keeps its parameters, under `.table`.
        let ext_params = ext.named_parameters();
        assert_eq!(count(&ext), count(&own));
        for (k, t) in &ext_params {
            t.set_data(named[k.replace(".table.0", "").replace(".table", "").as_str()].data())
                .unwrap();
        }
        let dense = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 1.0], &[2, 2]).unwrap();
        let local = Tensor::from_vec(vec![2i64, 1, 0, 0], &[2, 2]).unwrap();
        let global = Tensor::from_vec(vec![2i64, 4, 0, 3], &[2, 2]).unwrap();
        let a = own.logits(&dense, &local).unwrap().to_vec::<f32>().unwrap();
        let b = ext.logits(&dense, &global).unwrap().to_vec::<f32>().unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
        // Global ids are not checked against field_dims.
        assert!(
            ext.logits(&dense, &Tensor::from_vec(vec![4i64, 4, 4, 4], &[2, 2]).unwrap())
                .is_ok()
        );
        ext.eval();
        assert!(!flag.get(), "eval reaches the tables");
    }
}
