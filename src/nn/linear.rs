//! `Linear`: `y = x @ weight + bias` with Paddle's weight layout `[in_features, out_features]`.

use super::util::{ctx, param, recast};
use super::{Layer, functional as F, init};
use crate::error::Result;
use crate::quantization::{QuantPair, Quantizer};
use crate::tensor::Tensor;
use oar_ir::DType;

/// A fully connected layer. Initialization follows Paddle: weight Xavier-uniform
/// (`fan_in = in_features`, `fan_out = out_features`), bias zero. Parameters: `weight`
/// `[in, out]`, `bias` `[out]`.
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    in_features: usize,
    out_features: usize,
    quant: Option<QuantPair>,
}

impl Linear {
    /// A float32 layer mapping `in_features` to `out_features`.
    pub fn new(in_features: usize, out_features: usize) -> Result<Linear> {
        let weight = param(&[in_features, out_features], DType::F32)?;
        init::xavier_uniform(&weight, 1.0)?;
        Ok(Linear {
            weight,
            bias: Some(param(&[out_features], DType::F32)?),
            in_features,
            out_features,
            quant: None,
        })
    }

    /// Keep (`true`, the default) or drop the bias.
    pub fn bias(mut self, on: bool) -> Linear {
        if !on {
            self.bias = None;
        } else if self.bias.is_none() {
            // Re-adding a dropped bias: zeros, as at construction.
            self.bias = param(&[self.out_features], self.weight.dtype()).ok();
        }
        self
    }

    /// The same layer with parameters converted to `dtype` (e.g. `DType::F64`).
    pub fn dtype(mut self, dtype: DType) -> Result<Linear> {
        self.weight = recast(&self.weight, dtype)?;
        self.bias = self.bias.map(|b| recast(&b, dtype)).transpose()?;
        Ok(self)
    }

    /// The weight `[in_features, out_features]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias `[out_features]`, if any.
    pub fn bias_tensor(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Input feature count.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output feature count.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    fn describe(&self) -> String {
        format!(
            "Linear(in_features={}, out_features={})",
            self.in_features, self.out_features
        )
    }
}

impl Layer for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.quant {
            Some(q) => q
                .apply(x, &self.weight)
                .and_then(|(x, w)| F::linear(&x, &w, self.bias.as_ref())),
            None => F::linear(x, &self.weight, self.bias.as_ref()),
        };
        ctx(|| self.describe(), y)
    }

    /// Fake quantization of the input and of the weight per output column (axis 1).
    fn quantize_with(&mut self, q: &dyn Quantizer) -> Result<usize> {
        self.quant = Some(q.pair(1, self.out_features)?);
        Ok(1)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        self.quant.as_ref().map_or_else(Vec::new, QuantPair::sublayers)
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        self.quant.as_mut().map_or_else(Vec::new, QuantPair::sublayers_mut)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        v.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        v
    }
}
