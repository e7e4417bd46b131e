//! The passes crate's tests, in one binary: the manager, each pass, fusion, memory planning, numerics checks and the `passes/filetests` files.

mod amp;
mod filetests;
mod fusion;
mod legalize;
mod manager;
mod memory_plan;
mod numeric;
mod numerics;
mod passes;
mod simplify_rules;
