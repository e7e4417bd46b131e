//! Attributes as text: what an op line wrote between braces ([`Attrs`]), and how each typed
//! attribute prints and reads back ([`AttrValue`]). Ops derive their attribute text from their
//! typed fields (`op_struct!` in `ops::def`), so this file knows no op.

use super::ParseError;
use super::literal::{fmt_f64, parse_f64, parse_int};
use crate::ops::{Op, OpText, SliceRange};
use crate::{DType, Float};

/// An attribute value as written, before the op says what type it must have.
#[derive(Clone, Debug)]
pub enum AttrVal {
    /// A number token's text.
    Num(String),
    /// A bare word (`true`, `add`, `nan`).
    Word(String),
    /// A flat list.
    List(Vec<Spanned>),
    /// A slice range `start:end:step`, each part optional.
    Range([Option<String>; 3]),
    /// A quoted string.
    Str(String),
}

/// A value and where it was written.
#[derive(Clone, Debug)]
pub struct Spanned {
    /// The value.
    pub val: AttrVal,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
}

/// The op and attribute a value is read for, to word errors.
pub struct AttrCx<'a> {
    /// The op's mnemonic.
    pub op: &'a str,
    /// The attribute's name.
    pub key: &'a str,
}

impl AttrCx<'_> {
    /// `attribute 'key' of 'op': msg`, at `s`.
    pub fn err(&self, s: &Spanned, msg: impl std::fmt::Display) -> ParseError {
        self.raw(s, format!("attribute '{}' of '{}': {msg}", self.key, self.op))
    }

    /// `msg` as is, at `s`.
    pub fn raw(&self, s: &Spanned, msg: String) -> ParseError {
        ParseError {
            line: s.line,
            col: s.col,
            msg,
        }
    }

    /// The text of a single value.
    pub fn scalar<'s>(&self, s: &'s Spanned) -> Result<&'s str, ParseError> {
        match &s.val {
            AttrVal::Num(t) | AttrVal::Word(t) => Ok(t),
            _ => Err(self.err(s, "expected a single value")),
        }
    }

    /// The items of a list.
    pub fn list<'s>(&self, s: &'s Spanned) -> Result<&'s [Spanned], ParseError> {
        match &s.val {
            AttrVal::List(items) => Ok(items),
            _ => Err(self.raw(
                s,
                format!("attribute '{}' of '{}' must be a list [...]", self.key, self.op),
            )),
        }
    }
}

/// A typed attribute's text form: how it prints, and how it reads back (bit-exact for
/// floats, range-checked for integers).
pub trait AttrValue: Sized {
    /// The written form; `None` leaves the attribute out (an absent option).
    fn print(&self) -> Option<String>;
    /// Read a written value.
    fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError>;
    /// The value of an attribute that is not written; `None` when it is required.
    fn absent() -> Option<Self> {
        None
    }
}

macro_rules! int_attr {
    ($($t:ty => $what:literal),*) => {$(
        impl AttrValue for $t {
            fn print(&self) -> Option<String> {
                Some(self.to_string())
            }
            fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError> {
                parse_int(cx.scalar(s)?, $what).map_err(|m| cx.err(s, m))
            }
        }
    )*};
}
int_attr!(usize => "usize", u64 => "u64", i64 => "i64");

impl AttrValue for bool {
    fn print(&self) -> Option<String> {
        Some(self.to_string())
    }
    fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError> {
        match cx.scalar(s)? {
            "true" => Ok(true),
            "false" => Ok(false),
            t => Err(cx.err(s, format!("expected true or false, found '{t}'"))),
        }
    }
}

impl AttrValue for String {
    fn print(&self) -> Option<String> {
        Some(super::print::quote(self))
    }
    fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError> {
        match &s.val {
            AttrVal::Str(t) => Ok(t.clone()),
            _ => Err(cx.err(s, "expected a quoted string")),
        }
    }
}

impl AttrValue for Float {
    fn print(&self) -> Option<String> {
        Some(fmt_f64(self.0))
    }
    fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError> {
        parse_f64(cx.scalar(s)?).map(Float).map_err(|m| cx.err(s, m))
    }
}

impl AttrValue for DType {
    fn print(&self) -> Option<String> {
        Some(self.to_string())
    }
    fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError> {
        cx.scalar(s)?.parse::<DType>().map_err(|e| cx.err(s, e))
    }
}

impl<T: AttrValue> AttrValue for Option<T> {
    fn print(&self) -> Option<String> {
        self.as_ref().and_then(T::print)
    }
    fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError> {
        T::read(s, cx).map(Some)
    }
    fn absent() -> Option<Self> {
        Some(None)
    }
}

impl<T: AttrValue> AttrValue for Vec<T> {
    fn print(&self) -> Option<String> {
        let items: Vec<String> = self.iter().map(|v| v.print().unwrap_or_default()).collect();
        Some(format!("[{}]", items.join(", ")))
    }
    fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError> {
        cx.list(s)?.iter().map(|it| T::read(it, cx)).collect()
    }
}

