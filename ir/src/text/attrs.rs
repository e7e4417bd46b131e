//! Op ↔ text: each op's mnemonic and attribute dictionary, printed in a fixed order and parsed
//! back with typed, range-checked accessors. Shapes and dtypes that the result type already
//! states (reshape, broadcast, cast, iota, random) are not repeated as attributes.

use super::ParseError;
use super::literal::{fmt_f64, parse_f64, parse_int};
use crate::ops::{ArgReduceOp, BinaryOp, RandomDist, ReduceOp, Reduction, ScatterReduce, SliceRange, UnaryOp};
use crate::{Composite, Float, Op, TensorType};

/// An attribute value as written, before the op says what type it must have.
#[derive(Clone, Debug)]
pub(crate) enum AttrVal {
    /// A number token's text.
    Num(String),
    /// A bare word (`true`, `add`, `nan`).
    Word(String),
    /// A flat list.
    List(Vec<Spanned>),
    /// A slice range `start:end:step`, each part optional.
    Range([Option<String>; 3]),
}

/// A value and where it was written.
#[derive(Clone, Debug)]
pub(crate) struct Spanned {
    pub val: AttrVal,
    pub line: usize,
    pub col: usize,
}

fn usizes(v: &[usize]) -> String {
    let items: Vec<_> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

fn range(r: &SliceRange) -> String {
    let start = if r.start == 0 {
        String::new()
    } else {
        r.start.to_string()
    };
    let end = if r.end == i64::MAX {
        String::new()
    } else {
        r.end.to_string()
    };
    let step = if r.step == 1 {
        String::new()
    } else {
        format!(":{}", r.step)
    };
    format!("{start}:{end}{step}")
}

fn reduction_from_name(s: &str) -> Option<Reduction> {
    [Reduction::Mean, Reduction::Sum, Reduction::None]
        .into_iter()
        .find(|r| r.name() == s)
}

/// The attributes of `op`, in print order, formatted.
pub(crate) fn op_attrs(op: &Op) -> Vec<(&'static str, String)> {
    use Composite as C;
    let f = |x: &Float| fmt_f64(x.0);
    match op {
        Op::Reduce { axes, keepdim, .. } => vec![("axes", usizes(axes)), ("keepdim", keepdim.to_string())],
        Op::ArgReduce { axis, keepdim, .. } => vec![("axis", axis.to_string()), ("keepdim", keepdim.to_string())],
        Op::Permute { perm } => vec![("perm", usizes(perm))],
        Op::Slice { ranges } => {
            let items: Vec<_> = ranges.iter().map(range).collect();
            vec![("ranges", format!("[{}]", items.join(", ")))]
        }
        Op::Pad { before, after, value } => vec![
            ("before", usizes(before)),
            ("after", usizes(after)),
            ("value", f(value)),
        ],
        Op::Concat { axis } | Op::Gather { axis } => vec![("axis", axis.to_string())],
        Op::Scatter { axis, reduce } => vec![("axis", axis.to_string()), ("reduce", reduce.name().into())],
        Op::Iota { axis, .. } => vec![("axis", axis.to_string())],
        Op::Random { dist, seed, .. } => {
            let mut v = match dist {
                RandomDist::Uniform { low, high } => {
                    vec![("dist", "uniform".into()), ("low", f(low)), ("high", f(high))]
                }
                RandomDist::Normal { mean, std } => vec![("dist", "normal".into()), ("mean", f(mean)), ("std", f(std))],
            };
            v.push(("seed", seed.to_string()));
            v
        }
        Op::Conv {
            stride,
            pad_before,
            pad_after,
            dilation,
            groups,
        } => vec![
            ("stride", usizes(stride)),
            ("pad_before", usizes(pad_before)),
            ("pad_after", usizes(pad_after)),
            ("dilation", usizes(dilation)),
            ("groups", groups.to_string()),
        ],
        Op::Composite(c) => match c {
            C::Conv2d {
                stride,
                padding,
                dilation,
                groups,
            } => vec![
                ("stride", usizes(stride)),
                ("padding", usizes(padding)),
                ("dilation", usizes(dilation)),
                ("groups", groups.to_string()),
            ],
            C::MaxPool2d {
                kernel,
                stride,
                padding,
                ceil_mode,
            } => vec![
                ("kernel", usizes(kernel)),
                ("stride", usizes(stride)),
                ("padding", usizes(padding)),
                ("ceil_mode", ceil_mode.to_string()),
            ],
            C::AvgPool2d {
                kernel,
                stride,
                padding,
                ceil_mode,
                count_include_pad,
            } => vec![
                ("kernel", usizes(kernel)),
                ("stride", usizes(stride)),
                ("padding", usizes(padding)),
                ("ceil_mode", ceil_mode.to_string()),
                ("count_include_pad", count_include_pad.to_string()),
            ],
            C::AdaptiveAvgPool2d { output_size } | C::AdaptiveMaxPool2d { output_size } => {
                vec![("output_size", usizes(output_size))]
            }
            C::BatchNorm {
                epsilon,
                momentum,
                training,
            } => vec![
                ("epsilon", f(epsilon)),
                ("momentum", f(momentum)),
                ("training", training.to_string()),
            ],
            C::LayerNorm {
                normalized_ndim,
                epsilon,
            } => vec![
                ("normalized_ndim", normalized_ndim.to_string()),
                ("epsilon", f(epsilon)),
            ],
            C::Softmax { axis } | C::LogSoftmax { axis } => vec![("axis", axis.to_string())],
            C::CrossEntropy { reduction } => vec![("reduction", reduction.name().into())],
            C::Gelu { approximate } => vec![("approximate", approximate.to_string())],
            C::Dropout { p, training, seed } => {
                vec![
                    ("p", f(p)),
                    ("training", training.to_string()),
                    ("seed", seed.to_string()),
                ]
            }
            C::ScaledDotProductAttention { causal, scale } => {
                let mut v = vec![("causal", causal.to_string())];
                if let Some(s) = scale {
                    v.push(("scale", f(s)));
                }
                v
            }
            C::Linear | C::Relu | C::Silu | C::Sigmoid | C::Embedding => vec![],
        },
        _ => vec![],
    }
}

/// Every mnemonic an op line may use (for "did you mean" hints).
fn all_mnemonics() -> Vec<&'static str> {
    let mut v = vec![
        "where",
        "reshape",
        "permute",
        "broadcast",
        "slice",
        "pad",
        "concat",
        "gather",
        "scatter",
        "cast",
        "iota",
        "random",
        "matmul",
        "conv",
        "cond",
        "while",
        "input",
        "param",
        "constant",
    ];
    v.extend(crate::Composite::NAMES);
    v.extend(UnaryOp::ALL.iter().map(|u| u.name()));
    v.extend(BinaryOp::ALL.iter().map(|b| b.name()));
    v.extend(ReduceOp::ALL.iter().map(|r| r.name()));
    v.extend(ArgReduceOp::ALL.iter().map(|r| r.name()));
    v
}

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
pub(crate) fn unknown_op(name: &str) -> String {
    let best = all_mnemonics()
        .into_iter()
        .filter(|_| name.len() <= 64)
        .map(|m| (edit_distance(name, m), m))
        .min();
    match best {
        Some((d, m)) if d <= 2 => format!("unknown op '{name}' (did you mean '{m}'?)"),
        _ => format!("unknown op '{name}'"),
    }
}

