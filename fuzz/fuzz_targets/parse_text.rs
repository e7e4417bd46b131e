//! Fuzz the text-format parser: any UTF-8 must parse to a graph or give an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = oar_ir::text::parse_graph(text);
    }
});
