//! Eager mode on the conformance suite: each case's graph runs op by op on eager tensors (as a
//! loaded model is called, `jit::TranslatedLayer`), so every op goes through eager dispatch —
//! the cpu backend's code compiled per op and operand types, and the native kernels — and is
//! compared with the reference backend. No eager kernel the suite compiles may leave a part
//! of its program to the reference interpreter.

use oar::ir::{Backend, BackendError, Executable, Graph, TensorData, Weights};
use oar::jit::TranslatedLayer;
use oar::{Tensor, no_grad};
use oar_conformance::{SuiteFilter, run_suite};
use std::collections::BTreeMap;

/// Cases eager mode may fail, each with the reason. An entry that passes is an error too.
const ALLOWED: &[(&str, &str)] = &[];

struct Eager;

struct EagerExe {
    layer: TranslatedLayer,
    outputs: Vec<String>,
}

fn failed(e: oar::Error) -> BackendError {
    BackendError::Runtime {
        op: "eager".into(),
        value: String::new(),
        detail: e.to_string(),
    }
}

impl Executable for EagerExe {
    fn run(&self, inputs: &BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        let specs = self.layer.graph().input_specs();
        let mut tensors = Vec::with_capacity(specs.len());
        for (name, ty) in &specs {
            let t = inputs.get(name).ok_or_else(|| BackendError::MissingInput {
                name: name.clone(),
                expected: ty.to_string(),
            })?;
            tensors.push(Tensor::from_data(t.clone()));
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let _guard = no_grad();
        let outs = self.layer.call(&refs).map_err(failed)?;
        outs.iter()
            .zip(&self.outputs)
            .map(|(t, n)| Ok((n.clone(), t.try_data().map_err(failed)?)))
            .collect()
    }
}

impl Backend for Eager {
    fn name(&self) -> &str {
        "eager"
    }
    fn description(&self) -> &str {
        "the graph run op by op on eager tensors"
    }
    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        let outputs = graph.outputs().iter().map(|o| o.name.clone()).collect();
        let model = oar::ir::file::Model {
            graph: graph.clone(),
            weights: weights.clone(),
        };
        let layer = TranslatedLayer::new(model).map_err(failed)?;
        Ok(Box::new(EagerExe { layer, outputs }))
    }
}

#[test]
fn eager_mode_passes_the_conformance_suite() {
    let report = run_suite(&Eager, &SuiteFilter::all());
    println!("{report}");
    if let Err(e) = report.check_allowed(ALLOWED) {
        panic!("eager mode on the conformance suite:\n{e}");
    }
    let interpreted = oar::tensor::interpreted_eager_kernels();
    assert!(
        interpreted.is_empty(),
        "eager kernels that interpret:\n{}",
        interpreted.join("\n")
    );
}
