//! The models the training benchmarks share (included with `#[path]`; each uses what it needs):
//! the MLP 784-256-128-10 and LeNet-5 of PyTorch's and Paddle's tutorials, as in
//! `bench/torch_models.py`.
#![allow(dead_code)]

use oar::Result;
use oar::nn::{Conv2D, Flatten, Linear, MaxPool2D, ReLU, Sequential};

/// MLP 784-256-128-10 with ReLUs.
pub fn mlp() -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Linear::new(784, 256)?)
        .add(ReLU)
        .add(Linear::new(256, 128)?)
        .add(ReLU)
        .add(Linear::new(128, 10)?))
}

/// LeNet-5 on 1×28×28 (conv 5×5 pad 2, max-pool, conv 5×5, max-pool, three linear layers).
pub fn lenet() -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Conv2D::new(1, 6, 5)?.padding(2))
        .add(ReLU)
        .add(MaxPool2D::new(2))
        .add(Conv2D::new(6, 16, 5)?)
        .add(ReLU)
        .add(MaxPool2D::new(2))
        .add(Flatten::new(1, -1))
        .add(Linear::new(16 * 5 * 5, 120)?)
        .add(ReLU)
        .add(Linear::new(120, 84)?)
        .add(ReLU)
        .add(Linear::new(84, 10)?))
}