/// One written attribute: its name, where the name is (line, column), and its value.
pub(crate) type AttrItem = (String, (usize, usize), Spanned);

/// The attributes written on one op line, consumed by typed accessors.
pub(crate) struct Attrs {
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

    fn err_at(s: &Spanned, msg: String) -> ParseError {
        ParseError {
            line: s.line,
            col: s.col,
            msg,
        }
    }

    /// An error at the op name.
    pub(crate) fn here(&self, msg: String) -> ParseError {
        ParseError {
            line: self.line,
            col: self.col,
            msg,
        }
    }

    fn take(&mut self, key: &str) -> Option<Spanned> {
        let i = self.items.iter().position(|(k, _, _)| k == key)?;
        Some(self.items.remove(i).2)
    }

    fn req(&mut self, key: &str) -> Result<Spanned, ParseError> {
        self.take(key).ok_or_else(|| ParseError {
            line: self.line,
            col: self.col,
            msg: format!("op '{}' needs attribute '{key}'", self.op),
        })
    }

    fn scalar<T>(&self, key: &str, s: &Spanned, conv: impl Fn(&str) -> Result<T, String>) -> Result<T, ParseError> {
        match &s.val {
            AttrVal::Num(t) | AttrVal::Word(t) => conv(t),
            _ => Err("expected a single value".to_string()),
        }
        .map_err(|m| Self::err_at(s, format!("attribute '{key}' of '{}': {m}", self.op)))
    }

