//! Ahead-of-time compilation: object files, executables, shared libraries with a C header.
