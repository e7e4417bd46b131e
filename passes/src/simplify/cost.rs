//! The cost model used to extract the cheapest equivalent graph.
//!
//! Costs estimate work in element operations, with every symbolic dim counted as [`SYM_DIM`]:
//! - leaves (inputs, params, constants, opaque ops) cost 0; a splat constant 1;
//! - view-like movement (reshape, permute, broadcast, slice) costs 1: backends fold it into the
//!   index maps of the kernel that reads it;
//! - copying movement (pad, concat, gather) costs its output elements;
//! - elementwise ops cost their output elements times a weight: 1 for cheap ops (add, mul, neg,
//!   compare, select, cast), 4 for division, remainder, power and transcendental unary ops;
//! - reductions cost their input elements; matmul and conv their FLOPs ([`oar_ir::ops::flops`]);
//! - anything else costs 8 per output element.
//!
//! Every op node costs at least 1, so the cheapest choice never refers to its own class.
//! A term's cost is the sum over its tree (shared subterms count once per use, as in egg).

use super::lang::{OarAnalysis, OarEGraph, OarLang};
use egg::{CostFunction, Id, Language};
use oar_ir::ops::{BinaryOp, UnaryOp, flops};
use oar_ir::{Op, TensorType};

/// The size assumed for a symbolic dim.
pub const SYM_DIM: usize = 64;

/// Cost of extracted terms: estimated element operations (see the module docs).
pub struct OarCost<'a> {
    egraph: &'a OarEGraph,
}

impl<'a> OarCost<'a> {
    /// The cost model over `egraph` (it reads operand types from the e-classes).
    pub fn new(egraph: &'a OarEGraph) -> OarCost<'a> {
        OarCost { egraph }
    }

    fn node_cost(&self, node: &OarLang) -> f64 {
        let OarLang::Op(k, kids) = node else {
            return if matches!(node, OarLang::Splat(_)) { 1.0 } else { 0.0 };
        };
        let ins: Option<Vec<TensorType>> = kids.iter().map(|&c| self.egraph[c].data.ty.clone()).collect();
        let (Some(ins), Some(out)) = (ins, OarAnalysis::node_type(self.egraph, node)) else {
            return f64::INFINITY;
        };
        let ops = self.egraph.analysis.ops.borrow();
        op_cost(ops.op(*k), &ins, &out).max(1.0)
    }
}

fn bind(t: &TensorType) -> TensorType {
    TensorType::new(t.dtype, t.shape.bind(&|_| Some(SYM_DIM)))
}

fn elements(t: &TensorType) -> f64 {
    bind(t).shape.num_elements().map_or(f64::MAX / 16.0, |n| n as f64)
}

/// The cost of one op with these operand and result types.
pub fn op_cost(op: &Op, ins: &[TensorType], out: &TensorType) -> f64 {
    let n = elements(out);
    match op {
        Op::Reshape(_) | Op::Permute(_) | Op::Broadcast(_) | Op::Slice(_) => 1.0,
        Op::Pad(_) | Op::Concat(_) | Op::Gather(_) | Op::Iota(_) => n,
        Op::Unary(u) => {
            let cheap = matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Not);
            n * if cheap { 1.0 } else { 4.0 }
        }
        Op::Binary(b) => {
            n * if matches!(b, BinaryOp::Div | BinaryOp::Rem | BinaryOp::Pow) {
                4.0
            } else {
                1.0
            }
        }
        Op::Where | Op::Cast(_) => n,
        Op::Reduce(_) | Op::ArgReduce(_) => ins.first().map_or(n, elements),
        Op::MatMul | Op::Conv(_) => {
            let ins: Vec<TensorType> = ins.iter().map(bind).collect();
            flops(op, &ins, &[bind(out)]).map_or(8.0 * n, |f| f as f64)
        }
        _ => 8.0 * n,
    }
}

impl CostFunction<OarLang> for OarCost<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &OarLang, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        enode
            .children()
            .iter()
            .fold(self.node_cost(enode), |acc, &c| acc + costs(c))
    }
}
