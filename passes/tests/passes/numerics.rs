//! The numerics check: it names the first pass that changes the outputs and bisects the step
//! of that pass that does it; correct pipelines pass; tolerances and setup errors behave.
//! Tolerances: the defaults (rtol 1e-4, atol 1e-5 for f32) unless a test says otherwise.

use oar_ir::ops::BinaryOp;
use oar_ir::{DType, Dim, Graph, Op, TensorType, ValueId};
use oar_passes::{
    Canonicalize, Cse, Dce, Fold, NumericsCheck, Pass, PassError, PassManager, SpecializeShapes, StepBudget, StepRun,
};

/// `x * 1 → x`, one step per rewrite — except that the `bad_step`-th rewrite (if any) produces
/// `x + 1` instead: a planted bug.
struct MulOne {
    bad_step: Option<usize>,
}

fn is_one(g: &Graph, v: ValueId) -> bool {
    matches!(&g.node(v.node).op, Op::Constant(t) if t.to_f64_vec().iter().all(|&x| x == 1.0))
}

impl Pass for MulOne {
    fn name(&self) -> &'static str {
        "mul-one"
    }
    fn description(&self) -> &'static str {
        "x * 1 -> x (test pass, optionally with a planted bug)"
    }
    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        Ok(self.run_steps(graph, None)?.changed)
    }
    fn run_steps(&self, graph: &mut Graph, max_steps: Option<usize>) -> Result<StepRun, PassError> {
        let mut budget = StepBudget::new(max_steps);
        let ir = |e| PassError::ir("mul-one", e);
        for node in graph.topo_order() {
            let n = graph.node(node);
            let ins = n.inputs().to_vec();
            let matches = n.op == Op::Binary(BinaryOp::Mul)
                && is_one(graph, ins[1])
                && graph.value_type(ins[0]) == &n.outputs()[0];
            if !matches {
                continue;
            }
            if !budget.take() {
                break;
            }
            let replacement = if Some(budget.done()) == self.bad_step {
                graph.binary(BinaryOp::Add, ins[0], ins[1]).map_err(ir)?
            } else {
                ins[0]
            };
            graph.replace_all_uses(ValueId::first(node), replacement).map_err(ir)?;
        }
        Ok(budget.run())
    }
}

/// `y = ((((x * 1) * 1) * 1) * 1) * 1` with x: f32[N, 3] and a param added at the end.
fn mul_chain() -> Graph {
    let mut g = Graph::new("chain");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(3)]))
        .unwrap();
    let b = g.add_param("b", TensorType::of(DType::F32, &[3])).unwrap();
    let one = g.add_scalar(DType::F32, 1.0);
    let mut y = x;
    for _ in 0..5 {
        y = g.binary(BinaryOp::Mul, y, one).unwrap();
    }
    let y = g.binary(BinaryOp::Add, y, b).unwrap();
    g.add_output("y", y).unwrap();
    g
}

fn pipeline(bad_step: Option<usize>) -> PassManager {
    let mut pm = PassManager::new();
    pm.add(Canonicalize)
        .add(Fold::new())
        .add(MulOne { bad_step })
        .add(Cse)
        .add(Dce)
        .verify_each(true)
        .check_numerics(NumericsCheck::new());
    pm
}

