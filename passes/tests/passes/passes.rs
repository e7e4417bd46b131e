//! The dce and decompose passes on small graphs, regions included.

use oar_ir::ops::{BinaryOp, UnaryOp};
use oar_ir::ops::{Dropout, Gelu, Softmax};
use oar_ir::{Composite, DType, Dim, Float, Graph, Op, TensorType, ValueId};
use oar_passes::{Dce, Decompose, Pass, PassError, count_nodes};

fn f32t(d: &[usize]) -> TensorType {
    TensorType::of(DType::F32, d)
}

/// Composite nodes anywhere in `g`, regions included, by name.
fn composites(g: &Graph) -> Vec<&'static str> {
    let mut out = Vec::new();
    for n in g.node_ids() {
        let node = g.node(n);
        if let Op::Composite(c) = &node.op {
            out.push(c.name());
        }
        for r in &node.regions {
            out.extend(composites(r));
        }
    }
    out.sort_unstable();
    out
}

/// A `cond(pred, x)` whose branches apply `then` and `else_` composites to `x`.
fn cond_of(g: &mut Graph, pred: ValueId, x: ValueId, then: Composite, else_: Composite) -> ValueId {
    let ty = g.value_type(x).clone();
    let branch = |c: Composite, dead: bool| {
        let mut r = Graph::new("branch");
        let a = r.add_input("a", ty.clone()).unwrap();
        let y = r.add_op1(Op::Composite(c), &[a]).unwrap();
        if dead {
            r.unary(UnaryOp::Exp, a).unwrap();
        }
        r.add_output("y", y).unwrap();
        r
    };
    let regions = vec![branch(then, true), branch(else_, false)];
    g.add_region_op(Op::Cond, &[pred, x], regions).unwrap()[0]
}

#[test]
fn dce_removes_exactly_the_dead_nodes() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", f32t(&[3])).unwrap();
    let unused = g.add_input("unused", f32t(&[3])).unwrap();
    let live = g.unary(UnaryOp::Exp, x).unwrap();
    let dead1 = g.unary(UnaryOp::Neg, live).unwrap();
    let dead2 = g.binary(BinaryOp::Add, dead1, unused).unwrap();
    let w = g.add_param("dead_w", f32t(&[3])).unwrap();
    g.binary(BinaryOp::Mul, dead2, w).unwrap();
    g.add_output("y", live).unwrap();
    assert_eq!(g.node_count(), 7);
    assert!(Dce.run(&mut g).unwrap());
    let left: Vec<_> = g.node_ids().map(|n| g.node(n).op.name()).collect();
    assert_eq!(left, ["input", "input", "exp"], "inputs stay even when unused");
    assert_eq!(g.outputs()[0].value, live);
    assert!(!Dce.run(&mut g).unwrap(), "a second run changes nothing");
    oar_ir::verify(&g).unwrap();
}

#[test]
fn dce_cleans_regions_of_live_nodes() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", f32t(&[3])).unwrap();
    let p = g.add_input("p", TensorType::of(DType::Bool, &[])).unwrap();
    let y = cond_of(&mut g, p, x, Composite::Relu, Composite::Sigmoid);
    g.add_output("y", y).unwrap();
    let before = count_nodes(&g);
    assert!(Dce.run(&mut g).unwrap());
    assert_eq!(count_nodes(&g), before - 1, "only the dead exp in the then-branch goes");
    assert!(!Dce.run(&mut g).unwrap());
    oar_ir::verify(&g).unwrap();
    assert_eq!(g.output_types(), [f32t(&[3])]);
}

fn model() -> Graph {
    let mut g = Graph::new("mlp");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(4)]))
        .unwrap();
    let p = g.add_input("p", TensorType::of(DType::Bool, &[])).unwrap();
    let w = g.add_param("w", f32t(&[4, 5])).unwrap();
    let b = g.add_param("b", f32t(&[5])).unwrap();
    let h = g.add_op1(Op::Composite(Composite::Linear), &[x, w, b]).unwrap();
    let d = Composite::Dropout(Dropout {
        p: Float(0.1),
        training: false,
        seed: 3,
    });
    let h = g.add_op1(Op::Composite(d), &[h]).unwrap();
    let h = cond_of(
        &mut g,
        p,
        h,
        Composite::Gelu(Gelu { approximate: false }),
        Composite::Softmax(Softmax { axis: 1 }),
    );
    let y = g
        .add_op1(Op::Composite(Composite::Softmax(Softmax { axis: 1 })), &[h])
        .unwrap();
    g.add_output("y", y).unwrap();
    g
}

#[test]
fn decompose_leaves_no_composite_anywhere() {
    let mut g = model();
    assert_eq!(composites(&g), ["dropout", "gelu", "linear", "softmax", "softmax"]);
    let types = g.output_types();
    assert!(Decompose::all().run(&mut g).unwrap());
    assert!(composites(&g).is_empty(), "{:?}", composites(&g));
    oar_ir::verify(&g).unwrap();
    assert_eq!(g.output_types(), types);
    assert!(!Decompose::all().run(&mut g).unwrap(), "nothing left to decompose");
}

#[test]
fn decompose_keeps_the_keep_list() {
    let mut g = model();
    let pass = Decompose::keeping(&["softmax", "gelu"]).unwrap();
    assert_eq!(pass.kept().collect::<Vec<_>>(), ["gelu", "softmax"]);
    pass.run(&mut g).unwrap();
    assert_eq!(composites(&g), ["gelu", "softmax", "softmax"]);
    oar_ir::verify(&g).unwrap();
    let err = Decompose::keeping(&["softmax", "softmx"]).unwrap_err();
    assert!(
        matches!(&err, PassError::UnknownComposite { name, .. } if name == "softmx"),
        "{err}"
    );
}

#[test]
fn eval_dropout_at_an_output_forwards_its_input() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", f32t(&[3])).unwrap();
    let d = Composite::Dropout(Dropout {
        p: Float(0.5),
        training: false,
        seed: 0,
    });
    let y = g.add_op1(Op::Composite(d), &[x]).unwrap();
    g.add_output("y", y).unwrap();
    Decompose::all().run(&mut g).unwrap();
    assert_eq!(g.outputs()[0].value, x);
    assert_eq!(g.node_count(), 1);
}
