//! Recommendation: the click-through-rate model zoo (`oar::rec::models`) and synthetic
//! Criteo-like click data (`oar::rec::data`).

pub mod data;
pub mod models;
