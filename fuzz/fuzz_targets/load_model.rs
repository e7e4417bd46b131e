//! Fuzz `.oar` loading: any bytes must give a valid model or an error, never a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oar_ir::file::Model;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Model::from_bytes(data) {
        // Whatever loads must be a consistent model that saves and loads again.
        oar_ir::verify(&m.graph).expect("loaded graph verifies");
        m.check_weights().expect("loaded weights match");
        let bytes = m.to_bytes().expect("a loaded model saves");
        Model::from_bytes(&bytes).expect("a saved model loads");
    }
});
