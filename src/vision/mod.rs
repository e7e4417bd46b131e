//! Computer vision: the model zoo (`paddle.vision.models`).

pub mod models;
