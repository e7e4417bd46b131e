//! Recurrent layers: `LSTM` and `GRU` (stacked, optionally bidirectional) and their one-step
//! cells, with Paddle 2 / PyTorch parameter names (`weight_ih_l0`, …) and gate orders.
//!
//! Sequences are batch-first `[N, T, C]` (Paddle's default `time_major = false`). An LSTM
//! or GRU layer's recurrence is one `lstm_seq` / `gru_seq` op (the cpu backend and eager
//! autograd run it natively; other backends its decomposition, the unrolled steps). The cells
//! (`LSTMCell`, `GRUCell`) run a product and a fused `lstm_cell` / `gru_cell` per call.

use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::nn::functional as F;
use crate::tensor::{Tensor, concat, stack};
use oar_ir::ops::{GruSeq, LstmSeq};
use oar_ir::{Composite, DType, Op};

/// Which way a recurrent layer reads its sequence (Paddle's `direction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Direction {
    /// Left to right only (`"forward"`).
    #[default]
    Forward,
    /// Both ways, outputs concatenated on the feature axis (`"bidirect"`).
    Bidirect,
}

impl Direction {
    fn count(self) -> usize {
        match self {
            Direction::Forward => 1,
            Direction::Bidirect => 2,
        }
    }
}

/// The recurrence a cell computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Lstm,
    Gru,
}

impl Kind {
    fn gates(self) -> usize {
        match self {
            Kind::Lstm => 4,
            Kind::Gru => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Lstm => "LSTM",
            Kind::Gru => "GRU",
        }
    }
}

/// The weights of one cell (one direction of one layer), PyTorch layout `[G·H, in]`.
struct CellParams {
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor,
    bias_hh: Tensor,
}

impl CellParams {
    /// Uniform(−1/√H, 1/√H) for every weight and bias, as Paddle and PyTorch initialize them.
    fn new(kind: Kind, input: usize, hidden: usize, dtype: DType) -> Result<CellParams> {
        let k = 1.0 / (hidden as f64).sqrt();
        let g = kind.gates() * hidden;
        let u = |shape: &[usize]| Tensor::parameter(crate::tensor::uniform(shape, -k, k, dtype)?.data());
        Ok(CellParams {
            weight_ih: u(&[g, input])?,
            weight_hh: u(&[g, hidden])?,
            bias_ih: u(&[g])?,
            bias_hh: u(&[g])?,
        })
    }

    /// The parameters' dtype: what they hold now, so `Layer::to_dtype` (which replaces their
    /// storage in place) changes what the layer computes in.
    fn dtype(&self) -> DType {
        self.weight_ih.dtype()
    }

    fn named(&self, suffix: &str) -> Vec<(String, Tensor)> {
        vec![
            (format!("weight_ih{suffix}"), self.weight_ih.clone()),
            (format!("weight_hh{suffix}"), self.weight_hh.clone()),
            (format!("bias_ih{suffix}"), self.bias_ih.clone()),
            (format!("bias_hh{suffix}"), self.bias_hh.clone()),
        ]
    }

    /// `x Wᵢₕᵀ + bᵢₕ` for any leading shape (a whole sequence at once).
    fn input_part(&self, x: &Tensor) -> Result<Tensor> {
        F::linear(x, &self.weight_ih.t()?, Some(&self.bias_ih))
    }
}

/// One recurrence step from the precomputed input part `xg [N, G·H]`; `w_hh_t` is `Wₕₕᵀ`.
/// Returns the new `h` and, for an LSTM, the new `c`.
fn step(
    kind: Kind,
    p: &CellParams,
    w_hh_t: &Tensor,
    xg: &Tensor,
    h: &Tensor,
    c: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>)> {
    let hg = F::linear(h, w_hh_t, Some(&p.bias_hh))?;
    // The gates run as one fused op (`lstm_cell` / `gru_cell`; gate order i, f, g, o and
    // r, z, n as PyTorch and Paddle), their gradient as one compiled program.
    let cell = |c: Composite, state: &Tensor| crate::tensor::apply_op(Op::Composite(c), &[xg, &hg, state]);
    match (kind, c) {
        (Kind::Lstm, Some(c)) => {
            let mut hc = cell(Composite::LstmCell, c)?.into_iter();
            let (Some(h2), Some(c2)) = (hc.next(), hc.next()) else {
                return Err(Error::invalid("lstm_cell", "internal: expected h and c"));
            };
            Ok((h2, Some(c2)))
        }
        (Kind::Gru, None) => {
            let h2 = cell(Composite::GruCell, h)?.into_iter().next();
            Ok((
                h2.ok_or_else(|| Error::invalid("gru_cell", "internal: expected h"))?,
                None,
            ))
        }
        _ => Err(Error::invalid(
            kind.name(),
            "internal: cell state does not match the cell kind",
        )),
    }
}

