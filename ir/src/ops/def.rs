//! What an op is: the two traits every op implements in its family's module, and the macros
//! that turn the op tables into enums (so name lists, parser tables and dispatch are generated,
//! never kept by hand).
//!
//! - [`OpText`]: the op's mnemonics and its typed attributes' text form. For a plain attribute
//!   struct it is derived by [`op_struct!`]; ops whose attributes live in the mnemonic
//!   (`reduce_sum`) or in the result type (`reshape`, `cast`) write it by hand.
//! - [`OpDef`]: everything else — family, type rule, FLOPs, VJP, decomposition (composites)
//!   and the reference evaluation the oracle runs.
//!
//! [`op_set!`] builds an enum from a table of `Variant(Type)` / unit `Variant` lines and
//! implements both traits for it by dispatching to each variant's type, so [`super::Op`] and
//! [`super::Composite`] are themselves ops.

use super::OpFamily;
use crate::eval::{EvalCx, Res, Value};
use crate::text::{Attrs, ParseError};
use crate::{Emitter, Graph, TensorType};

/// The text form of an op: mnemonics and attributes (see `docs/` and [`crate::text`]).
pub trait OpText: Sized {
    /// Every mnemonic this op type answers to (one for most; one per variant for families such
    /// as unary ops or reductions).
    fn mnemonics() -> &'static [&'static str];
    /// This op's mnemonic.
    fn name(&self) -> &'static str;
    /// Attributes in print order, formatted (the parser reads them back).
    fn print_attrs(&self) -> Vec<(&'static str, String)>;
    /// The op named `name` (one of [`OpText::mnemonics`]) from its written attributes and its
    /// declared result types.
    fn parse(name: &str, attrs: &mut Attrs, results: &[TensorType]) -> Result<Self, ParseError>;
}

/// The arguments of a vector-Jacobian product.
pub struct VjpArgs<'a, V> {
    /// The op's operands.
    pub inputs: &'a [V],
    /// The op's results.
    pub outputs: &'a [V],
    /// The cotangent of the first result (only single-result ops are differentiable).
    pub g: V,
    /// Whether each operand needs a gradient.
    pub wants: &'a [bool],
}

impl<V: Copy> VjpArgs<'_, V> {
    /// Whether operand `i` needs a gradient.
    pub fn want(&self, i: usize) -> bool {
        self.wants.get(i).copied().unwrap_or(false)
    }

    /// No gradient for any operand.
    pub fn none(&self) -> Vec<Option<V>> {
        vec![None; self.inputs.len()]
    }
}

/// The result of a gradient rule: one optional gradient per operand.
pub type Grads<E> = Result<Vec<Option<<E as Emitter>::Value>>, <E as Emitter>::Error>;

/// The meaning of an op, defined once (DESIGN.md principle 1).
pub trait OpDef: OpText {
    /// The op's family.
    fn family(&self) -> OpFamily;

    /// Number of regions (sub-graphs) the op holds.
    fn num_regions(&self) -> usize {
        0
    }

    /// Output types for `inputs` (and `regions`), or a sentence naming the offending types.
    fn infer(&self, inputs: &[TensorType], regions: &[Graph]) -> Result<Vec<TensorType>, String>;

    /// Estimated FLOPs (multiply-add = 2); `None` when a size it needs is symbolic.
    fn flops(&self, inputs: &[TensorType], outputs: &[TensorType]) -> Option<u64>;

    /// Gradients of the operands given the first result's cotangent, written with other ops
    /// (so eager autograd and static backward graphs share them).
    fn vjp<E: Emitter>(&self, e: &mut E, a: &VjpArgs<E::Value>) -> Grads<E>;

    /// Whether [`OpDef::vjp`] differentiates this op as a whole. Composites without a rule of
    /// their own say no: they are differentiated through their decomposition (decompose
    /// first).
    fn has_vjp(&self) -> bool {
        true
    }

    /// For a composite: the primitives computing it (operand types already checked against
    /// its rule; `want` are its output types). `None` for primitives.
    fn decompose<E: Emitter>(
        &self,
        _e: &mut E,
        _x: &[E::Value],
        _types: &[TensorType],
        _want: &[TensorType],
    ) -> Option<Result<Vec<E::Value>, E::Error>> {
        None
    }

    /// The reference evaluation: plain, obviously correct, in f64/i64 (see [`crate::eval`]).
    fn eval(&self, cx: &dyn EvalCx, ins: &[&Value]) -> Res<Vec<Value>>;

    /// Coverage modes of this op type (`scatter/add`, `gelu/tanh`): behaviours the
    /// conformance suite must exercise separately, beyond the mnemonic itself.
    fn modes() -> Vec<String> {
        Vec::new()
    }

    /// This op's mode among [`OpDef::modes`], if it has modes.
    fn mode(&self) -> Option<String> {
        None
    }

