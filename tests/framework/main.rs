//! The framework's end-to-end tests, in one binary (each test binary links the whole stack
//! again): eager tensors and autograd, `nn`, optimizers, data loading, save/load, and the
//! tracing JIT (`to_static`, control flow, training steps, the macro's UI errors).

mod common;

mod amp;

mod eager;
mod eager_device;
mod gradcheck;
mod hapi;
mod io_datasets;
mod io_loader;
mod jit;
mod jit_backends;
mod jit_control;
mod jit_train;
mod kernels;
mod macro_ui;
mod metric;
mod nn_gradcheck;
mod nn_layers;
mod nn_models;
mod nn_rnn;
mod nn_transformer;
mod op_fixtures;
mod optim_train;
mod optim_updates;
mod quant;
mod save_load;
mod vision;
mod vision_ops;
mod vision_transforms;
mod zoo;
