//! Scalar literals: exact printing and parsing of floats (incl. NaN payloads, ±inf, -0.0),
//! range-checked integers, and the elements of `dense<...>` constants.

use crate::DType;
use crate::tensor_data::TensorData;
use half::{bf16, f16};

/// Constants with at most this many elements print as nested lists; larger ones as hex bytes.
pub(crate) const MAX_READABLE_ELEMENTS: usize = 64;

/// Print an f64 so that [`parse_f64`] gives back the same bits: the shortest round-trip
/// decimal, `inf`/`-inf`, `nan`/`-nan` for the canonical quiet NaN, and raw bits
/// (`0x7FF0000000000001`) for any other NaN.
pub(crate) fn fmt_f64(v: f64) -> String {
    fmt_float(v.is_nan(), v.to_bits(), f64::NAN.to_bits(), 16, || format!("{v:?}"))
}

fn fmt_float(is_nan: bool, bits: u64, canonical_nan: u64, hex_digits: usize, decimal: impl Fn() -> String) -> String {
    let sign = 1u64 << (hex_digits * 4 - 1);
    if !is_nan {
        decimal()
    } else if bits == canonical_nan {
        "nan".into()
    } else if bits == canonical_nan | sign {
        "-nan".into()
    } else {
        format!("0x{bits:0hex_digits$X}")
    }
}

/// Print one element of a float dtype given its little-endian bytes.
fn fmt_float_elem(dtype: DType, b: &[u8]) -> String {
    match dtype {
        DType::F32 => {
            let v = f32::from_le_bytes(b.try_into().expect("4 bytes"));
            fmt_float(v.is_nan(), v.to_bits().into(), f32::NAN.to_bits().into(), 8, || {
                format!("{v:?}")
            })
        }
        DType::F64 => fmt_f64(f64::from_le_bytes(b.try_into().expect("8 bytes"))),
        DType::F16 | DType::BF16 => {
            let bits = u16::from_le_bytes(b.try_into().expect("2 bytes"));
            let (v, nan) = if dtype == DType::F16 {
                (f16::from_bits(bits).to_f32(), f16::NAN.to_bits())
            } else {
                (bf16::from_bits(bits).to_f32(), bf16::NAN.to_bits())
            };
            // The f32 value is exactly the half value, so its shortest decimal parses back exactly.
            fmt_float(v.is_nan(), bits.into(), nan.into(), 4, || format!("{v:?}"))
        }
        _ => unreachable!("float dtype"),
    }
}

/// Bits of a float literal for a float type `bits` wide: decimal (via `decimal`, which must
/// round exactly), `inf`, `nan`, their negations, or raw hex bits.
fn parse_float_bits(
    text: &str,
    width: u32,
    canonical_nan: u64,
    decimal: impl Fn(&str) -> Option<u64>,
) -> Result<u64, String> {
    let sign = 1u64 << (width - 1);
    let inf = decimal("inf").expect("inf parses");
    match text {
        "nan" | "NaN" => return Ok(canonical_nan),
        "-nan" | "-NaN" => return Ok(canonical_nan | sign),
        "inf" => return Ok(inf),
        "-inf" => return Ok(inf | sign),
        _ => {}
    }
    if let Some(hex) = text.strip_prefix("0x") {
        let bits = u64::from_str_radix(hex, 16).map_err(|_| format!("bad hex float bits '{text}'"))?;
        if width < 64 && bits >> width != 0 {
            return Err(format!("hex float bits '{text}' do not fit in {width} bits"));
        }
        return Ok(bits);
    }
    // Only plain decimals: Rust's parser would also take words such as `infinity`.
    let plain = text
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'));
    let starts_ok = text.trim_start_matches('-').starts_with(|c: char| c.is_ascii_digit());
    if !plain || !starts_ok {
        return Err(format!("expected a float literal, found '{text}'"));
    }
    decimal(text).ok_or_else(|| format!("expected a float literal, found '{text}'"))
}

