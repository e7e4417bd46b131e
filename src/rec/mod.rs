//! Recommendation: the click-through-rate model zoo (`oar::rec::models`).

pub mod models;
