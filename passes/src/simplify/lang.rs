//! The e-graph language over oar ops and the analysis that types every e-class.
//!
//! One node kind carries any pure single-output op: its payload is an [`OpKey`], the op *with its
//! attributes* interned in the run's [`OpTable`], so `permute[1,0]` and `permute[0,1]` are
//! different nodes (hash/eq come from `oar_ir::Op`, never from strings). Leaves reference values
//! of the original graph; splat constants are made by rules.

use egg::{Analysis, DidMerge, EGraph, Id, define_language};
use oar_ir::ops::{BinaryOp, UnaryOp, infer_types};
use oar_ir::{DType, Op, TensorType, ValueId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

/// The attribute-free ops, which patterns spell by mnemonic (`(mul ?x ?c)`); their keys are fixed.
static FIXED_OPS: LazyLock<Vec<Op>> = LazyLock::new(|| {
    let mut ops: Vec<Op> = UnaryOp::ALL.iter().map(|&u| Op::Unary(u)).collect();
    ops.extend(BinaryOp::ALL.iter().map(|&b| Op::Binary(b)));
    ops.push(Op::Where);
    ops.push(Op::MatMul);
    ops
});

/// An op with its attributes, interned in the run's [`OpTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpKey(u32);

impl FromStr for OpKey {
    type Err = String;
    fn from_str(s: &str) -> Result<OpKey, String> {
        FIXED_OPS
            .iter()
            .position(|op| op.name() == s)
            .map(|i| OpKey(i as u32))
            .ok_or_else(|| format!("`{s}` is not an attribute-free op"))
    }
}

impl fmt::Display for OpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match FIXED_OPS.get(self.0 as usize) {
            Some(op) => f.write_str(op.name()),
            None => write!(f, "op{}", self.0),
        }
    }
}

/// A leaf: index into the run's table of original values (inputs, params, constants, opaque ops).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeafRef(pub u32);

impl FromStr for LeafRef {
    type Err = String;
    fn from_str(s: &str) -> Result<LeafRef, String> {
        let n = s.strip_prefix("leaf").ok_or("not a leaf")?;
        n.parse().map(LeafRef).map_err(|e| format!("{e}"))
    }
}

impl fmt::Display for LeafRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "leaf{}", self.0)
    }
}

/// A constant whose elements all equal one value (exactly representable in `dtype`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SplatConst {
    /// Element type.
    pub dtype: DType,
    /// Static shape.
    pub shape: Vec<usize>,
    /// The value's f64 bit pattern.
    pub bits: u64,
}

impl SplatConst {
    /// A splat of `value` with this type.
    pub fn new(dtype: DType, shape: Vec<usize>, value: f64) -> SplatConst {
        SplatConst {
            dtype,
            shape,
            bits: value.to_bits(),
        }
    }

    /// The value.
    pub fn value(&self) -> f64 {
        f64::from_bits(self.bits)
    }
}

impl FromStr for SplatConst {
    type Err = String;
    fn from_str(_: &str) -> Result<SplatConst, String> {
        Err("splat constants are made by rules, not parsed".into())
    }
}

impl fmt::Display for SplatConst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "splat<{}{:?}={}>", self.dtype, self.shape, self.value())
    }
}

define_language! {
    /// The e-graph language: original values as leaves, rule-made splat constants, and ops.
    pub enum OarLang {
        Leaf(LeafRef),
        Splat(SplatConst),
        Op(OpKey, Vec<Id>),
    }
}

/// The ops of one run: the fixed attribute-free ops first, then every op seen or made.
#[derive(Debug)]
pub struct OpTable {
    ops: Vec<Op>,
    index: HashMap<Op, OpKey>,
}

impl Default for OpTable {
    fn default() -> OpTable {
        let ops = FIXED_OPS.clone();
        let index = ops
            .iter()
            .enumerate()
            .map(|(i, op)| (op.clone(), OpKey(i as u32)))
            .collect();
        OpTable { ops, index }
    }
}

impl OpTable {
    /// The key of `op`, adding it if new.
    pub fn intern(&mut self, op: Op) -> OpKey {
        if let Some(&k) = self.index.get(&op) {
            return k;
        }
        let k = OpKey(self.ops.len() as u32);
        self.ops.push(op.clone());
        self.index.insert(op, k);
        k
    }

    /// The op behind a key.
    pub fn op(&self, key: OpKey) -> &Op {
        &self.ops[key.0 as usize]
    }
}

/// One leaf: an original value, its type, its splat value if it is a uniform constant, and the
/// topological rank of its node (to keep rebuilt terms acyclic).
#[derive(Clone, Debug)]
pub struct LeafInfo {
    /// The original value.
    pub value: ValueId,
    /// Its type.
    pub ty: TensorType,
    /// Its value if every element is equal (constants only).
    pub splat: Option<f64>,
    /// Position of its node in the original topological order.
    pub rank: usize,
}

/// What the analysis knows of an e-class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassData {
    /// Its type; `None` only if a rule built an ill-typed node (never extracted).
    pub ty: Option<TensorType>,
    /// Its value if it is a constant whose elements are all equal.
    pub splat: Option<f64>,
}

/// Types every e-class (with oar's type rules) and tracks splat constants.
#[derive(Debug, Default)]
pub struct OarAnalysis {
    /// Interned ops (a `RefCell` so that searchers, which see the e-graph read-only, can intern).
    pub ops: RefCell<OpTable>,
    /// The leaves, by [`LeafRef`].
    pub leaves: Vec<LeafInfo>,
}

/// The e-graph of a run.
pub type OarEGraph = EGraph<OarLang, OarAnalysis>;

impl OarAnalysis {
    /// The type of `node` from its children's classes (`None` if ill-typed or unknown).
    pub fn node_type(egraph: &OarEGraph, node: &OarLang) -> Option<TensorType> {
        match node {
            OarLang::Leaf(l) => Some(egraph.analysis.leaves[l.0 as usize].ty.clone()),
            OarLang::Splat(c) => Some(TensorType::of(c.dtype, &c.shape)),
            OarLang::Op(k, kids) => {
                let tys: Option<Vec<TensorType>> = kids.iter().map(|&c| egraph[c].data.ty.clone()).collect();
                let ops = egraph.analysis.ops.borrow();
                let mut outs = infer_types(ops.op(*k), &tys?, &[]).ok()?;
                (outs.len() == 1).then(|| outs.pop()).flatten()
            }
        }
    }
}

impl Analysis<OarLang> for OarAnalysis {
    type Data = ClassData;

    fn make(egraph: &mut OarEGraph, enode: &OarLang, _id: Id) -> ClassData {
        let splat = match enode {
            OarLang::Leaf(l) => egraph.analysis.leaves[l.0 as usize].splat,
            OarLang::Splat(c) => Some(c.value()),
            OarLang::Op(..) => None,
        };
        ClassData {
            ty: OarAnalysis::node_type(egraph, enode),
            splat,
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        let mut did = DidMerge(false, false);
        if a.ty.is_none() && b.ty.is_some() {
            a.ty = b.ty;
            did.0 = true;
        } else if b.ty.is_none() && a.ty.is_some() {
            did.1 = true;
        }
        if a.splat.is_none() && b.splat.is_some() {
            a.splat = b.splat;
            did.0 = true;
        } else if b.splat.is_none() && a.splat.is_some() {
            did.1 = true;
        }
        did
    }
}
