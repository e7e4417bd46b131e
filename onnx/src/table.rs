//! The ONNX mapping tables. Each family module (`ops_elementwise`, `ops_nn`, `ops_quant`,
//! `ops_rnn`, `ops_shape`, `ops_vision`) declares one [`Table`] next to its converters and writers: the
//! ONNX op types it imports, and the oar ops it writes as ONNX nodes — so an op's ONNX mapping,
//! both ways, is in one file. Import dispatch, [`supported_ops`] and the exporter's lookup come
//! from these tables; a composite without a writer is exported as its decomposition.

use crate::export::{Exporter, Written};
use crate::ops::{NodeCx, R};
use crate::{ops_elementwise, ops_nn, ops_quant, ops_rnn, ops_shape, ops_vision};
use oar_ir::{Op, TensorType, ValueId};

/// A converter: the node (in its context) to oar values, one per ONNX output.
pub(crate) type Convert = fn(&mut NodeCx<'_>) -> R<Vec<ValueId>>;

/// A writer: one oar op, given its operands' ONNX names and types, as ONNX nodes.
pub(crate) type Write = fn(&mut Exporter<'_>, &Op, &[String], &[TensorType]) -> Written;

/// One family's ONNX mapping.
pub(crate) struct Table {
    /// Default-domain ONNX op types imported, alphabetical, each with its converter.
    pub imports: &'static [(&'static str, Convert)],
    /// oar ops (mnemonics, [`Op::name`]) written as ONNX nodes, each with its writer.
    pub exports: &'static [(&'static str, Write)],
}

/// A converter's single result.
pub(crate) fn one(v: R<ValueId>) -> R<Vec<ValueId>> {
    v.map(|v| vec![v])
}

const TABLES: [&Table; 6] = [
    &ops_elementwise::TABLE,
    &ops_nn::TABLE,
    &ops_quant::TABLE,
    &ops_rnn::TABLE,
    &ops_shape::TABLE,
    &ops_vision::TABLE,
];

/// The converter of `op_type`, if oar imports it.
pub(crate) fn converter(op_type: &str) -> Option<Convert> {
    TABLES
        .iter()
        .flat_map(|t| t.imports)
        .find(|(name, _)| *name == op_type)
        .map(|(_, f)| *f)
}

/// The writer of oar op `name`, if it has one.
pub(crate) fn exporter(name: &str) -> Option<Write> {
    TABLES
        .iter()
        .flat_map(|t| t.exports)
        .find(|(op, _)| *op == name)
        .map(|(_, f)| *f)
}

/// Every default-domain ONNX op type oar imports, alphabetical.
pub fn supported_ops() -> impl Iterator<Item = &'static str> {
    let mut names: Vec<&'static str> = TABLES.iter().flat_map(|t| t.imports).map(|(n, _)| *n).collect();
    names.sort_by_key(|n| n.to_lowercase());
    names.into_iter()
}

#[cfg(test)]
mod tests {
    use super::TABLES;
    use oar_ir::Op;
    use oar_ir::ops::OpText;
    use std::collections::BTreeSet;

    #[test]
    fn the_tables_are_sorted_and_name_each_op_once() {
        let mut imports = BTreeSet::new();
        let mut exports = BTreeSet::new();
        for t in TABLES {
            for w in t.imports.windows(2) {
                assert!(
                    w[0].0.to_lowercase() < w[1].0.to_lowercase(),
                    "{} before {}",
                    w[0].0,
                    w[1].0
                );
            }
            for (name, _) in t.imports {
                assert!(imports.insert(*name), "{name} imported twice");
            }
            for (op, _) in t.exports {
                assert!(exports.insert(*op), "{op} written twice");
                assert!(<Op as OpText>::mnemonics().contains(op), "{op} is not an oar op");
            }
        }
    }
}