fn dims(t: &Tensor) -> String {
    format!("{}", t.tensor_type())
}

/// Check an initial state tensor is `dtype[shape]`.
fn check_state(layer: &str, what: &str, t: &Tensor, shape: &[usize], dtype: DType) -> Result<()> {
    if t.shape() != shape || t.dtype() != dtype {
        return Err(Error::invalid(
            layer,
            format!("initial {what} must be {dtype}{shape:?}, got {}", dims(t)),
        ));
    }
    Ok(())
}

/// The shared machinery of `LSTM` and `GRU`: configuration plus cells in layer-major,
/// direction-minor order (the order of Paddle's `h0` rows). The dtype is the parameters'.
struct Stack {
    kind: Kind,
    input_size: usize,
    hidden_size: usize,
    num_layers: usize,
    direction: Direction,
    dropout: f64,
    time_major: bool,
    training: bool,
    cells: Vec<CellParams>,
}

impl Stack {
    fn new(kind: Kind, input_size: usize, hidden_size: usize) -> Result<Stack> {
        let mut s = Stack {
            kind,
            input_size,
            hidden_size,
            num_layers: 1,
            direction: Direction::Forward,
            dropout: 0.0,
            time_major: false,
            training: true,
            cells: Vec::new(),
        };
        s.build(DType::F32)?;
        Ok(s)
    }

    /// The parameters' dtype (f32 before the first build).
    fn dtype(&self) -> DType {
        self.cells.first().map_or(DType::F32, CellParams::dtype)
    }

    /// (Re)create every parameter for the current configuration, in `dtype`.
    fn build(&mut self, dtype: DType) -> Result<()> {
        let name = self.kind.name();
        if self.input_size == 0 || self.hidden_size == 0 || self.num_layers == 0 {
            return Err(Error::invalid(
                name,
                format!(
                    "input_size ({}), hidden_size ({}) and num_layers ({}) must be positive",
                    self.input_size, self.hidden_size, self.num_layers
                ),
            ));
        }
        if !dtype.is_float() {
            return Err(Error::invalid(name, format!("parameters must be float, not {dtype}")));
        }
        let d = self.direction.count();
        let mut cells = Vec::with_capacity(self.num_layers * d);
        for l in 0..self.num_layers {
            let input = if l == 0 { self.input_size } else { d * self.hidden_size };
            for _ in 0..d {
                cells.push(CellParams::new(self.kind, input, self.hidden_size, dtype)?);
            }
        }
        self.cells = cells;
        Ok(())
    }