    fn list<T>(&self, key: &str, s: &Spanned, conv: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, ParseError> {
        let AttrVal::List(items) = &s.val else {
            return Err(Self::err_at(
                s,
                format!("attribute '{key}' of '{}' must be a list [...]", self.op),
            ));
        };
        items.iter().map(|it| self.scalar(key, it, &conv)).collect()
    }

    /// A non-negative integer.
    pub(crate) fn usize(&mut self, key: &str) -> Result<usize, ParseError> {
        let s = self.req(key)?;
        self.scalar(key, &s, |t| parse_int(t, "usize"))
    }

    /// A u64 (seeds).
    pub(crate) fn u64(&mut self, key: &str) -> Result<u64, ParseError> {
        let s = self.req(key)?;
        self.scalar(key, &s, |t| parse_int(t, "u64"))
    }

    /// A list of non-negative integers.
    pub(crate) fn usizes(&mut self, key: &str) -> Result<Vec<usize>, ParseError> {
        let s = self.req(key)?;
        self.list(key, &s, |t| parse_int(t, "usize"))
    }

    /// A list of exactly `N` non-negative integers.
    pub(crate) fn array<const N: usize>(&mut self, key: &str) -> Result<[usize; N], ParseError> {
        let s = self.req(key)?;
        let v = self.list(key, &s, |t| parse_int(t, "usize"))?;
        let n = v.len();
        v.try_into().map_err(|_| {
            Self::err_at(
                &s,
                format!("attribute '{key}' of '{}' needs {N} entries, got {n}", self.op),
            )
        })
    }

    /// `true` or `false`.
    pub(crate) fn bool(&mut self, key: &str) -> Result<bool, ParseError> {
        let s = self.req(key)?;
        self.scalar(key, &s, |t| match t {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(format!("expected true or false, found '{t}'")),
        })
    }

    /// A float, bit-exact.
    pub(crate) fn float(&mut self, key: &str) -> Result<Float, ParseError> {
        let s = self.req(key)?;
        self.scalar(key, &s, |t| parse_f64(t).map(Float))
    }

    /// An optional float.
    pub(crate) fn opt_float(&mut self, key: &str) -> Result<Option<Float>, ParseError> {
        match self.take(key) {
            None => Ok(None),
            Some(s) => self.scalar(key, &s, |t| parse_f64(t).map(Float)).map(Some),
        }
    }

    /// A word from a fixed set, converted by `from`.
    pub(crate) fn word<T>(
        &mut self,
        key: &str,
        from: impl Fn(&str) -> Option<T>,
        choices: &str,
    ) -> Result<T, ParseError> {
        let s = self.req(key)?;
        self.scalar(key, &s, |t| {
            from(t).ok_or_else(|| format!("expected one of {choices}, found '{t}'"))
        })
    }

    /// Slice ranges `[start:end:step, ...]`.
    pub(crate) fn ranges(&mut self, key: &str) -> Result<Vec<SliceRange>, ParseError> {
        let s = self.req(key)?;
        let AttrVal::List(items) = &s.val else {
            return Err(Self::err_at(
                &s,
                format!("attribute '{key}' of '{}' must be a list [...]", self.op),
            ));
        };
        let part = |it: &Spanned, t: &Option<String>, default: i64| -> Result<i64, ParseError> {
            t.as_deref().map_or(Ok(default), |t| {
                parse_int(t, "i64").map_err(|m| Self::err_at(it, format!("slice range: {m}")))
            })
        };
        items
            .iter()
            .map(|it| match &it.val {
                AttrVal::Range([a, b, c]) => Ok(SliceRange {
                    start: part(it, a, 0)?,
                    end: part(it, b, i64::MAX)?,
                    step: part(it, c, 1)?,
                }),
                _ => Err(Self::err_at(it, "expected a slice range such as 0:4, 2: or ::2".into())),
            })
            .collect()
    }

    /// Fail on any attribute no accessor asked for.
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

/// The one result type of ops whose attributes it states.
fn single<'a>(op: &str, types: &'a [TensorType]) -> Result<&'a TensorType, String> {
    match types {
        [t] => Ok(t),
        _ => Err(format!(
            "op '{op}' has one result, but {} types are declared",
            types.len()
        )),
    }
}

