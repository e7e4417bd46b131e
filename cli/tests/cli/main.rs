//! End-to-end tests of the `oar` command-line tool, in one binary.

#[path = "../common/mod.rs"]
mod common;

mod compile;
mod compile_mlir;
mod compile_ptx;
mod conformance;
mod inspect_run;
mod opt;
mod ps;
mod quantize;
mod regressions;
mod zoo;
