//! Fuzz the graph section alone (JSON `GraphDef` → `Graph`), which reaches the op type rules
//! far more often than whole-file bytes do. Whatever builds must verify and round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oar_ir::graph_def::GraphDef;

fuzz_target!(|data: &[u8]| {
    let Ok(def) = serde_json::from_slice::<GraphDef>(data) else {
        return;
    };
    if let Ok(g) = def.to_graph() {
        oar_ir::verify(&g).expect("a rebuilt graph verifies");
        let canonical = GraphDef::from_graph(&g);
        let again = canonical.to_graph().expect("a canonical def rebuilds");
        assert_eq!(
            GraphDef::from_graph(&again),
            canonical,
            "from_graph ∘ to_graph is stable"
        );
    }
});
