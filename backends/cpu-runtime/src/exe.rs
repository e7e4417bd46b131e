//! The `main` of AOT executables: read .npy inputs, run, write .npy outputs, `--bench N`.