    fn named(&self) -> Vec<(String, Tensor)> {
        let d = self.direction.count();
        self.cells
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                let rev = if i % d == 1 { "_reverse" } else { "" };
                c.named(&format!("_l{}{rev}", i / d))
            })
            .collect()
    }

    /// Run the whole stack. `h0`/`c0` are `[L·D, N, H]`; returns the output `[N, T, D·H]` and the
    /// final `h` (and `c` for an LSTM), each `[L·D, N, H]`.
    fn run(&self, x: &Tensor, h0: Option<&Tensor>, c0: Option<&Tensor>) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let name = self.kind.name();
        let shape = x.shape();
        let x = if shape.len() == 3 && self.time_major {
            x.transpose(&[1, 0, 2])?
        } else {
            x.clone()
        };
        let shape = x.shape();
        let layout = if self.time_major { "[T, N, C]" } else { "[N, T, C]" };
        let dtype = self.dtype();
        if shape.len() != 3 || shape[2] != self.input_size || x.dtype() != dtype {
            return Err(Error::invalid(
                name,
                format!(
                    "input must be {layout} with C = input_size {} and dtype {dtype}, got {}",
                    self.input_size,
                    dims(&x)
                ),
            ));
        }
        let (n, t) = (shape[0], shape[1]);
        if x.dims()[1].is_symbolic() {
            return Err(Error::invalid(
                name,
                format!(
                    "the sequence length of {} must be static (the steps are unrolled)",
                    dims(&x)
                ),
            ));
        }
        if n == 0 || t == 0 {
            return Err(Error::invalid(
                name,
                format!("input {} has an empty batch or sequence", dims(&x)),
            ));
        }
        let (d, hs) = (self.direction.count(), self.hidden_size);
        let state_shape = [self.num_layers * d, n, hs];
        if let Some(h0) = h0 {
            check_state(name, "h", h0, &state_shape, dtype)?;
        }
        if let Some(c0) = c0 {
            check_state(name, "c", c0, &state_shape, dtype)?;
        }
        let zeros = crate::tensor::zeros_dims(&[x.dims()[0].clone(), oar_ir::Dim::Static(hs)], dtype)?;
        let (mut h_last, mut c_last) = (Vec::new(), Vec::new());
        let mut layer_in = x;
        for l in 0..self.num_layers {
            let mut dir_outs = Vec::with_capacity(d);
            for dir in 0..d {
                let idx = l * d + dir;
                let p = &self.cells[idx];
                let h = h0.map_or(Ok(zeros.clone()), |h0| h0.get(idx as i64))?;
                let c = match self.kind {
                    Kind::Lstm => Some(c0.map_or(Ok(zeros.clone()), |c0| c0.get(idx as i64))?),
                    Kind::Gru => None,
                };
                let (y, h, c) = match (self.kind, &c) {
                    (Kind::Lstm, Some(c0)) => {
                        // An LSTM runs its whole recurrence as one op (`lstm_seq`: one native
                        // kernel forward and one backward on the CPU), both biases in `xg`.
                        let bias = crate::tensor::add(&p.bias_ih, &p.bias_hh)?;
                        let xg_all = F::linear(&layer_in, &p.weight_ih.t()?, Some(&bias))?;
                        let seq = Op::Composite(Composite::LstmSeq(LstmSeq { reverse: dir == 1 }));
                        let mut res = crate::tensor::apply_op(seq, &[&xg_all, &p.weight_hh, &h, c0])?.into_iter();
                        let (Some(y), Some(h), Some(c)) = (res.next(), res.next(), res.next()) else {
                            return Err(Error::invalid("lstm_seq", "internal: expected y, h and c"));
                        };
                        (y, h, Some(c))
                    }
                    (Kind::Gru, None) => {
                        // A GRU likewise (`gru_seq`); `b_hh` stays apart (its `n` part is
                        // scaled by `r`).
                        let xg_all = p.input_part(&layer_in)?;
                        let seq = Op::Composite(Composite::GruSeq(GruSeq { reverse: dir == 1 }));
                        let mut res =
                            crate::tensor::apply_op(seq, &[&xg_all, &p.weight_hh, &p.bias_hh, &h])?.into_iter();
                        let (Some(y), Some(h)) = (res.next(), res.next()) else {
                            return Err(Error::invalid("gru_seq", "internal: expected y and h"));
                        };
                        (y, h, None)
                    }
                    _ => {
                        return Err(Error::invalid(
                            name,
                            "internal: cell state does not match the cell kind",
                        ));
                    }
                };
                dir_outs.push(y);
                h_last.push(h);
                c_last.extend(c);
            }
            let out = if d == 1 {
                dir_outs.pop().expect("one direction")
            } else {
                concat(&dir_outs.iter().collect::<Vec<_>>(), -1)?
            };
            // Paddle applies dropout between layers, never after the last one.
            layer_in = if l + 1 < self.num_layers {
                F::dropout(&out, self.dropout, self.training)?
            } else {
                out
            };
        }
        let mut out = layer_in;
        if self.time_major {
            out = out.transpose(&[1, 0, 2])?;
        }
        let h = stack(&h_last.iter().collect::<Vec<_>>(), 0)?;
        let c = if c_last.is_empty() {
            None
        } else {
            Some(stack(&c_last.iter().collect::<Vec<_>>(), 0)?)
        };
        Ok((out, h, c))
    }
}

