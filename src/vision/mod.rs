//! Computer vision: the model zoo (`paddle.vision.models`) and image transforms
//! (`paddle.vision.transforms`).

pub mod models;
pub mod transforms;
