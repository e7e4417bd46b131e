//! Fuzz the text-format parser: any UTF-8 must parse to a graph or give an error; whatever
//! parses must verify and print → parse → print to the same text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oar_ir::text::{parse_graph, print_graph};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(g) = parse_graph(text) {
        oar_ir::verify(&g).expect("a parsed graph verifies");
        let printed = print_graph(&g);
        let again = parse_graph(&printed).expect("printed text parses");
        assert_eq!(print_graph(&again), printed, "print → parse → print is the identity");
    }
});