    /// Sample invocations every harness runs (conformance kit, gradient checks, fixtures).
    fn samples() -> Vec<super::Sample> {
        Vec::new()
    }
}

/// The "decompose first" gradient of a composite: composites are differentiated through
/// their decompositions.
pub(crate) fn composite_vjp<E: Emitter>(name: &str) -> Grads<E> {
    Err(crate::IrError::Type {
        op: name.into(),
        value: "<vjp>".into(),
        detail: "decompose composites before differentiating".into(),
    }
    .into())
}

/// An enum of named variants (`UnaryOp`, `ReduceOp`, ...): `ALL`, `NAMES`, `name()` and
/// `from_name()`.
macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        pub enum $name { $($(#[$vm])* $v,)* }
        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v,)*];
            /// Every variant's name, in declaration order.
            #[allow(dead_code)]
            pub const NAMES: &'static [&'static str] = &[$($s,)*];
            /// The name used in the text format.
            pub fn name(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }
            /// The variant with this name.
            pub fn from_name(s: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|v| v.name() == s)
            }
        }
    };
}
pub(crate) use named_enum;

/// A struct of typed attributes whose text form is every field, in order, under its own name
/// (an `Option` field may be left out). Derives [`OpText`] with one mnemonic.
///
/// ```ignore
/// op_struct! {
///     /// `softmax(x)` along `axis`.
///     Softmax "softmax" {
///         /// Axis.
///         axis: usize,
///     }
/// }
/// op_struct! { /// `max(x, 0)`.
///     Relu "relu" }
/// ```
macro_rules! op_struct {
    ($(#[$m:meta])* $name:ident $mn:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name;

        impl $crate::ops::OpText for $name {
            fn mnemonics() -> &'static [&'static str] {
                &[$mn]
            }
            fn name(&self) -> &'static str {
                $mn
            }
            fn print_attrs(&self) -> Vec<(&'static str, String)> {
                Vec::new()
            }
            fn parse(
                _name: &str,
                _attrs: &mut $crate::text::Attrs,
                _results: &[$crate::TensorType],
            ) -> Result<Self, $crate::text::ParseError> {
                Ok($name)
            }
        }
    };
    ($(#[$m:meta])* $name:ident $mn:literal { $( $(#[$fm:meta])* $f:ident : $t:ty ),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub struct $name {
            $( $(#[$fm])* pub $f: $t, )*
        }

        impl $crate::ops::OpText for $name {
            fn mnemonics() -> &'static [&'static str] {
                &[$mn]
            }
            fn name(&self) -> &'static str {
                $mn
            }
            fn print_attrs(&self) -> Vec<(&'static str, String)> {
                #[allow(unused_mut)]
                let mut v = Vec::new();
                $( if let Some(s) = $crate::text::AttrValue::print(&self.$f) {
                    v.push((stringify!($f), s));
                } )*
                v
            }
            fn parse(
                _name: &str,
                attrs: &mut $crate::text::Attrs,
                _results: &[$crate::TensorType],
            ) -> Result<Self, $crate::text::ParseError> {
                Ok($name { $( $f: attrs.get(stringify!($f))?, )* })
            }
        }
    };
}
pub(crate) use op_struct;

