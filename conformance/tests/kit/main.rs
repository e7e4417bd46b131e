//! The conformance kit's own tests, in one binary: the reference backend passes its suite and
//! the suite catches planted bugs; the kit on `cpu`, `ptx` and eager mode (op by op); every PTX kernel of the suite
//! through `ptxas`; with the cargo feature `mlir` (LLVM/MLIR 19), the kit on `mlir` and its
//! GPU path through `ptxas` (run alone with `cargo test -p oar-conformance --features mlir
//! --test kit mlir`).

mod cpu;
mod eager;
#[cfg(feature = "mlir")]
mod mlir;
#[cfg(feature = "mlir")]
mod mlir_ptxas;
mod ptx;
mod ptxas;
mod reference;
