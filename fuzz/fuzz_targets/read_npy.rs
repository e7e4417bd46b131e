//! Fuzz npy reading: any bytes must give a tensor or an error; tensors write back exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oar_ir::npy::{read_npy_bytes, to_npy_bytes};

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = read_npy_bytes(data) {
        let bytes = to_npy_bytes(&t).expect("a read tensor writes");
        assert_eq!(read_npy_bytes(&bytes).expect("a written tensor reads"), t);
    }
});
