//! The verifier: valid graphs pass; each broken invariant gives an error naming op, value and types.

use oar_ir::ops::UnaryOp;
use oar_ir::ops::{Input, Permute, Reduce};
use oar_ir::{DType, Dim, Graph, IrError, Op, TensorType, verify};

fn base() -> (Graph, oar_ir::ValueId, oar_ir::ValueId) {
    let mut g = Graph::new("g");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(4)]))
        .unwrap();
    let w = g.add_param("w", TensorType::of(DType::F32, &[4, 2])).unwrap();
    let y = g.add_op1(Op::MatMul, &[x, w]).unwrap();
    let e = g.unary(UnaryOp::Exp, y).unwrap();
    g.add_output("y", e).unwrap();
    (g, y, e)
}

#[test]
fn valid_graph_passes() {
    verify(&base().0).unwrap();
}

#[test]
fn changed_op_whose_types_no_longer_hold() {
    let (mut g, y, _) = base();
    *g.op_mut(y.node) = Op::Permute(Permute { perm: vec![1, 0] });
    let e = verify(&g).unwrap_err();
    let s = e.to_string();
    assert!(matches!(e, IrError::Type { .. }), "{e:?}");
    assert!(
        s.contains("permute") && s.contains(&format!("%{}", y.node.index())),
        "{s}"
    );
}

#[test]
fn declared_types_disagree_with_rule() {
    let (mut g, _, e) = base();
    // exp → not: an op whose rule rejects f32 operands.
    *g.op_mut(e.node) = Op::Unary(UnaryOp::Not);
    let s = verify(&g).unwrap_err().to_string();
    assert!(s.contains("not") && s.contains("f32[N,2]"), "{s}");
}

#[test]
fn param_declared_with_two_types_across_regions() {
    let (mut g, _, _) = base();
    let mut body = Graph::new("body");
    let a = body.add_input("a", TensorType::of(DType::F32, &[2])).unwrap();
    let w = body.add_param("w", TensorType::of(DType::F32, &[2])).unwrap();
    let s = body.binary(oar_ir::ops::BinaryOp::Add, a, w).unwrap();
    body.add_output("a", s).unwrap();
    let mut cond = Graph::new("cond");
    let a = cond.add_input("a", TensorType::of(DType::F32, &[2])).unwrap();
    let r = cond
        .add_op1(
            Op::Reduce(Reduce {
                op: oar_ir::ops::ReduceOp::Sum,
                axes: vec![0],
                keepdim: false,
            }),
            &[a],
        )
        .unwrap();
    let zero = cond.add_scalar(DType::F32, 0.0);
    let c = cond.binary(oar_ir::ops::BinaryOp::Lt, r, zero).unwrap();
    cond.add_output("c", c).unwrap();
    let init = g.add_constant(oar_ir::TensorData::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap());
    g.add_region_op(Op::While, &[init], vec![cond, body]).unwrap();
    let e = verify(&g).unwrap_err();
    assert!(
        matches!(&e, IrError::ParamConflict { name, first, second } if name == "w" && first == "f32[4,2]" && second == "f32[2]"),
        "{e:?}"
    );
}

#[test]
fn input_op_smuggled_in_as_a_node() {
    let (mut g, y, _) = base();
    *g.op_mut(y.node) = Op::Input(Input {
        name: "fake".into(),
        ty: TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(2)]),
    });
    let s = verify(&g).unwrap_err().to_string();
    assert!(s.contains("fake"), "{s}");
}