#[test]
fn planted_bug_is_named_with_its_pass_and_step() {
    let mut g = mul_chain();
    let err = pipeline(Some(3)).run(&mut g).unwrap_err();
    match &err {
        PassError::Numerics {
            pass,
            index,
            step,
            output,
            max_abs_err,
            ..
        } => {
            assert_eq!((pass.as_str(), *index, *step), ("mul-one", 3, Some(3)), "{err}");
            assert_eq!(output, "y");
            // x + 1 instead of x * 1: off by 1 everywhere (up to f32 rounding of the sums).
            assert!((max_abs_err.0 - 1.0).abs() < 1e-6, "{err}");
        }
        other => panic!("expected a numerics error, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("`mul-one`") && msg.contains("step 3") && msg.contains("`y`"),
        "{msg}"
    );
}

#[test]
fn the_bisection_finds_every_planted_step() {
    for bad in 1..=5 {
        let mut g = mul_chain();
        match pipeline(Some(bad)).run(&mut g) {
            Err(PassError::Numerics { pass, step, .. }) => {
                assert_eq!((pass.as_str(), step), ("mul-one", Some(bad)))
            }
            other => panic!("bug at step {bad}: expected a numerics error, got {other:?}"),
        }
    }
}

#[test]
fn a_correct_pipeline_passes_the_check() {
    let mut g = mul_chain();
    let report = pipeline(None).run(&mut g).unwrap();
    assert!(report.changed());
    let muls = g
        .node_ids()
        .filter(|&n| g.node(n).op == Op::Binary(BinaryOp::Mul))
        .count();
    assert_eq!(muls, 0, "{g}");
}

/// Multiplies every output by `factor` (a pass that does not count steps).
struct Scale(f64);

impl Pass for Scale {
    fn name(&self) -> &'static str {
        "scale"
    }
    fn description(&self) -> &'static str {
        "multiply outputs by a factor (test pass)"
    }
    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let ir = |e| PassError::ir("scale", e);
        for i in 0..graph.outputs().len() {
            let v = graph.outputs()[i].value;
            let dtype = graph.value_type(v).dtype;
            let f = graph.add_scalar(dtype, self.0);
            let y = graph.binary(BinaryOp::Mul, v, f).map_err(ir)?;
            graph.replace_all_uses(v, y).map_err(ir)?;
            // replace_all_uses also rewired the new mul's own operand; point it back.
            graph.set_operand(y.node, 0, v).map_err(ir)?;
        }
        Ok(true)
    }
}

fn check_scale(factor: f64, check: NumericsCheck) -> Result<(), PassError> {
    let mut g = mul_chain();
    let mut pm = PassManager::new();
    pm.add(Scale(factor)).verify_each(true).check_numerics(check);
    pm.run(&mut g).map(|_| ())
}

#[test]
fn tolerances_are_respected_and_unstepped_passes_have_no_step() {
    // Values are in [-2, 2): a relative change of 1e-6 is within rtol 1e-4.
    check_scale(1.0 + 1e-6, NumericsCheck::new()).unwrap();
    let err = check_scale(1.01, NumericsCheck::new()).unwrap_err();
    assert!(
        matches!(&err, PassError::Numerics { pass, step: None, max_abs_err, .. }
            if pass == "scale" && max_abs_err.0 > 0.0 && max_abs_err.0 < 0.03),
        "{err}"
    );
    assert!(err.to_string().contains("rtol"), "{err}");
    // The same change passes a looser check.
    check_scale(1.01, NumericsCheck::new().tolerance(0.02, 0.0)).unwrap();
}

#[test]
fn specialized_inputs_need_matching_bindings() {
    let run = |check: NumericsCheck| {
        let mut g = mul_chain();
        let mut pm = PassManager::new();
        pm.add(SpecializeShapes::new([("N", 8)])).check_numerics(check);
        pm.run(&mut g).map(|_| g)
    };
    let err = run(NumericsCheck::new()).unwrap_err();
    assert!(
        matches!(&err, PassError::NumericsSetup { detail } if detail.contains("specialize-shapes") && detail.contains("no longer fit")),
        "{err}"
    );
    let g = run(NumericsCheck::new().bind("N", 8)).unwrap();
    assert_eq!(g.input_types()[0].to_string(), "f32[8,3]");
}