/// Parse a float literal printed by [`fmt_f64`] (or hand-written) bit-exactly.
pub(crate) fn parse_f64(text: &str) -> Result<f64, String> {
    let bits = parse_float_bits(text, 64, f64::NAN.to_bits(), |s| {
        s.parse::<f64>().ok().map(f64::to_bits)
    })?;
    Ok(f64::from_bits(bits))
}

/// Append one float element of `dtype` parsed from `text` as little-endian bytes.
fn parse_float_elem(dtype: DType, text: &str, out: &mut Vec<u8>) -> Result<(), String> {
    match dtype {
        DType::F32 => {
            let bits = parse_float_bits(text, 32, f32::NAN.to_bits().into(), |s| {
                s.parse::<f32>().ok().map(|v| v.to_bits().into())
            })?;
            out.extend_from_slice(&(bits as u32).to_le_bytes());
        }
        DType::F64 => out.extend_from_slice(&parse_f64(text)?.to_le_bytes()),
        DType::F16 => {
            let bits = parse_float_bits(text, 16, f16::NAN.to_bits().into(), |s| {
                s.parse::<f32>().ok().map(|v| f16::from_f32(v).to_bits().into())
            })?;
            out.extend_from_slice(&(bits as u16).to_le_bytes());
        }
        DType::BF16 => {
            let bits = parse_float_bits(text, 16, bf16::NAN.to_bits().into(), |s| {
                s.parse::<f32>().ok().map(|v| bf16::from_f32(v).to_bits().into())
            })?;
            out.extend_from_slice(&(bits as u16).to_le_bytes());
        }
        _ => unreachable!("float dtype"),
    }
    Ok(())
}

/// Parse a decimal integer of type `T`, naming the type when it overflows.
pub(crate) fn parse_int<T: std::str::FromStr>(text: &str, what: &str) -> Result<T, String> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("expected an integer ({what}), found '{text}'"));
    }
    text.parse::<T>()
        .map_err(|_| format!("integer {text} is out of range for {what}"))
}

/// Print element `i` of `t`.
pub(crate) fn fmt_elem(t: &TensorData, i: usize) -> String {
    let w = t.dtype().size_bytes();
    let b = &t.bytes()[i * w..(i + 1) * w];
    match t.dtype() {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => fmt_float_elem(t.dtype(), b),
        DType::I8 => (b[0] as i8).to_string(),
        DType::U8 => b[0].to_string(),
        DType::I32 => i32::from_le_bytes(b.try_into().expect("4 bytes")).to_string(),
        DType::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")).to_string(),
        DType::Bool => (b[0] != 0).to_string(),
    }
}

/// Append one element of `dtype` parsed from `text` (a number or word token's text).
pub(crate) fn parse_elem(dtype: DType, text: &str, out: &mut Vec<u8>) -> Result<(), String> {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => parse_float_elem(dtype, text, out)?,
        DType::I8 => out.push(parse_int::<i8>(text, "i8")? as u8),
        DType::U8 => out.push(parse_int::<u8>(text, "u8")?),
        DType::I32 => out.extend_from_slice(&parse_int::<i32>(text, "i32")?.to_le_bytes()),
        DType::I64 => out.extend_from_slice(&parse_int::<i64>(text, "i64")?.to_le_bytes()),
        DType::Bool => match text {
            "true" => out.push(1),
            "false" => out.push(0),
            _ => return Err(format!("expected true or false for a bool element, found '{text}'")),
        },
    }
    Ok(())
}

/// True if the constant prints as nested lists: few elements, few brackets (a shape such as
/// `[1000000, 0]` has no elements but a million `[]`), and every element printable exactly
/// (bool bytes other than 0/1 only survive as raw bytes).
pub(crate) fn prints_readably(t: &TensorData) -> bool {
    let mut lists = 0usize;
    let mut outer = 1usize;
    for &d in t.shape() {
        lists = lists.saturating_add(outer);
        outer = outer.saturating_mul(d);
    }
    let bools_ok = t.dtype() != DType::Bool || t.bytes().iter().all(|&b| b <= 1);
    t.len() <= MAX_READABLE_ELEMENTS && lists <= 4 * MAX_READABLE_ELEMENTS && bools_ok
}

