//! `+ - * /` on tensors. Ops can fail (shapes, dtypes), so each returns `Result<Tensor>`, and
//! a `Result<Tensor>` can be the left operand of a tensor, so `((&a * &b) + &c)?` works.

use super::Tensor;
use crate::error::Result;
use oar_ir::ops::BinaryOp;
use std::ops::{Add, Div, Mul, Neg, Sub};

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                super::apply1(oar_ir::Op::Binary(BinaryOp::$op), &[self, rhs])
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                (&self).$method(&rhs)
            }
        }
        impl $trait<&Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                (&self?).$method(rhs)
            }
        }
        impl $trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: f64) -> Result<Tensor> {
                self.binary_scalar(BinaryOp::$op, rhs)
            }
        }
    };
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}
