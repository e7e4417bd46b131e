//! Reference evaluation: the values every op's `OpDef::eval` computes on, and what an op may
//! ask of the interpreter running it ([`EvalCx`]).
//!
//! Every float dtype is held as `f64` and every integer dtype as `i64`; after each op the
//! interpreter rounds floats to their dtype (`f32`, `f16`, `bf16`) and wraps integers to
//! theirs (`i8`, `u8`, `i32`). Computing in the wider type and rounding once is what makes
//! `+ - * / sqrt` bit-identical to native IEEE arithmetic in the narrow type (the wide type has
//! more than twice the significand bits plus two), and makes reductions and contractions more
//! accurate than any backend — which is what an oracle should be.

use crate::tensor_data::checked_byte_len;
use crate::{BackendError, DType, Dim, TensorData};
use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, IxDyn, Zip};

/// Result of an evaluation step.
pub type Res<T> = Result<T, BackendError>;

/// What an op's reference evaluation may ask of the interpreter running it.
pub trait EvalCx {
    /// Where the op is (its mnemonic and the value it defines), for errors.
    fn site(&self) -> &Site;
    /// Concrete sizes of `dims`, symbols bound by the graph's inputs.
    fn resolve(&self, dims: &[Dim]) -> Res<Vec<usize>>;
    /// Evaluate region `i` of the op's node on `args` (control flow).
    fn region(&self, i: usize, args: &[Value]) -> Res<Vec<Value>>;
    /// The most iterations a `while` may run before it is an error.
    fn max_while_iterations(&self) -> u64;
}

/// An [`EvalCx`] for ops without symbolic shapes or regions (constant folding, kernels).
pub struct PlainCx<'a> {
    /// Where the op is.
    pub site: &'a Site,
}

impl EvalCx for PlainCx<'_> {
    fn site(&self) -> &Site {
        self.site
    }
    fn resolve(&self, dims: &[Dim]) -> Res<Vec<usize>> {
        dims.iter()
            .map(|d| {
                d.as_static()
                    .ok_or_else(|| self.site.err(format!("symbolic dim `{d}` has no value here")))
            })
            .collect()
    }
    fn region(&self, _i: usize, _args: &[Value]) -> Res<Vec<Value>> {
        Err(self.site.err("regions cannot be evaluated here"))
    }
    fn max_while_iterations(&self) -> u64 {
        0
    }
}

/// numpy's broadcast of two concrete shapes.
pub fn broadcast_dims(site: &Site, a: &[usize], b: &[usize]) -> Res<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = (i + a.len()).checked_sub(rank).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(rank).map_or(1, |j| b[j]);
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(site.err(format!("shapes {a:?} and {b:?} do not broadcast"))),
        });
    }
    Ok(out)
}

/// A view of `a` broadcast to `shape`, or an error.
pub fn view_as<'a, T>(site: &Site, a: &'a ArrayD<T>, shape: &[usize]) -> Res<ArrayViewD<'a, T>> {
    a.broadcast(IxDyn(shape))
        .ok_or_else(|| site.err(format!("shape {:?} does not broadcast to {shape:?}", a.shape())))
}

/// Apply `f` to pairs of broadcast elements.
pub fn zip2<A: Copy, B: Copy, C>(site: &Site, a: &ArrayD<A>, b: &ArrayD<B>, f: impl Fn(A, B) -> C) -> Res<ArrayD<C>> {
    let shape = broadcast_dims(site, a.shape(), b.shape())?;
    let (va, vb) = (view_as(site, a, &shape)?, view_as(site, b, &shape)?);
    Ok(Zip::from(&va).and(&vb).map_collect(|&x, &y| f(x, y)))
}

/// An array of `shape` from row-major elements, or an error at `site`.
pub fn array<T>(site: &Site, shape: &[usize], v: Vec<T>) -> Res<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| site.err(e.to_string()))
}

/// Evaluate a single-result op whose shapes are all static (no regions): what constant
/// folding and kernel interpreters need.
pub fn eval_one(site: &Site, op: &impl crate::ops::OpDef, ins: &[&Value]) -> Res<Value> {
    let mut outs = op.eval(&PlainCx { site }, ins)?;
    match outs.len() {
        1 => Ok(outs.remove(0)),
        n => Err(site.err(format!("expected one result, the op gave {n}"))),
    }
}

/// Check an op got one of the operand counts `ok`.
pub fn arity(site: &Site, ins: &[&Value], ok: &[usize]) -> Res<()> {
    if !ok.contains(&ins.len()) {
        return Err(site.err(format!("expects {ok:?} operands, got {}", ins.len())));
    }
    Ok(())
}