/// Print the body of `dense<...>`: a scalar, nested lists, or `"0x..."` raw little-endian bytes.
pub(crate) fn fmt_dense(t: &TensorData) -> String {
    use std::fmt::Write;
    if !prints_readably(t) {
        let mut s = String::with_capacity(4 + 2 * t.bytes().len());
        s.push_str("\"0x");
        for b in t.bytes() {
            write!(s, "{b:02X}").expect("write to string");
        }
        s.push('"');
        return s;
    }
    let shape = t.shape();
    if shape.is_empty() {
        return fmt_elem(t, 0);
    }
    // The same bracket odometer as the parser: `counts[d]` items done in the open list at depth d.
    let rank = shape.len();
    let mut s = String::from("[");
    let mut counts = vec![0usize; rank];
    let (mut depth, mut elem) = (1, 0);
    loop {
        let d = depth - 1;
        if counts[d] == shape[d] {
            s.push(']');
            depth -= 1;
            if depth == 0 {
                return s;
            }
            counts[depth - 1] += 1;
            continue;
        }
        if counts[d] > 0 {
            s.push_str(", ");
        }
        if depth == rank {
            s.push_str(&fmt_elem(t, elem));
            elem += 1;
            counts[d] += 1;
        } else {
            s.push('[');
            counts[depth] = 0;
            depth += 1;
        }
    }
}

/// Decode the hex-bytes form `0x...` (the string token's content).
pub(crate) fn parse_hex_bytes(s: &str, expected: usize) -> Result<Vec<u8>, String> {
    let hex = s
        .strip_prefix("0x")
        .ok_or_else(|| "a string constant must be hex bytes \"0x...\"".to_string())?;
    if hex.len() != 2 * expected {
        return Err(format!(
            "hex constant has {} digits, but its type needs {expected} bytes ({} digits)",
            hex.len(),
            2 * expected
        ));
    }
    hex.as_bytes()
        .chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| "hex constant has a non-hex digit".to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_round_trip_bit_exactly() {
        let odd_nan = f64::from_bits(0x7FF0_0000_0000_0001);
        for v in [
            0.0,
            -0.0,
            1.5,
            1e-300,
            5e-324,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            odd_nan,
        ] {
            let s = fmt_f64(v);
            assert_eq!(parse_f64(&s).unwrap().to_bits(), v.to_bits(), "{s}");
        }
        assert_eq!(fmt_f64(-0.0), "-0.0");
        assert_eq!(fmt_f64(odd_nan), "0x7FF0000000000001");
        assert!(parse_f64("infinity").is_err() && parse_f64("1x").is_err());
    }

    #[test]
    fn dense_nesting() {
        let t = TensorData::from_vec(vec![2, 3], vec![1i32, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(fmt_dense(&t), "[[1, 2, 3], [4, 5, 6]]");
        let e = TensorData::from_vec::<f32>(vec![2, 0], vec![]).unwrap();
        assert_eq!(fmt_dense(&e), "[[], []]");
        let z = TensorData::from_vec::<f32>(vec![0, 2], vec![]).unwrap();
        assert_eq!(fmt_dense(&z), "[]");
        let s = TensorData::scalar(true);
        assert_eq!(fmt_dense(&s), "true");
        let one = TensorData::from_vec(vec![1, 1, 2], vec![1u8, 2]).unwrap();
        assert_eq!(fmt_dense(&one), "[[[1, 2]]]");
        assert_eq!(
            parse_int::<u8>("256", "u8").unwrap_err(),
            "integer 256 is out of range for u8"
        );
    }
}
