//! oar
