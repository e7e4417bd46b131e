//! Computer vision: the model zoo (`paddle.vision.models`), image transforms
//! (`paddle.vision.transforms`) and reading images (`paddle.vision.image_load`).

pub mod image;
pub mod models;
pub mod transforms;