#[test]
fn a_graph_the_reference_cannot_run_is_a_setup_error() {
    let mut g = Graph::new("bad");
    let x = g.add_input("x", TensorType::of(DType::I32, &[2])).unwrap();
    let z = g.add_scalar(DType::I32, 0.0);
    let y = g.binary(BinaryOp::Div, x, z).unwrap();
    g.add_output("y", y).unwrap();
    let mut pm = PassManager::new();
    pm.add(Dce).check_numerics(NumericsCheck::new());
    let err = pm.run(&mut g).unwrap_err();
    assert!(matches!(err, PassError::NumericsSetup { .. }), "{err}");
}

#[test]
fn generated_data_is_seeded_and_in_range() {
    let c = NumericsCheck::new().default_dim(3);
    let ty = TensorType::new(DType::I64, vec![Dim::sym("N"), Dim::Static(50)]);
    let a = c.random_tensor(&ty, "labels").unwrap();
    assert_eq!(a.shape(), &[3, 50]);
    let v = a.to_f64_vec();
    assert!(v.iter().all(|&x| (0.0..3.0).contains(&x)), "{v:?}");
    assert!(v.contains(&0.0) && v.contains(&2.0));
    assert_eq!(a, c.random_tensor(&ty, "labels").unwrap(), "same seed, same data");
    assert_ne!(a, c.random_tensor(&ty, "other").unwrap(), "names pick streams");
    let f = c.random_tensor(&TensorType::of(DType::F32, &[100]), "x").unwrap();
    assert!(f.to_f64_vec().iter().all(|&x| (-1.0..1.0).contains(&x)));
    let huge = TensorType::of(DType::F32, &[1 << 20, 1 << 20]);
    assert!(c.random_tensor(&huge, "w").unwrap_err().contains("too large"));
}

#[test]
fn stepped_passes_stop_after_n_rewrites() {
    // fold: 2 + 3, then * 4, then neg: three folds.
    let text = "graph @g {\n  %x = input \"x\" : f32[3]\n  %a = constant dense<2.0> : f32[]\n  \
                %b = constant dense<3.0> : f32[]\n  %s = add(%a, %b) : f32[]\n  %c = constant dense<4.0> : f32[]\n  \
                %m = mul(%s, %c) : f32[]\n  %n = neg(%m) : f32[]\n  %y = add(%x, %n) : f32[3]\n  output \"y\" = %y\n}\n";
    let g0 = oar_ir::text::parse_graph(text).unwrap();
    let count = |g: &Graph, name: &str| g.node_ids().filter(|&n| g.node(n).op.name() == name).count();
    let mut all = g0.clone();
    assert_eq!(Fold::new().run_steps(&mut all, None).unwrap().steps, Some(3));
    let mut one = g0.clone();
    let run = Fold::new().run_steps(&mut one, Some(1)).unwrap();
    assert_eq!((run.changed, run.steps), (true, Some(1)));
    assert_eq!(
        (count(&one, "add"), count(&one, "mul"), count(&one, "neg")),
        (1, 1, 1),
        "{one}"
    );
    let mut none = g0.clone();
    assert!(!Fold::new().run_steps(&mut none, Some(0)).unwrap().changed);
    // cse and canonicalize count too.
    let mut g = mul_chain();
    let one = g.add_scalar(DType::F32, 1.0);
    let x = g.input_values()[0];
    let a = g.binary(BinaryOp::Mul, one, x).unwrap();
    let b = g.binary(BinaryOp::Mul, one, x).unwrap();
    let s = g.binary(BinaryOp::Add, a, b).unwrap();
    g.add_output("s", s).unwrap();
    let mut c = g.clone();
    assert_eq!(Canonicalize.run_steps(&mut c, Some(1)).unwrap().steps, Some(1));
    assert_eq!(Canonicalize.run_steps(&mut g.clone(), None).unwrap().steps, Some(2));
    // The two scalar constants 1.0 merge; then `1 * x` (twice) merges with the chain's `x * 1`
    // (commutative operands compare as a set).
    assert_eq!(Cse.run_steps(&mut g.clone(), None).unwrap().steps, Some(3));
    assert_eq!(Cse.run_steps(&mut g, Some(1)).unwrap().steps, Some(1));
}
