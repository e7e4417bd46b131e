//! Readable printing, in the style of Paddle and numpy: values, shape, dtype, device, grad flag.

use super::Tensor;
use oar_ir::DType;
use std::fmt;

/// Above this many elements, only the first and last `EDGE` items of each axis are shown.
const SUMMARIZE_OVER: usize = 1000;
const EDGE: usize = 3;

fn format_value(v: f64, dtype: DType, integral: bool) -> String {
    match dtype {
        DType::Bool => (if v != 0.0 { "true" } else { "false" }).to_string(),
        d if d.is_int() => format!("{}", v as i64),
        _ if v.is_nan() => "nan".into(),
        _ if v.is_infinite() => (if v > 0.0 { "inf" } else { "-inf" }).into(),
        _ if integral => format!("{v:.0}."),
        _ if v != 0.0 && (v.abs() >= 1e8 || v.abs() < 1e-4) => format!("{v:.4e}"),
        _ => format!("{v:.4}"),
    }
}

struct Layout<'a> {
    shape: &'a [usize],
    strings: Vec<String>,
    width: usize,
    summarize: bool,
}

impl Layout<'_> {
    fn write(&self, out: &mut String, axis: usize, offset: usize, indent: usize) {
        if axis == self.shape.len() {
            out.push_str(&format!("{:>w$}", self.strings[offset], w = self.width));
            return;
        }
        let n = self.shape[axis];
        let inner: usize = self.shape[axis + 1..].iter().product();
        out.push('[');
        let show: Vec<Option<usize>> = if self.summarize && n > 2 * EDGE {
            (0..EDGE)
                .map(Some)
                .chain([None])
                .chain((n - EDGE..n).map(Some))
                .collect()
        } else {
            (0..n).map(Some).collect()
        };
        for (k, i) in show.iter().enumerate() {
            if k > 0 {
                out.push(',');
                if axis + 1 == self.shape.len() {
                    out.push(' ');
                } else {
                    out.push_str(&"\n".repeat(self.shape.len() - axis - 1));
                    out.push_str(&" ".repeat(indent + 1));
                }
            }
            match i {
                Some(i) => self.write(out, axis + 1, offset + i * inner, indent + 1),
                None => out.push_str("..."),
            }
        }
        out.push(']');
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(t) = &self.0.trace {
            return write!(
                f,
                "Tensor(traced {}, shape={:?}, dtype={})",
                t.value,
                self.shape(),
                self.dtype()
            );
        }
        let data = self.data();
        let values = data.to_f64_vec();
        let integral = values.iter().all(|v| v.fract() == 0.0 && v.abs() < 1e15);
        let strings: Vec<String> = values
            .iter()
            .map(|&v| format_value(v, data.dtype(), integral))
            .collect();
        let width = strings.iter().map(String::len).max().unwrap_or(0);
        let header = format!(
            "Tensor(shape={:?}, dtype={}, place={}, stop_gradient={},",
            data.shape(),
            data.dtype(),
            self.device(),
            self.stop_gradient()
        );
        let layout = Layout {
            shape: data.shape(),
            strings,
            width,
            summarize: values.len() > SUMMARIZE_OVER,
        };
        let mut body = String::new();
        layout.write(&mut body, 0, 0, 7);
        write!(f, "{header}\n       {body})")
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use crate::Tensor;

    #[test]
    fn prints_values_shape_dtype_and_grad_flag() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.5, -5.0, 6.0], &[2, 3]).unwrap();
        assert_eq!(
            t.to_string(),
            "Tensor(shape=[2, 3], dtype=f32, place=cpu, stop_gradient=true,\n       [[ 1.0000,  2.0000,  3.0000],\n        [ 4.5000, -5.0000,  6.0000]])"
        );
        let i = Tensor::from_vec(vec![1i64, 20], &[2]).unwrap();
        assert!(i.to_string().ends_with("[ 1, 20])"), "{i}");
        let s = Tensor::scalar(2.0f64);
        assert!(s.to_string().ends_with("\n       2.)"), "{s}");
        let big = crate::zeros(&[2000], oar_ir::DType::F32).unwrap();
        assert!(big.to_string().contains("0., 0., 0., ..., 0., 0., 0."), "{big}");
    }
}