macro_rules! stack_builders {
    ($ty:ident) => {
        impl $ty {
            /// Stack `n` layers (rebuilds the parameters).
            pub fn num_layers(mut self, n: usize) -> Result<Self> {
                self.core.num_layers = n;
                self.core.build(self.core.dtype())?;
                Ok(self)
            }

            /// Read forward only or both ways (rebuilds the parameters).
            pub fn direction(mut self, d: Direction) -> Result<Self> {
                self.core.direction = d;
                self.core.build(self.core.dtype())?;
                Ok(self)
            }

            /// Parameter dtype (default f32; rebuilds the parameters). `Layer::to_dtype` converts
            /// a built layer's values instead.
            pub fn dtype(mut self, dtype: DType) -> Result<Self> {
                self.core.build(dtype)?;
                Ok(self)
            }

            /// Dropout probability on the outputs of every layer but the last (training only).
            pub fn dropout(mut self, p: f64) -> Result<Self> {
                if !(0.0..1.0).contains(&p) {
                    return Err(Error::invalid(
                        self.core.kind.name(),
                        format!("dropout p={p} must be in [0, 1)"),
                    ));
                }
                self.core.dropout = p;
                Ok(self)
            }

            /// Take and return `[T, N, C]` instead of batch-first `[N, T, C]`.
            pub fn time_major(mut self, time_major: bool) -> Self {
                self.core.time_major = time_major;
                self
            }

            /// Features per input step.
            pub fn input_size(&self) -> usize {
                self.core.input_size
            }

            /// Features of the hidden state.
            pub fn hidden_size(&self) -> usize {
                self.core.hidden_size
            }
        }

        impl Layer for $ty {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                Ok(self.core.run(x, None, None)?.0)
            }

            fn own_parameters(&self) -> Vec<(String, Tensor)> {
                self.core.named()
            }

            fn set_training(&mut self, training: bool) {
                self.core.training = training;
            }

            fn is_training(&self) -> bool {
                self.core.training
            }
        }
    };
}

/// Long short-term memory over a batch-first sequence (Paddle `nn.LSTM`).
#[allow(clippy::upper_case_acronyms)] // the name users know from Paddle and PyTorch
pub struct LSTM {
    core: Stack,
}

impl LSTM {
    /// One forward layer of `hidden_size` units reading `input_size` features (f32).
    pub fn new(input_size: usize, hidden_size: usize) -> Result<LSTM> {
        Ok(LSTM {
            core: Stack::new(Kind::Lstm, input_size, hidden_size)?,
        })
    }

    /// Run on `x [N, T, I]` from `(h0, c0)` (each `[L·D, N, H]`, zeros when `None`); returns the
    /// output `[N, T, D·H]` and the final `(h, c)`.
    pub fn forward_with_state(
        &self,
        x: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (out, h, c) = self.core.run(x, state.map(|s| s.0), state.map(|s| s.1))?;
        let c = c.ok_or_else(|| Error::invalid("LSTM", "internal: no cell state"))?;
        Ok((out, (h, c)))
    }
}

stack_builders!(LSTM);

/// Gated recurrent unit over a batch-first sequence (Paddle `nn.GRU`).
#[allow(clippy::upper_case_acronyms)] // the name users know from Paddle and PyTorch
pub struct GRU {
    core: Stack,
}

impl GRU {
    /// One forward layer of `hidden_size` units reading `input_size` features (f32).
    pub fn new(input_size: usize, hidden_size: usize) -> Result<GRU> {
        Ok(GRU {
            core: Stack::new(Kind::Gru, input_size, hidden_size)?,
        })
    }

    /// Run on `x [N, T, I]` from `h0 [L·D, N, H]` (zeros when `None`); returns the output
    /// `[N, T, D·H]` and the final `h`.
    pub fn forward_with_state(&self, x: &Tensor, h0: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let (out, h, _) = self.core.run(x, h0, None)?;
        Ok((out, h))
    }
}

stack_builders!(GRU);

/// One cell of either kind: parameters plus the sizes needed to check inputs (the dtype is the
/// parameters').
struct Cell {
    kind: Kind,
    input_size: usize,
    hidden_size: usize,
    params: CellParams,
}

impl Cell {
    fn new(kind: Kind, input_size: usize, hidden_size: usize, dtype: DType) -> Result<Cell> {
        let name = cell_name(kind);
        if input_size == 0 || hidden_size == 0 {
            return Err(Error::invalid(
                name,
                format!("input_size ({input_size}) and hidden_size ({hidden_size}) must be positive"),
            ));
        }
        if !dtype.is_float() {
            return Err(Error::invalid(name, format!("parameters must be float, not {dtype}")));
        }
        Ok(Cell {
            kind,
            input_size,
            hidden_size,
            params: CellParams::new(kind, input_size, hidden_size, dtype)?,
        })
    }

