//! `dense<...> : T` constants. The literal comes before its type, so it is skipped first, the
//! type read, and then the literal parsed knowing the dtype and shape: the byte size is
//! checked before anything is allocated, and nested lists are walked with an explicit bracket
//! odometer (no recursion, whatever the nesting).

use super::ParseError;
use super::lexer::Tok;
use super::literal::{parse_elem, parse_hex_bytes};
use super::parse::Parser;
use super::print::fmt_type;
use crate::DType;
use crate::tensor_data::{TensorData, checked_byte_len};

impl Parser {
    /// `dense<...> : T`.
    pub(super) fn constant(&mut self) -> Result<TensorData, ParseError> {
        self.keyword("dense")?;
        self.punct('<')?;
        let lit_start = self.pos;
        match self.peek() {
            Tok::Punct('[') => {
                let mut depth = 0usize;
                loop {
                    match self.peek() {
                        Tok::Punct('[') => depth += 1,
                        Tok::Punct(']') => depth -= 1,
                        // `>` and `:` never occur inside a literal: the list was left open.
                        Tok::Punct('>' | ':') | Tok::Eof => {
                            let found = self.peek().describe();
                            return Err(self.err(format!("expected ']' to close the constant, found {found}")));
                        }
                        _ => {}
                    }
                    self.bump();
                    if depth == 0 {
                        break;
                    }
                }
            }
            Tok::Number(_) | Tok::Ident(_) | Tok::Str(_) => {
                self.bump();
            }
            t => return Err(self.err(format!("expected a constant value, found {}", t.describe()))),
        }
        self.punct('>')?;
        self.punct(':')?;
        let ty_tok = self.tok().clone();
        let ty = self.ty()?;
        let after = self.pos;
        let shape = ty.shape.as_static().ok_or_else(|| {
            Self::err_at(
                &ty_tok,
                format!("a constant needs a static shape, got {}", fmt_type(&ty)),
            )
        })?;
        let len = checked_byte_len(ty.dtype, &shape).map_err(|e| Self::err_at(&ty_tok, format!("constant: {e}")))?;
        self.pos = lit_start;
        let bytes = if let Tok::Str(s) = self.peek().clone() {
            let at = self.bump();
            parse_hex_bytes(&s, len).map_err(|m| Self::err_at(&at, m))?
        } else {
            self.dense_elements(ty.dtype, &shape)?
        };
        if self.peek() != &Tok::Punct('>') {
            return Err(self.err(format!(
                "expected '>' after the constant, found {}",
                self.peek().describe()
            )));
        }
        self.pos = after;
        TensorData::from_bytes(ty.dtype, shape, bytes).map_err(|e| Self::err_at(&ty_tok, format!("constant: {e}")))
    }

    fn elem(&mut self, dtype: DType, out: &mut Vec<u8>) -> Result<(), ParseError> {
        let t = self.bump();
        match &t.tok {
            Tok::Number(s) | Tok::Ident(s) => parse_elem(dtype, s, out).map_err(|m| Self::err_at(&t, m)),
            tok => Err(Self::err_at(
                &t,
                format!("expected a {dtype} element, found {}", tok.describe()),
            )),
        }
    }

    /// Nested lists matching `shape` exactly, walked with an odometer (no recursion).
    fn dense_elements(&mut self, dtype: DType, shape: &[usize]) -> Result<Vec<u8>, ParseError> {
        let mut out = Vec::new();
        let rank = shape.len();
        if rank == 0 {
            self.elem(dtype, &mut out)?;
            return Ok(out);
        }
        self.punct('[')?;
        let mut counts = vec![0usize; rank];
        let mut depth = 1;
        loop {
            let d = depth - 1;
            if counts[d] == shape[d] {
                if !self.eat(']') {
                    return Err(self.err(format!(
                        "expected ']': axis {d} of the constant has {} elements, found {}",
                        shape[d],
                        self.peek().describe()
                    )));
                }
                depth -= 1;
                if depth == 0 {
                    return Ok(out);
                }
                counts[depth - 1] += 1;
                continue;
            }
            if counts[d] > 0 && !self.eat(',') {
                return Err(self.err(format!(
                    "expected ',': axis {d} of the constant has {} elements, found {}",
                    shape[d],
                    self.peek().describe()
                )));
            }
            if depth == rank {
                self.elem(dtype, &mut out)?;
                counts[d] += 1;
            } else {
                self.punct('[')?;
                counts[depth] = 0;
                depth += 1;
            }
        }
    }
}
