//! The cpu backend's tests, in one binary: code generation, native copies, AOT objects, executables and shared libraries.

mod amp;
mod aot;
mod codegen;
mod native;