    fn step(&self, x: &Tensor, h: Option<&Tensor>, c: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
        let name = cell_name(self.kind);
        let s = x.shape();
        let dtype = self.params.dtype();
        if s.len() != 2 || s[1] != self.input_size || x.dtype() != dtype {
            return Err(Error::invalid(
                name,
                format!(
                    "input must be [N, C] with C = input_size {} and dtype {dtype}, got {}",
                    self.input_size,
                    dims(x)
                ),
            ));
        }
        let state = [s[0], self.hidden_size];
        let zeros = crate::tensor::zeros_dims(&[x.dims()[0].clone(), oar_ir::Dim::Static(self.hidden_size)], dtype)?;
        let h = match h {
            Some(h) => {
                check_state(name, "h", h, &state, dtype)?;
                h.clone()
            }
            None => zeros.clone(),
        };
        let c = match (self.kind, c) {
            (Kind::Lstm, Some(c)) => {
                check_state(name, "c", c, &state, dtype)?;
                Some(c.clone())
            }
            (Kind::Lstm, None) => Some(zeros),
            (Kind::Gru, _) => None,
        };
        let xg = self.params.input_part(x)?;
        step(
            self.kind,
            &self.params,
            &self.params.weight_hh.t()?,
            &xg,
            &h,
            c.as_ref(),
        )
    }
}

fn cell_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Lstm => "LSTMCell",
        Kind::Gru => "GRUCell",
    }
}

/// One LSTM step (Paddle `nn.LSTMCell`): parameters `weight_ih [4H, I]`, `weight_hh [4H, H]`,
/// `bias_ih`, `bias_hh`.
pub struct LSTMCell {
    cell: Cell,
}

impl LSTMCell {
    /// A cell of `hidden_size` units reading `input_size` features (f32).
    pub fn new(input_size: usize, hidden_size: usize) -> Result<LSTMCell> {
        Ok(LSTMCell {
            cell: Cell::new(Kind::Lstm, input_size, hidden_size, DType::F32)?,
        })
    }

    /// Parameter dtype (rebuilds the parameters).
    pub fn dtype(self, dtype: DType) -> Result<LSTMCell> {
        let c = &self.cell;
        Ok(LSTMCell {
            cell: Cell::new(Kind::Lstm, c.input_size, c.hidden_size, dtype)?,
        })
    }

    /// One step on `x [N, I]` from `(h, c)` (each `[N, H]`, zeros when `None`); returns `(h', c')`.
    pub fn step(&self, x: &Tensor, state: Option<(&Tensor, &Tensor)>) -> Result<(Tensor, Tensor)> {
        let (h, c) = self.cell.step(x, state.map(|s| s.0), state.map(|s| s.1))?;
        let c = c.ok_or_else(|| Error::invalid("LSTMCell", "internal: no cell state"))?;
        Ok((h, c))
    }
}

impl Layer for LSTMCell {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.step(x, None)?.0)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        self.cell.params.named("")
    }
}

/// One GRU step (Paddle `nn.GRUCell`): parameters `weight_ih [3H, I]`, `weight_hh [3H, H]`,
/// `bias_ih`, `bias_hh`.
pub struct GRUCell {
    cell: Cell,
}

impl GRUCell {
    /// A cell of `hidden_size` units reading `input_size` features (f32).
    pub fn new(input_size: usize, hidden_size: usize) -> Result<GRUCell> {
        Ok(GRUCell {
            cell: Cell::new(Kind::Gru, input_size, hidden_size, DType::F32)?,
        })
    }

    /// Parameter dtype (rebuilds the parameters).
    pub fn dtype(self, dtype: DType) -> Result<GRUCell> {
        let c = &self.cell;
        Ok(GRUCell {
            cell: Cell::new(Kind::Gru, c.input_size, c.hidden_size, dtype)?,
        })
    }

    /// One step on `x [N, I]` from `h [N, H]` (zeros when `None`); returns `h'`.
    pub fn step(&self, x: &Tensor, h: Option<&Tensor>) -> Result<Tensor> {
        Ok(self.cell.step(x, h, None)?.0)
    }
}

impl Layer for GRUCell {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.step(x, None)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        self.cell.params.named("")
    }
}