/// The storage of a value: one array type per dtype class.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// f32, f64, f16, bf16.
    F(ArrayD<f64>),
    /// i8, u8, i32, i64.
    I(ArrayD<i64>),
    /// bool.
    B(ArrayD<bool>),
}

/// Apply the same expression to whichever array a [`Data`] holds, keeping the class.
macro_rules! map_data {
    ($data:expr, $a:ident => $e:expr) => {
        match $data {
            $crate::eval::Data::F($a) => $crate::eval::Data::F($e),
            $crate::eval::Data::I($a) => $crate::eval::Data::I($e),
            $crate::eval::Data::B($a) => $crate::eval::Data::B($e),
        }
    };
}
pub(crate) use map_data;

/// A tensor value: its dtype and its (wide) storage.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// The logical dtype.
    pub dtype: DType,
    /// The elements.
    pub data: Data,
}

/// Where an error happened: the op and the value it defines (`%12`).
pub struct Site {
    /// Op mnemonic.
    pub op: String,
    /// Value id, `%<node index>`.
    pub value: String,
}

impl Site {
    /// A runtime error at this site.
    pub fn err(&self, detail: impl Into<String>) -> BackendError {
        BackendError::Runtime {
            op: self.op.clone(),
            value: self.value.clone(),
            detail: detail.into(),
        }
    }

    /// Refuse a tensor of `dtype` and `shape` that overflows or exceeds the memory budget
    /// ([`crate::memory::limit`]) as the interpreter holds it: 8 bytes per element (f64 / i64).
    pub fn check_size(&self, dtype: DType, shape: &[usize], what: &str) -> Res<()> {
        checked_byte_len(dtype, shape).map_err(|e| self.err(format!("{what}: {e}")))?;
        let held = shape.iter().try_fold(8usize, |a, &d| a.checked_mul(d));
        let limit = crate::memory::limit();
        match held {
            Some(b) if b as u64 <= limit => Ok(()),
            _ => Err(self.err(format!(
                "{what}: {dtype}{shape:?} takes {} bytes in the interpreter (8 per element), the memory limit is {limit} bytes ({})",
                held.map_or("more than 2^64".to_string(), |b| b.to_string()),
                crate::memory::limit_source()
            ))),
        }
    }
}

/// Round an f64 to the nearest value of a float dtype (identity for f64).
pub fn round_float(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

/// Wrap an i64 to an integer dtype (two's complement, like numpy's `astype`).
pub fn wrap_int(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I32 => v as i32 as i64,
        _ => v,
    }
}

/// Float → integer dtype: truncate toward zero and saturate; NaN → 0 (Rust `as`).
pub fn float_to_int(dtype: DType, v: f64) -> i64 {
    match dtype {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I32 => v as i32 as i64,
        _ => v as i64,
    }
}

impl Value {
    /// A float value of `dtype`.
    pub fn float(dtype: DType, a: ArrayD<f64>) -> Value {
        Value {
            dtype,
            data: Data::F(a),
        }
    }

    /// An integer value of `dtype`.
    pub fn int(dtype: DType, a: ArrayD<i64>) -> Value {
        Value {
            dtype,
            data: Data::I(a),
        }
    }

    /// A bool value.
    pub fn boolean(a: ArrayD<bool>) -> Value {
        Value {
            dtype: DType::Bool,
            data: Data::B(a),
        }
    }

