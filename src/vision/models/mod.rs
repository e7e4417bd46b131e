//! Vision models with Paddle's layer names, randomly initialized (weights are trained or
//! loaded with `Layer::set_state_dict`; nothing is downloaded).

mod resnet;

pub use resnet::{BasicBlock, ResNet, resnet18, resnet34};
