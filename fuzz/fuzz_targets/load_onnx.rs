//! Fuzz ONNX import: any bytes must give a verified model or an error, never a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = oar_onnx::from_bytes(data) {
        oar_ir::verify(&m.graph).expect("imported graph verifies");
        m.check_weights().expect("imported weights match their params");
    }
});
