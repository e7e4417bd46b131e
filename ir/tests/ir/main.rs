//! The IR crate's tests, in one binary: text format, files, npy, type rules, the verifier.

mod file_common;

mod file_fuzz_seeds;
mod file_mutations;
mod file_roundtrip;
mod npy_format;
mod text_parse;
mod text_roundtrip;
mod type_rules;
mod verify;