/// Build the op named `name` from its attributes and declared result types.
pub(crate) fn build_op(name: &str, a: &mut Attrs, types: &[TensorType]) -> Result<Op, ParseError> {
    let op = match name {
        _ if UnaryOp::from_name(name).is_some() => Op::Unary(UnaryOp::from_name(name).expect("checked")),
        _ if BinaryOp::from_name(name).is_some() => Op::Binary(BinaryOp::from_name(name).expect("checked")),
        _ if ReduceOp::from_name(name).is_some() => Op::Reduce {
            op: ReduceOp::from_name(name).expect("checked"),
            axes: a.usizes("axes")?,
            keepdim: a.bool("keepdim")?,
        },
        _ if ArgReduceOp::from_name(name).is_some() => Op::ArgReduce {
            op: ArgReduceOp::from_name(name).expect("checked"),
            axis: a.usize("axis")?,
            keepdim: a.bool("keepdim")?,
        },
        "where" => Op::Where,
        "reshape" => Op::Reshape {
            shape: single(name, types).map_err(|m| a.here(m))?.shape.0.clone(),
        },
        "permute" => Op::Permute {
            perm: a.usizes("perm")?,
        },
        "broadcast" => Op::Broadcast {
            shape: single(name, types).map_err(|m| a.here(m))?.shape.0.clone(),
        },
        "slice" => Op::Slice {
            ranges: a.ranges("ranges")?,
        },
        "pad" => Op::Pad {
            before: a.usizes("before")?,
            after: a.usizes("after")?,
            value: a.float("value")?,
        },
        "concat" => Op::Concat { axis: a.usize("axis")? },
        "gather" => Op::Gather { axis: a.usize("axis")? },
        "scatter" => Op::Scatter {
            axis: a.usize("axis")?,
            reduce: a.word("reduce", ScatterReduce::from_name, "replace, add")?,
        },
        "cast" => Op::Cast {
            to: single(name, types).map_err(|m| a.here(m))?.dtype,
        },
        "iota" => {
            let t = single(name, types).map_err(|m| a.here(m))?;
            Op::Iota {
                shape: t.shape.0.clone(),
                axis: a.usize("axis")?,
                dtype: t.dtype,
            }
        }
        "random" => {
            let t = single(name, types).map_err(|m| a.here(m))?;
            let kind = a.word(
                "dist",
                |w| ["uniform", "normal"].contains(&w).then_some(w == "uniform"),
                "uniform, normal",
            );
            let dist = if kind? {
                RandomDist::Uniform {
                    low: a.float("low")?,
                    high: a.float("high")?,
                }
            } else {
                RandomDist::Normal {
                    mean: a.float("mean")?,
                    std: a.float("std")?,
                }
            };
            Op::Random {
                dist,
                shape: t.shape.0.clone(),
                dtype: t.dtype,
                seed: a.u64("seed")?,
            }
        }
        "matmul" => Op::MatMul,
        "conv" => Op::Conv {
            stride: a.usizes("stride")?,
            pad_before: a.usizes("pad_before")?,
            pad_after: a.usizes("pad_after")?,
            dilation: a.usizes("dilation")?,
            groups: a.usize("groups")?,
        },
        "cond" => Op::Cond,
        "while" => Op::While,
        _ => Op::Composite(build_composite(name, a)?),
    };
    Ok(op)
}

fn build_composite(name: &str, a: &mut Attrs) -> Result<Composite, ParseError> {
    use Composite as C;
    Ok(match name {
        "linear" => C::Linear,
        "conv2d" => C::Conv2d {
            stride: a.array("stride")?,
            padding: a.array("padding")?,
            dilation: a.array("dilation")?,
            groups: a.usize("groups")?,
        },
        "max_pool2d" => C::MaxPool2d {
            kernel: a.array("kernel")?,
            stride: a.array("stride")?,
            padding: a.array("padding")?,
            ceil_mode: a.bool("ceil_mode")?,
        },
        "avg_pool2d" => C::AvgPool2d {
            kernel: a.array("kernel")?,
            stride: a.array("stride")?,
            padding: a.array("padding")?,
            ceil_mode: a.bool("ceil_mode")?,
            count_include_pad: a.bool("count_include_pad")?,
        },
        "adaptive_avg_pool2d" => C::AdaptiveAvgPool2d {
            output_size: a.array("output_size")?,
        },
        "adaptive_max_pool2d" => C::AdaptiveMaxPool2d {
            output_size: a.array("output_size")?,
        },
        "batch_norm" => C::BatchNorm {
            epsilon: a.float("epsilon")?,
            momentum: a.float("momentum")?,
            training: a.bool("training")?,
        },
        "layer_norm" => C::LayerNorm {
            normalized_ndim: a.usize("normalized_ndim")?,
            epsilon: a.float("epsilon")?,
        },
        "softmax" => C::Softmax { axis: a.usize("axis")? },
        "log_softmax" => C::LogSoftmax { axis: a.usize("axis")? },
        "cross_entropy" => C::CrossEntropy {
            reduction: a.word("reduction", reduction_from_name, "mean, sum, none")?,
        },
        "relu" => C::Relu,
        "gelu" => C::Gelu {
            approximate: a.bool("approximate")?,
        },
        "silu" => C::Silu,
        "sigmoid" => C::Sigmoid,
        "dropout" => C::Dropout {
            p: a.float("p")?,
            training: a.bool("training")?,
            seed: a.u64("seed")?,
        },
        "embedding" => C::Embedding,
        "sdpa" => C::ScaledDotProductAttention {
            causal: a.bool("causal")?,
            scale: a.opt_float("scale")?,
        },
        _ => return Err(a.here(unknown_op(name))),
    })
}
