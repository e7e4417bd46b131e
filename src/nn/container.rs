//! `Sequential`: layers applied in order, named `"0"`, `"1"`, … (Paddle's `nn.Sequential`).

use super::Layer;
use super::util::ctx;
use crate::error::Result;
use crate::tensor::Tensor;

/// Layers applied one after another. Build with `Sequential::new().add(a).add(b)` or
/// `oar::sequential![a, b]`; sublayer `i` is named `"i"` (`"0.weight"`, `"1.bias"`, …).
pub struct Sequential {
    layers: Vec<Box<dyn Layer>>,
    training: bool,
}

impl Default for Sequential {
    fn default() -> Sequential {
        Sequential::new()
    }
}

impl Sequential {
    /// An empty container (in training mode).
    pub fn new() -> Sequential {
        Sequential {
            layers: Vec::new(),
            training: true,
        }
    }

    /// Append `layer` (builder form).
    // Named for the builder chain `Sequential::new().add(a).add(b)`, not `+`.
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, layer: impl Layer + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// Append an already boxed layer.
    pub fn push(&mut self, layer: Box<dyn Layer>) {
        self.layers.push(layer);
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True when there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Layer `i`, if any.
    pub fn get(&self, i: usize) -> Option<&dyn Layer> {
        self.layers.get(i).map(|l| &**l)
    }
}

impl Layer for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = ctx(|| format!("Sequential[{i}]"), l.forward(&h))?;
        }
        Ok(h)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| (i.to_string(), &**l))
            .collect()
    }

    fn sublayers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        self.layers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| (i.to_string(), &mut **l as &mut dyn Layer))
            .collect()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// `sequential![a, b, c]` is `Sequential::new().add(a).add(b).add(c)`.
#[macro_export]
macro_rules! sequential {
    ($($layer:expr),* $(,)?) => {
        $crate::nn::Sequential::new()$(.add($layer))*
    };
}