    /// The same dtype with other data of the same class.
    pub fn with(&self, data: Data) -> Value {
        Value {
            dtype: self.dtype,
            data,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match &self.data {
            Data::F(a) => a.shape(),
            Data::I(a) => a.shape(),
            Data::B(a) => a.shape(),
        }
    }

    /// The storage class matches the dtype.
    pub fn is_consistent(&self) -> bool {
        match &self.data {
            Data::F(_) => self.dtype.is_float(),
            Data::I(_) => self.dtype.is_int(),
            Data::B(_) => self.dtype == DType::Bool,
        }
    }

    /// Round floats / wrap integers to the dtype, in place.
    pub fn normalize(&mut self) {
        let d = self.dtype;
        match &mut self.data {
            Data::F(a) if d != DType::F64 => a.mapv_inplace(|v| round_float(d, v)),
            Data::I(a) if d != DType::I64 => a.mapv_inplace(|v| wrap_int(d, v)),
            _ => {}
        }
    }

    /// The float array, or an error naming what was expected.
    pub fn as_f(&self, site: &Site, what: &str) -> Res<&ArrayD<f64>> {
        match &self.data {
            Data::F(a) => Ok(a),
            _ => Err(site.err(format!("{what} must be a float tensor, got {}", self.dtype))),
        }
    }

    /// The integer array, or an error naming what was expected.
    pub fn as_i(&self, site: &Site, what: &str) -> Res<&ArrayD<i64>> {
        match &self.data {
            Data::I(a) => Ok(a),
            _ => Err(site.err(format!("{what} must be an integer tensor, got {}", self.dtype))),
        }
    }

    /// The bool array, or an error naming what was expected.
    pub fn as_b(&self, site: &Site, what: &str) -> Res<&ArrayD<bool>> {
        match &self.data {
            Data::B(a) => Ok(a),
            _ => Err(site.err(format!("{what} must be a bool tensor, got {}", self.dtype))),
        }
    }

    /// Read a host tensor.
    pub fn from_tensor(t: &TensorData) -> Result<Value, String> {
        let shape = ndarray::IxDyn(t.shape());
        let err = |e: &dyn std::fmt::Display| e.to_string();
        let ints = |v: Vec<i64>| ArrayD::from_shape_vec(shape.clone(), v).map_err(|e| err(&e));
        let dtype = t.dtype();
        let data = match dtype {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {
                Data::F(ArrayD::from_shape_vec(shape.clone(), t.to_f64_vec()).map_err(|e| err(&e))?)
            }
            DType::I8 => Data::I(ints(conv_vec(t.to_vec::<i8>().map_err(|e| err(&e))?))?),
            DType::U8 => Data::I(ints(conv_vec(t.to_vec::<u8>().map_err(|e| err(&e))?))?),
            DType::I32 => Data::I(ints(conv_vec(t.to_vec::<i32>().map_err(|e| err(&e))?))?),
            DType::I64 => Data::I(ints(t.to_vec::<i64>().map_err(|e| err(&e))?)?),
            DType::Bool => Data::B(
                ArrayD::from_shape_vec(shape.clone(), t.to_vec::<bool>().map_err(|e| err(&e))?).map_err(|e| err(&e))?,
            ),
        };
        Ok(Value { dtype, data })
    }

    /// Write a host tensor (elements in row-major order).
    pub fn to_tensor(&self) -> Result<TensorData, String> {
        let shape = self.shape().to_vec();
        let r = match &self.data {
            Data::F(a) => {
                let v: Vec<f64> = a.iter().copied().collect();
                TensorData::from_f64_slice(self.dtype, shape, &v)
            }
            Data::I(a) => match self.dtype {
                DType::I8 => TensorData::from_vec(shape, a.iter().map(|&v| v as i8).collect()),
                DType::U8 => TensorData::from_vec(shape, a.iter().map(|&v| v as u8).collect()),
                DType::I32 => TensorData::from_vec(shape, a.iter().map(|&v| v as i32).collect()),
                _ => TensorData::from_vec(shape, a.iter().copied().collect()),
            },
            Data::B(a) => TensorData::from_vec(shape, a.iter().copied().collect()),
        };
        r.map_err(|e| e.to_string())
    }
}

fn conv_vec<T: Into<i64>>(v: Vec<T>) -> Vec<i64> {
    v.into_iter().map(Into::into).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_dtype() {
        for d in DType::ALL {
            let t = TensorData::from_f64_slice(d, vec![2, 2], &[1.0, -2.0, 0.0, 3.0]).unwrap();
            let v = Value::from_tensor(&t).unwrap();
            assert!(v.is_consistent(), "{d}");
            assert_eq!(v.to_tensor().unwrap(), t, "{d}");
        }
        let big = TensorData::from_vec(vec![1], vec![i64::MAX - 1]).unwrap();
        assert_eq!(Value::from_tensor(&big).unwrap().to_tensor().unwrap(), big);
    }

    #[test]
    fn rounding_and_wrapping() {
        assert_eq!(round_float(DType::F32, 0.1), 0.1f32 as f64);
        assert_eq!(round_float(DType::F16, 1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(wrap_int(DType::U8, -1), 255);
        assert_eq!(wrap_int(DType::I8, 128), -128);
        assert_eq!(float_to_int(DType::I8, 300.7), 127);
        assert_eq!(float_to_int(DType::I32, -2.9), -2);
        assert_eq!(float_to_int(DType::U8, -5.0), 0);
        assert_eq!(float_to_int(DType::I64, f64::NAN), 0);
    }
}
