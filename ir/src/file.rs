//! The `.oar` model file: magic, format version, the graph (serde) and weights (safetensors).
