//! Vision models with Paddle's layer names, randomly initialized (weights are trained or
//! loaded with `Layer::set_state_dict`; nothing is downloaded).

mod lenet;
mod mobilenet;
mod resnet;

pub use lenet::{LeNet, lenet};
pub use mobilenet::{InvertedResidual, MobileNetV2, ReLU6, mobilenet_v2};
pub use resnet::{BasicBlock, ResNet, resnet18, resnet34};
