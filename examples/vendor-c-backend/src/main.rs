//! `cargo run -p oar-example-vendor-c --release -- conformance [--section S] [--filter T]
//! [--failures-only] [--full]`: register the backend and run oar's conformance kit on it.

use oar_example_vendor_c::VendorCBackend;
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((cmd, rest)) if cmd == "conformance" => oar_conformance::kit_main(Arc::new(VendorCBackend), rest),
        _ => {
            eprintln!("usage: oar-example-vendor-c conformance [OPTIONS of `oar conformance`]");
            ExitCode::from(2)
        }
    }
}
