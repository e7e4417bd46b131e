//! The fuzz seed corpus in `fuzz/seeds/` stays valid: every model seed loads and every npy
//! seed reads, every graph-JSON seed builds,
//! every text seed parses. `OAR_WRITE_FUZZ_SEEDS=1 cargo test -p oar-ir --test ir file_fuzz_seeds`
//! regenerates the seeds (after a format change).

use crate::file_common::{nested_conds, sample_model};
use oar_ir::file::Model;
use oar_ir::graph_def::GraphDef;
use oar_ir::npy::{read_npy_bytes, to_npy_bytes};
use oar_ir::text::{parse_graph, print_graph};
use oar_ir::{DType, Graph, TensorData, Weights};
use std::path::PathBuf;

fn seeds_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target)
}

fn model_seeds() -> Vec<(String, Vec<u8>)> {
    let empty = Model {
        graph: Graph::new("empty"),
        weights: Weights::new(),
    };
    let nested = Model {
        graph: nested_conds(3),
        weights: Weights::new(),
    };
    vec![
        ("sample.oar", sample_model().to_bytes().unwrap()),
        ("empty.oar", empty.to_bytes().unwrap()),
        ("nested.oar", nested.to_bytes().unwrap()),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), b))
    .collect()
}

fn npy_seeds() -> Vec<(String, Vec<u8>)> {
    let t = |d: DType, shape: Vec<usize>| {
        let n = shape.iter().product::<usize>();
        let vals: Vec<f64> = (0..n).map(|i| (i % 2) as f64).collect();
        to_npy_bytes(&TensorData::from_f64_slice(d, shape, &vals).unwrap()).unwrap()
    };
    vec![
        ("f32_2x3.npy", t(DType::F32, vec![2, 3])),
        ("f64_scalar.npy", t(DType::F64, vec![])),
        ("bool_4.npy", t(DType::Bool, vec![4])),
        ("i64_0.npy", t(DType::I64, vec![0])),
        ("f16_1x2x2.npy", t(DType::F16, vec![1, 2, 2])),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), b))
    .collect()
}

#[test]
fn seeds_are_valid() {
    let write = std::env::var_os("OAR_WRITE_FUZZ_SEEDS").is_some();
    let graph_seeds = model_seeds()
        .into_iter()
        .map(|(name, bytes)| (name.replace(".oar", ".json"), crate::file_common::sections(&bytes).0))
        .collect();
    let text_seeds = [("sample.txt", sample_model().graph), ("nested.txt", nested_conds(3))]
        .into_iter()
        .map(|(name, g)| (name.to_string(), print_graph(&g).into_bytes()))
        .collect();
    let targets = [
        ("load_model", model_seeds()),
        ("graph_json", graph_seeds),
        ("read_npy", npy_seeds()),
        ("parse_text", text_seeds),
    ];
    for (target, seeds) in targets {
        let dir = seeds_dir(target);
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            for (name, bytes) in &seeds {
                std::fs::write(dir.join(name), bytes).unwrap();
            }
        }
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            match target {
                "load_model" => drop(Model::from_bytes(&bytes).unwrap_or_else(|e| panic!("{e}"))),
                "parse_text" => drop(parse_graph(std::str::from_utf8(&bytes).unwrap()).unwrap()),
                "graph_json" => {
                    let def: GraphDef = serde_json::from_slice(&bytes).unwrap();
                    def.to_graph().unwrap();
                }
                _ => drop(read_npy_bytes(&bytes).unwrap_or_else(|e| panic!("{e}"))),
            }
            n += 1;
        }
        assert!(n >= seeds.len(), "{target}: {n} seeds in {}", dir.display());
    }
}