impl<T: AttrValue, const N: usize> AttrValue for [T; N] {
    fn print(&self) -> Option<String> {
        let items: Vec<String> = self.iter().map(|v| v.print().unwrap_or_default()).collect();
        Some(format!("[{}]", items.join(", ")))
    }
    fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError> {
        let v: Vec<T> = Vec::read(s, cx)?;
        let n = v.len();
        v.try_into().map_err(|_| {
            cx.raw(
                s,
                format!("attribute '{}' of '{}' needs {N} entries, got {n}", cx.key, cx.op),
            )
        })
    }
}

impl AttrValue for SliceRange {
    fn print(&self) -> Option<String> {
        let start = if self.start == 0 {
            String::new()
        } else {
            self.start.to_string()
        };
        let end = if self.end == i64::MAX {
            String::new()
        } else {
            self.end.to_string()
        };
        let step = if self.step == 1 {
            String::new()
        } else {
            format!(":{}", self.step)
        };
        Some(format!("{start}:{end}{step}"))
    }
    fn read(s: &Spanned, cx: &AttrCx) -> Result<Self, ParseError> {
        let AttrVal::Range([a, b, c]) = &s.val else {
            return Err(cx.raw(s, "expected a slice range such as 0:4, 2: or ::2".into()));
        };
        let part = |t: &Option<String>, default: i64| -> Result<i64, ParseError> {
            t.as_deref().map_or(Ok(default), |t| {
                parse_int(t, "i64").map_err(|m| cx.raw(s, format!("slice range: {m}")))
            })
        };
        Ok(SliceRange {
            start: part(a, 0)?,
            end: part(b, i64::MAX)?,
            step: part(c, 1)?,
        })
    }
}

/// [`AttrValue`] for an enum written as one word from a fixed set (`reduction = mean`).
macro_rules! word_attr {
    ($t:ty) => {
        impl $crate::text::AttrValue for $t {
            fn print(&self) -> Option<String> {
                Some(self.name().to_string())
            }
            fn read(s: &$crate::text::Spanned, cx: &$crate::text::AttrCx) -> Result<Self, $crate::text::ParseError> {
                let t = cx.scalar(s)?;
                <$t>::from_name(t).ok_or_else(|| {
                    let choices: Vec<&str> = <$t>::ALL.iter().map(|v| v.name()).collect();
                    cx.err(s, format!("expected one of {}, found '{t}'", choices.join(", ")))
                })
            }
        }
    };
}
pub(crate) use word_attr;

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `unknown op 'matmull' (did you mean 'matmul'?)`.
pub fn unknown_op(name: &str) -> String {
    let best = Op::mnemonics()
        .iter()
        .filter(|_| name.len() <= 64)
        .map(|m| (edit_distance(name, m), *m))
        .min();
    match best {
        Some((d, m)) if d <= 2 => format!("unknown op '{name}' (did you mean '{m}'?)"),
        _ => format!("unknown op '{name}'"),
    }
}

/// One written attribute: its name, where the name is (line, column), and its value.
pub(crate) type AttrItem = (String, (usize, usize), Spanned);

/// The attributes written on one op line, consumed by typed reads ([`Attrs::get`]).
pub struct Attrs {
    op: String,
    line: usize,
    col: usize,
    /// Name, where the name was written, value.
    items: Vec<AttrItem>,
}

impl Attrs {
    /// Attributes `items` of op `op` written at `line:col`.
    pub(crate) fn new(op: &str, line: usize, col: usize, items: Vec<AttrItem>) -> Attrs {
        Attrs {
            op: op.to_string(),
            line,
            col,
            items,
        }
    }

    /// An error at the op name.
    pub fn here(&self, msg: String) -> ParseError {
        ParseError {
            line: self.line,
            col: self.col,
            msg,
        }
    }

    /// Take attribute `key`, read as a `T`; a missing attribute is an error unless `T` has a
    /// value for "not written" (options).
    pub fn get<T: AttrValue>(&mut self, key: &str) -> Result<T, ParseError> {
        match self.items.iter().position(|(k, _, _)| k == key) {
            Some(i) => {
                let s = self.items.remove(i).2;
                T::read(&s, &AttrCx { op: &self.op, key })
            }
            None => T::absent().ok_or_else(|| self.here(format!("op '{}' needs attribute '{key}'", self.op))),
        }
    }

    /// Fail on any attribute no read asked for.
    pub(crate) fn finish(self) -> Result<(), ParseError> {
        match self.items.first() {
            None => Ok(()),
            Some((k, (line, col), _)) => Err(ParseError {
                line: *line,
                col: *col,
                msg: format!("unknown attribute '{k}' for op '{}'", self.op),
            }),
        }
    }
}

/// The one result type of ops whose attributes it states (reshape, cast, iota, ...).
pub fn single_result<'a>(
    a: &Attrs,
    op: &str,
    types: &'a [crate::TensorType],
) -> Result<&'a crate::TensorType, ParseError> {
    match types {
        [t] => Ok(t),
        _ => Err(a.here(format!(
            "op '{op}' has one result, but {} types are declared",
            types.len()
        ))),
    }
}
