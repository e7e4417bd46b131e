//! The vision model zoo (`paddle.vision.models`, torchvision's architectures): LeNet, AlexNet,
//! VGG-11/13/16/19 (± batch norm), ResNet-18/34/50/101/152, ResNeXt, Wide ResNet,
//! MobileNetV1/V2/V3, ShuffleNetV2, SqueezeNet 1.0/1.1, DenseNet-121/161/169/201, GoogLeNet,
//! Inception v3, ViT-B/16, FCN-ResNet50/101 and U-Net. Each has its reference's parameter count
//! and module names (batch-norm statistics are Paddle's `_mean` / `_variance`, Linear weights
//! `[in, out]`), so `tools/torchvision_to_oar.py` converts torchvision weights by name and
//! `Model::load` reads them. Models are randomly initialized; nothing is downloaded.

mod alexnet;
mod densenet;
mod googlenet;
mod inception;
mod lenet;
mod mobilenet;
mod resnet;
mod segmentation;
mod shufflenet;
mod squeezenet;
mod vgg;
mod vit;

pub use alexnet::{AlexNet, alexnet};
pub use densenet::{DenseNet, DenseNetConfig, densenet121, densenet161, densenet169, densenet201};
pub use googlenet::{GoogLeNet, googlenet};
pub use inception::{Inception3, inception_v3};
pub use lenet::{LeNet, lenet};
pub use mobilenet::{InvertedResidual, MobileNetV2, ReLU6, mobilenet_v2};
pub use mobilenet::{
    MobileNetV1, MobileNetV3, MobileNetV3Arch, MobileNetV3Config, mobilenet_v1, mobilenet_v3_large, mobilenet_v3_small,
};
pub use resnet::{
    BasicBlock, BottleneckBlock, ResNet, ResNetBlock, ResNetConfig, resnet18, resnet34, resnet50, resnet101, resnet152,
    resnext50_32x4d, resnext101_32x8d, resnext101_64x4d, wide_resnet50_2, wide_resnet101_2,
};
pub use segmentation::{FCN, UNet, fcn_resnet50, fcn_resnet101, unet};
pub use shufflenet::{ShuffleNetV2, shufflenet_v2_x0_5, shufflenet_v2_x1_0, shufflenet_v2_x1_5, shufflenet_v2_x2_0};
pub use squeezenet::{Fire, SqueezeNet, SqueezeNetVersion, squeezenet1_0, squeezenet1_1};
pub use vgg::{VGG, vgg11, vgg13, vgg16, vgg19};
pub use vit::{ViTConfig, VisionTransformer, vit_b_16};
