//! The reference backend's tests, in one binary: every op family against hand-computed values, decompositions, control flow, graphs and kernel programs.

mod common;

mod composites;
mod contraction;
mod control;
mod decompositions;
mod elementwise;
mod graphs;
mod movement;
mod reduce;
mod run_kernel;
mod samples;
