//! Errors of graph construction and verification.

/// An error building or checking a graph. Messages name the op, the value and the types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IrError {
    /// An op's type/shape rule rejected its operands.
    #[error("op `{op}` at {value}: {detail}")]
    Type {
        /// Op mnemonic.
        op: String,
        /// The value being defined (`%12`), or `<new>` while building.
        value: String,
        /// What is wrong, with the offending types.
        detail: String,
    },
    /// An operand refers to a value that does not exist.
    #[error("op `{op}` at {value}: operand {operand} does not exist")]
    BadOperand {
        /// Op mnemonic.
        op: String,
        /// The value being defined.
        value: String,
        /// The missing operand.
        operand: String,
    },
    /// Two graph inputs share a name.
    #[error("graph `{graph}`: duplicate input name `{name}`")]
    DuplicateInput {
        /// Graph name.
        graph: String,
        /// Input name.
        name: String,
    },
    /// Two graph outputs share a name.
    #[error("graph `{graph}`: duplicate output name `{name}`")]
    DuplicateOutput {
        /// Graph name.
        graph: String,
        /// Output name.
        name: String,
    },
    /// A parameter name is declared with two types.
    #[error("param `{name}` is declared as {first} and as {second}")]
    ParamConflict {
        /// Parameter name.
        name: String,
        /// First type.
        first: String,
        /// Conflicting type.
        second: String,
    },
    /// Any other structural problem (cycles, dangling outputs, malformed definitions).
    #[error("graph `{graph}`: {detail}")]
    Structure {
        /// Graph name.
        graph: String,
        /// What is wrong.
        detail: String,
    },
}