/// An enum of ops from a table of `Variant(Type)` and unit `Variant` lines (a unit variant's
/// definition is the unit struct of the same name), implementing [`OpText`] and [`OpDef`] by
/// dispatching to each variant's type. Mnemonic lists and the parser's table come from the
/// variants' own [`OpText::mnemonics`].
macro_rules! op_set {
    (
        $(#[$em:meta])*
        pub enum $E:ident {
            $( $(#[$vm:meta])* $V:ident $( ($T:ty) )? ),* $(,)?
        }
    ) => {
        $(#[$em])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $E {
            $( $(#[$vm])* $V $( ($T) )? ),*
        }

        impl $E {
            /// The op named `name` if some variant answers to it.
            pub(crate) fn try_parse(
                name: &str,
                attrs: &mut $crate::text::Attrs,
                results: &[$crate::TensorType],
            ) -> Option<Result<Self, $crate::text::ParseError>> {
                $(
                    if <op_set!(@ty $V $($T)?) as $crate::ops::OpText>::mnemonics().contains(&name) {
                        return Some(
                            <op_set!(@ty $V $($T)?) as $crate::ops::OpText>::parse(name, attrs, results)
                                .map(|d| op_set!(@wrap $E $V d $($T)?)),
                        );
                    }
                )*
                None
            }

            /// Sample invocations of every variant type.
            pub fn all_samples() -> Vec<$crate::ops::Sample> {
                let mut v: Vec<$crate::ops::Sample> = Vec::new();
                $( v.extend(<op_set!(@ty $V $($T)?) as $crate::ops::OpDef>::samples()); )*
                v
            }

            /// Coverage modes of every variant type.
            pub fn all_modes() -> Vec<String> {
                let mut v: Vec<String> = Vec::new();
                $( v.extend(<op_set!(@ty $V $($T)?) as $crate::ops::OpDef>::modes()); )*
                v
            }
        }

        impl $crate::ops::OpText for $E {
            fn mnemonics() -> &'static [&'static str] {
                static ALL: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
                ALL.get_or_init(|| {
                    let mut v: Vec<&'static str> = Vec::new();
                    $( v.extend_from_slice(<op_set!(@ty $V $($T)?) as $crate::ops::OpText>::mnemonics()); )*
                    v
                })
            }
            fn name(&self) -> &'static str {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpText::name(d) } )* }
            }
            fn print_attrs(&self) -> Vec<(&'static str, String)> {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpText::print_attrs(d) } )* }
            }
            fn parse(
                name: &str,
                attrs: &mut $crate::text::Attrs,
                results: &[$crate::TensorType],
            ) -> Result<Self, $crate::text::ParseError> {
                match Self::try_parse(name, attrs, results) {
                    Some(r) => r,
                    None => Err(attrs.here($crate::text::unknown_op(name))),
                }
            }
        }

        impl $crate::ops::OpDef for $E {
            fn family(&self) -> $crate::ops::OpFamily {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpDef::family(d) } )* }
            }
            fn num_regions(&self) -> usize {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpDef::num_regions(d) } )* }
            }
            fn infer(
                &self,
                inputs: &[$crate::TensorType],
                regions: &[$crate::Graph],
            ) -> Result<Vec<$crate::TensorType>, String> {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpDef::infer(d, inputs, regions) } )* }
            }
            fn flops(&self, inputs: &[$crate::TensorType], outputs: &[$crate::TensorType]) -> Option<u64> {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpDef::flops(d, inputs, outputs) } )* }
            }
            fn vjp<Em: $crate::Emitter>(
                &self,
                e: &mut Em,
                a: &$crate::ops::VjpArgs<Em::Value>,
            ) -> $crate::ops::Grads<Em> {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpDef::vjp(d, e, a) } )* }
            }
            fn has_vjp(&self) -> bool {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpDef::has_vjp(d) } )* }
            }
            fn decompose<Em: $crate::Emitter>(
                &self,
                e: &mut Em,
                x: &[Em::Value],
                types: &[$crate::TensorType],
                want: &[$crate::TensorType],
            ) -> Option<Result<Vec<Em::Value>, Em::Error>> {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpDef::decompose(d, e, x, types, want) } )* }
            }
            fn eval(
                &self,
                cx: &dyn $crate::eval::EvalCx,
                ins: &[&$crate::eval::Value],
            ) -> $crate::eval::Res<Vec<$crate::eval::Value>> {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpDef::eval(d, cx, ins) } )* }
            }
            fn modes() -> Vec<String> {
                Self::all_modes()
            }
            fn samples() -> Vec<$crate::ops::Sample> {
                Self::all_samples()
            }
            fn mode(&self) -> Option<String> {
                match self { $( op_set!(@pat $E $V d $($T)?) => { op_set!(@bind d $V $($T)?); $crate::ops::OpDef::mode(d) } )* }
            }
        }
    };
    (@ty $V:ident) => { $V };
    (@ty $V:ident $T:ty) => { $T };
    (@wrap $E:ident $V:ident $d:ident) => {{
        let _ = $d;
        $E::$V
    }};
    (@wrap $E:ident $V:ident $d:ident $T:ty) => { $E::$V($d) };
    (@pat $E:ident $V:ident $d:ident) => { $E::$V };
    (@pat $E:ident $V:ident $d:ident $T:ty) => { $E::$V($d) };
    (@bind $d:ident $V:ident) => { let $d = &$V; };
    (@bind $d:ident $V:ident $T:ty) => {};
}
pub(crate) use op_set;

#[cfg(test)]
mod tests {
    use crate::ops::{BinaryOp, Composite, Op, OpText, UnaryOp};
    use std::collections::BTreeSet;

    #[test]
    fn names_are_unique_and_parse_back() {
        for u in UnaryOp::ALL {
            assert_eq!(UnaryOp::from_name(u.name()), Some(*u));
        }
        for b in BinaryOp::ALL {
            assert_eq!(BinaryOp::from_name(b.name()), Some(*b));
        }
        assert!(BinaryOp::Lt.is_comparison() && !BinaryOp::Sub.is_commutative());
        // The generated tables: every mnemonic once, composites included.
        let all = Op::all_mnemonics();
        let set: BTreeSet<_> = all.iter().collect();
        assert_eq!(set.len(), all.len(), "duplicate mnemonics in {all:?}");
        for c in Composite::names() {
            assert!(all.contains(c), "{c}");
        }
        assert!(all.contains(&"reduce_sum") && all.contains(&"sdpa") && all.contains(&"input"));
        assert_eq!(<Composite as OpText>::mnemonics().len(), Composite::names().len());
    }
}
