//! The C API of AOT shared libraries (`oar_model_create`, `oar_model_run`, ...).
