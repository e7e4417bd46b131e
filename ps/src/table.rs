//! The tables a server shard holds: dense vectors, and sparse embedding tables whose rows are
//! created on first access (after an optional entry filter), updated by a server-side
//! optimizer, and optionally expired when unused.

use oar_ir::ops::random_stream;
use std::collections::HashMap;

/// A server-side optimizer, applied to each pushed gradient.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// `w -= lr · g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `acc += g²; w -= lr · g / (sqrt(acc) + eps)`, `acc` starting at `initial`.
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Added to the root.
        eps: f32,
        /// The accumulator's start.
        initial: f32,
    },
    /// Adam with bias correction, per row (each row counts its own steps).
    Adam {
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Added to the root.
        eps: f32,
    },
}

impl Optimizer {
    /// State values per row of `dim` weights.
    pub fn state_len(&self, dim: usize) -> usize {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::Adagrad { .. } => dim,
            Optimizer::Adam { .. } => 2 * dim + 1,
        }
    }

    fn init_state(&self, state: &mut [f32]) {
        match self {
            Optimizer::Adagrad { initial, .. } => state.fill(*initial),
            _ => state.fill(0.0),
        }
    }

    /// Apply gradient `g` to weights `w` with optimizer state `s`.
    pub fn apply(&self, w: &mut [f32], s: &mut [f32], g: &[f32]) {
        match *self {
            Optimizer::Sgd { lr } => w.iter_mut().zip(g).for_each(|(w, g)| *w -= lr * g),
            Optimizer::Adagrad { lr, eps, .. } => {
                for ((w, a), g) in w.iter_mut().zip(s.iter_mut()).zip(g) {
                    *a += g * g;
                    *w -= lr * g / (a.sqrt() + eps);
                }
            }
            Optimizer::Adam { lr, beta1, beta2, eps } => {
                let dim = w.len();
                let (m, rest) = s.split_at_mut(dim);
                let (v, step) = rest.split_at_mut(dim);
                step[0] += 1.0;
                let t = step[0];
                let (c1, c2) = (1.0 - beta1.powf(t), 1.0 - beta2.powf(t));
                for i in 0..dim {
                    m[i] = beta1 * m[i] + (1.0 - beta1) * g[i];
                    v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
                    w[i] -= lr * (m[i] / c1) / ((v[i] / c2).sqrt() + eps);
                }
            }
        }
    }
}

/// How new rows (and dense tables) start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Zeros.
    Zeros,
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f32,
        /// Upper bound.
        high: f32,
    },
    /// Normal with mean 0.
    Normal {
        /// Standard deviation.
        std: f32,
    },
}

/// Dense or sparse, and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One vector of `len` values.
    Dense {
        /// Its length; 0: set by the first `INIT` push (the trainers' parameters).
        len: usize,
    },
    /// Rows of `dim` values keyed by 64-bit ids.
    Sparse {
        /// Values per row.
        dim: usize,
    },
}

/// A table's definition (the same on every shard).
#[derive(Clone, Debug, PartialEq)]
pub struct TableConfig {
    /// Its name.
    pub name: String,
    /// Dense or sparse.
    pub kind: Kind,
    /// The server-side optimizer.
    pub optimizer: Optimizer,
    /// How new values start.
    pub init: Init,
    /// The seed of the initial values (row `id` starts the same on any shard, in any order).
    pub seed: u64,
    /// A sparse row is created at its `entry_threshold`-th training access (0 and 1: at the
    /// first); before that it reads as zeros and its gradients are dropped.
    pub entry_threshold: u32,
    /// Remove sparse rows not accessed in this many pushes to the table (`None`: keep).
    pub expire_after: Option<u64>,
}

impl TableConfig {
    /// A sparse table of `dim`-value rows, SGD at `lr`, uniform ±0.01 start.
    pub fn sparse(name: &str, dim: usize, optimizer: Optimizer) -> TableConfig {
        TableConfig {
            name: name.to_string(),
            kind: Kind::Sparse { dim },
            optimizer,
            init: Init::Uniform { low: -0.01, high: 0.01 },
            seed: 0,
            entry_threshold: 0,
            expire_after: None,
        }
    }

    /// A dense table of `len` values.
    pub fn dense(name: &str, len: usize, optimizer: Optimizer) -> TableConfig {
        TableConfig {
            name: name.to_string(),
            kind: Kind::Dense { len },
            optimizer,
            init: Init::Zeros,
            seed: 0,
            entry_threshold: 0,
            expire_after: None,
        }
    }

    /// Values per row (the length of a dense table).
    pub fn width(&self) -> usize {
        match self.kind {
            Kind::Dense { len } => len,
            Kind::Sparse { dim } => dim,
        }
    }
}

/// One row (or a dense table): weights, optimizer state, when it was last used.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    pub(crate) w: Vec<f32>,
    pub(crate) state: Vec<f32>,
    pub(crate) last: u64,
}

/// A table's contents on one shard.
#[derive(Clone, Debug)]
pub struct Table {
    pub(crate) config: TableConfig,
    pub(crate) rows: HashMap<u64, Row>,
    /// Training accesses of ids not admitted yet (entry filter).
    pub(crate) pending: HashMap<u64, u32>,
    /// Pushes so far (the expiry clock).
    pub(crate) clock: u64,
    /// Sync-mode gradients waiting for the step's barrier, per id and pushing trainer (summed
    /// in trainer order at the barrier, so a step's update does not depend on which trainer's
    /// push arrived first).
    pub(crate) accumulated: HashMap<u64, std::collections::BTreeMap<u32, Vec<f32>>>,
}

/// FNV-1a of a table's name.
pub(crate) fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Table {
    /// An empty table (a dense one holds its vector at once).
    pub fn new(config: TableConfig) -> Table {
        let mut t = Table {
            config,
            rows: HashMap::new(),
            pending: HashMap::new(),
            clock: 0,
            accumulated: HashMap::new(),
        };
        if let Kind::Dense { len: 1.. } = t.config.kind {
            let row = t.new_row(0);
            t.rows.insert(0, row);
        }
        t
    }

    /// The table's definition.
    pub fn config(&self) -> &TableConfig {
        &self.config
    }

    fn new_row(&self, id: u64) -> Row {
        let width = self.config.width();
        let stream = random_stream::mix64(self.config.seed ^ name_hash(&self.config.name) ^ id.rotate_left(17));
        let w = (0..width as u64)
            .map(|j| match self.config.init {
                Init::Zeros => 0.0,
                Init::Uniform { low, high } => low + (high - low) * random_stream::uniform(stream, j) as f32,
                Init::Normal { std } => std * random_stream::standard_normal(stream, j) as f32,
            })
            .collect();
        let mut state = vec![0.0; self.config.optimizer.state_len(width)];
        self.config.optimizer.init_state(&mut state);
        Row {
            w,
            state,
            last: self.clock,
        }
    }

    /// The rows of `ids`, `dim` values each, in order. In training, absent rows are created
    /// (once their entry count is reached); otherwise they read as zeros.
    pub fn pull(&mut self, ids: &[u64], training: bool) -> Vec<f32> {
        let dim = self.config.width();
        let mut out = Vec::with_capacity(ids.len() * dim);
        for &id in ids {
            if !self.rows.contains_key(&id) && training {
                let seen = self.pending.entry(id).or_insert(0);
                *seen += 1;
                if *seen >= self.config.entry_threshold {
                    self.pending.remove(&id);
                    let row = self.new_row(id);
                    self.rows.insert(id, row);
                }
            }
            match self.rows.get_mut(&id) {
                Some(r) => {
                    r.last = self.clock;
                    out.extend_from_slice(&r.w);
                }
                None => out.resize(out.len() + dim, 0.0),
            }
        }
        out
    }

    /// Apply the gradients `grads` (`dim` per id) to the rows of `ids`; rows that do not exist
    /// (filtered, expired) take none. Then expire rows unused for `expire_after` pushes.
    pub fn push(&mut self, ids: &[u64], grads: &[f32]) {
        let dim = self.config.width();
        let opt = self.config.optimizer;
        self.clock += 1;
        for (&id, g) in ids.iter().zip(grads.chunks_exact(dim)) {
            if let Some(r) = self.rows.get_mut(&id) {
                opt.apply(&mut r.w, &mut r.state, g);
                r.last = self.clock;
            }
        }
        if let (Some(after), Kind::Sparse { .. }) = (self.config.expire_after, self.config.kind) {
            let now = self.clock;
            self.rows.retain(|_, r| now - r.last <= after);
        }
    }

    /// Add trainer `trainer`'s gradients `grads` (`dim` per id) to the step's accumulator,
    /// applied by [`Table::apply_accumulated`] (sync mode).
    pub fn accumulate(&mut self, trainer: u32, ids: &[u64], grads: &[f32]) {
        let dim = self.config.width();
        for (&id, g) in ids.iter().zip(grads.chunks_exact(dim)) {
            let acc = self
                .accumulated
                .entry(id)
                .or_default()
                .entry(trainer)
                .or_insert_with(|| vec![0.0; dim]);
            acc.iter_mut().zip(g).for_each(|(a, g)| *a += g);
        }
    }

    /// Apply the accumulated gradients as one push (ids in order, so every shard and run
    /// applies them alike); whether there were any.
    pub fn apply_accumulated(&mut self) -> bool {
        if self.accumulated.is_empty() {
            return false;
        }
        let dim = self.config.width();
        let mut acc: Vec<_> = self.accumulated.drain().collect();
        acc.sort_unstable_by_key(|(id, _)| *id);
        let ids: Vec<u64> = acc.iter().map(|(id, _)| *id).collect();
        let mut grads = Vec::with_capacity(ids.len() * dim);
        for (_, per_trainer) in acc {
            let mut sum = vec![0.0f32; dim];
            for g in per_trainer.values() {
                sum.iter_mut().zip(g).for_each(|(s, g)| *s += g);
            }
            grads.extend(sum);
        }
        self.push(&ids, &grads);
        true
    }

    /// Add `deltas` (`dim` per id) to the rows of `ids`, bypassing the optimizer (GEO mode);
    /// rows that do not exist take none.
    pub fn add(&mut self, ids: &[u64], deltas: &[f32]) {
        let dim = self.config.width();
        self.clock += 1;
        for (&id, d) in ids.iter().zip(deltas.chunks_exact(dim)) {
            if let Some(r) = self.rows.get_mut(&id) {
                r.w.iter_mut().zip(d).for_each(|(w, d)| *w += d);
                r.last = self.clock;
            }
        }
    }

    /// Set a dense table's values if no push has touched it yet (the trainers' initial
    /// parameters: the first trainer's win); whether they were taken.
    pub fn init_dense(&mut self, values: &[f32]) -> bool {
        if let (0, Kind::Dense { len: 0 }, false) = (self.clock, self.config.kind, values.is_empty()) {
            // Sized by its first values.
            self.config.kind = Kind::Dense { len: values.len() };
            let row = self.new_row(0);
            self.rows.insert(0, row);
        }
        match (self.clock, self.rows.get_mut(&0)) {
            (0, Some(r)) if r.w.len() == values.len() => {
                r.w.copy_from_slice(values);
                self.clock = 1;
                true
            }
            _ => false,
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it holds no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Bytes its rows take (ids, weights and optimizer state; hash-map overhead not counted).
    pub fn bytes(&self) -> u64 {
        let width = self.config.width();
        let per_row = 8 + 4 * (width + self.config.optimizer.state_len(width)) + 8;
        (self.rows.len() * per_row
            + self.pending.len() * 12
            + self
                .accumulated
                .values()
                .map(|t| 8 + t.len() * (4 + 4 * width))
                .sum::<usize>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_start_the_same_whatever_the_order_and_sgd_applies_gradients() {
        let cfg = TableConfig::sparse("emb", 4, Optimizer::Sgd { lr: 0.5 });
        let (mut a, mut b) = (Table::new(cfg.clone()), Table::new(cfg));
        let x = a.pull(&[7, 9], true);
        let y = b.pull(&[9, 7], true);
        assert_eq!(&x[..4], &y[4..]);
        assert!(x.iter().all(|v| v.abs() < 0.01) && x[..4] != x[4..]);
        a.push(&[7], &[1.0, 2.0, 3.0, 4.0]);
        let z = a.pull(&[7], false);
        for j in 0..4 {
            assert!((z[j] - (x[j] - 0.5 * (j as f32 + 1.0))).abs() < 1e-7);
        }
        // Not training: an absent row reads as zeros and is not created.
        assert_eq!(a.pull(&[1234], false), vec![0.0; 4]);
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn accumulated_gradients_apply_once_deltas_bypass_the_optimizer_and_init_is_first_only() {
        let adagrad = Optimizer::Adagrad {
            lr: 0.1,
            eps: 1e-6,
            initial: 0.1,
        };
        let cfg = TableConfig::sparse("emb", 2, adagrad);
        let (mut a, mut b) = (Table::new(cfg.clone()), Table::new(cfg));
        a.pull(&[3, 5], true);
        b.pull(&[3, 5], true);
        // Two trainers' gradients summed, then one Adagrad step: not two steps.
        a.accumulate(0, &[3, 5], &[1.0, 2.0, 3.0, 4.0]);
        a.accumulate(1, &[3], &[0.5, 0.5]);
        assert_eq!(
            a.pull(&[3, 5], false),
            b.pull(&[3, 5], false),
            "nothing applied before the barrier"
        );
        assert!(a.apply_accumulated() && !a.apply_accumulated());
        b.push(&[3, 5], &[1.5, 2.5, 3.0, 4.0]);
        assert_eq!(a.pull(&[3, 5], false), b.pull(&[3, 5], false));
        // The sum is taken in trainer order, whatever order the pushes arrived in: in f32,
        // 1e8 + 1 − 1e8 is 0 but 1e8 − 1e8 + 1 is 1.
        let cfg = TableConfig::sparse("s", 1, Optimizer::Sgd { lr: 1.0 });
        let pushes = [(0u32, 1e8f32), (1, -1e8), (2, 1.0)];
        let mut results = Vec::new();
        for order in [[0, 1, 2], [2, 0, 1], [1, 2, 0]] {
            let mut t = Table::new(cfg.clone());
            t.pull(&[9], true);
            for k in order {
                t.accumulate(pushes[k].0, &[9], &[pushes[k].1]);
            }
            t.apply_accumulated();
            results.push(t.pull(&[9], false)[0].to_bits());
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
        let before = a.pull(&[5], false);
        a.add(&[5, 99], &[1.0, -1.0, 7.0, 7.0]);
        let after = a.pull(&[5], false);
        assert!((after[0] - before[0] - 1.0).abs() < 1e-6 && (after[1] - before[1] + 1.0).abs() < 1e-6);
        assert_eq!(a.len(), 2, "a delta for an absent row creates none");
        let mut d = Table::new(TableConfig::dense("w", 2, Optimizer::Sgd { lr: 1.0 }));
        assert!(!d.init_dense(&[1.0]), "wrong length");
        assert!(d.init_dense(&[1.0, 2.0]) && !d.init_dense(&[5.0, 5.0]));
        assert_eq!(d.pull(&[0], false), vec![1.0, 2.0]);
        // A dense table without a length takes the first INIT's.
        let mut auto = Table::new(TableConfig::from_spec("w,dense,opt=sgd,lr=1").unwrap());
        assert_eq!((auto.len(), auto.config().width()), (0, 0));
        assert!(auto.init_dense(&[3.0, 4.0, 5.0]) && !auto.init_dense(&[1.0]));
        auto.push(&[0], &[1.0, 1.0, 1.0]);
        assert_eq!(auto.pull(&[0], false), vec![2.0, 3.0, 4.0]);
    }

    #[test]
    fn adagrad_and_adam_follow_their_formulas() {
        let (mut w, mut s) = (vec![1.0f32], vec![0.1f32]);
        Optimizer::Adagrad {
            lr: 0.1,
            eps: 1e-6,
            initial: 0.1,
        }
        .apply(&mut w, &mut s, &[2.0]);
        assert!((s[0] - 4.1).abs() < 1e-6 && (w[0] - (1.0 - 0.1 * 2.0 / (4.1f32.sqrt() + 1e-6))).abs() < 1e-6);
        let adam = Optimizer::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        let (mut w, mut s) = (vec![1.0f32], vec![0.0f32; 3]);
        adam.apply(&mut w, &mut s, &[0.5]);
        // The first bias-corrected step is lr · sign(g).
        assert!((w[0] - 0.9).abs() < 1e-6 && s[2] == 1.0, "{w:?} {s:?}");
    }

    #[test]
    fn the_entry_filter_and_expiry_bound_the_rows() {
        let mut cfg = TableConfig::sparse("emb", 2, Optimizer::Sgd { lr: 1.0 });
        cfg.entry_threshold = 3;
        cfg.expire_after = Some(2);
        let mut t = Table::new(cfg);
        assert_eq!(t.pull(&[5], true), vec![0.0, 0.0]);
        t.push(&[5], &[1.0, 1.0]); // dropped: not admitted yet
        assert_eq!(t.pull(&[5], true), vec![0.0, 0.0]);
        assert!(t.pull(&[5], true) != vec![0.0, 0.0], "admitted at the third access");
        assert_eq!(t.len(), 1);
        t.push(&[6], &[0.0, 0.0]);
        t.push(&[6], &[0.0, 0.0]);
        assert_eq!(t.len(), 1);
        t.push(&[6], &[0.0, 0.0]);
        assert_eq!(t.len(), 0, "row 5 unused for 3 pushes");
        assert!(t.bytes() < 100);
    }
}

impl TableConfig {
    /// A table from its command-line spec: `NAME,sparse,dim=D` or `NAME,dense[,len=L]`
    /// (without `len`: sized by the first INIT push), then optional `opt=sgd|adagrad|adam`, `lr=`, `init=zeros|uniform|normal`, `scale=` (the
    /// uniform bound or the normal's deviation), `seed=`, `entry=` (the entry filter's count),
    /// `expire=` (pushes without access). E.g. `emb,sparse,dim=16,opt=adagrad,lr=0.05,entry=2`.
    pub fn from_spec(spec: &str) -> Result<TableConfig, crate::PsError> {
        let bad = |what: String| crate::PsError::Config(format!("table spec `{spec}`: {what}"));
        let mut parts = spec.split(',').map(str::trim);
        let name = parts
            .next()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("no name".into()))?;
        let kind = parts.next().ok_or_else(|| bad("no kind (sparse or dense)".into()))?;
        let mut kv = std::collections::BTreeMap::new();
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| bad(format!("`{p}` is not key=value")))?;
            kv.insert(k, v);
        }
        let num = |k: &str, default: f64| -> Result<f64, crate::PsError> {
            kv.get(k).map_or(Ok(default), |v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| bad(format!("`{k}={v}` is not a number")))
            })
        };
        let size = |k: &str| -> Result<usize, crate::PsError> {
            let v = kv.get(k).ok_or_else(|| bad(format!("needs {k}=")))?;
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0 && n <= 1 << 24)
                .ok_or_else(|| bad(format!("`{k}={v}` must be a size from 1 to 2^24")))
        };
        let kind = match kind {
            "sparse" => Kind::Sparse { dim: size("dim")? },
            "dense" if !kv.contains_key("len") => Kind::Dense { len: 0 },
            "dense" => Kind::Dense { len: size("len")? },
            other => return Err(bad(format!("kind `{other}` is neither sparse nor dense"))),
        };
        let lr = num("lr", 0.01)? as f32;
        let optimizer = match kv.get("opt").copied().unwrap_or("sgd") {
            "sgd" => Optimizer::Sgd { lr },
            "adagrad" => Optimizer::Adagrad {
                lr,
                eps: 1e-6,
                initial: 0.1,
            },
            "adam" => Optimizer::Adam {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            other => return Err(bad(format!("optimizer `{other}` (sgd, adagrad or adam)"))),
        };
        let scale = num("scale", 0.01)? as f32;
        let init = match kv
            .get("init")
            .copied()
            .unwrap_or(if matches!(kind, Kind::Dense { .. }) {
                "zeros"
            } else {
                "uniform"
            }) {
            "zeros" => Init::Zeros,
            "uniform" => Init::Uniform {
                low: -scale,
                high: scale,
            },
            "normal" => Init::Normal { std: scale },
            other => return Err(bad(format!("initializer `{other}` (zeros, uniform or normal)"))),
        };
        let known = ["dim", "len", "opt", "lr", "init", "scale", "seed", "entry", "expire"];
        if let Some(k) = kv.keys().find(|k| !known.contains(k)) {
            return Err(bad(format!("unknown key `{k}` (known: {})", known.join(", "))));
        }
        Ok(TableConfig {
            name: name.to_string(),
            kind,
            optimizer,
            init,
            seed: num("seed", 0.0)? as u64,
            entry_threshold: num("entry", 0.0)? as u32,
            expire_after: kv
                .contains_key("expire")
                .then(|| num("expire", 0.0))
                .transpose()?
                .map(|x| x as u64),
        })
    }
}

#[cfg(test)]
mod spec_tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let t = TableConfig::from_spec("emb,sparse,dim=16,opt=adagrad,lr=0.05,entry=2,expire=100").unwrap();
        assert_eq!(t.kind, Kind::Sparse { dim: 16 });
        assert_eq!((t.entry_threshold, t.expire_after), (2, Some(100)));
        assert!(matches!(t.optimizer, Optimizer::Adagrad { lr, .. } if (lr - 0.05).abs() < 1e-9));
        let d = TableConfig::from_spec("w,dense,len=10").unwrap();
        assert_eq!((d.kind, d.init), (Kind::Dense { len: 10 }, Init::Zeros));
        for (spec, why) in [
            ("emb,sparse", "needs dim="),
            ("emb,tree,dim=2", "neither sparse nor dense"),
            ("emb,sparse,dim=0", "size from 1"),
            ("emb,sparse,dim=4,lr=x", "not a number"),
            ("emb,sparse,dim=4,opt=lamb", "optimizer `lamb`"),
            ("emb,sparse,dim=4,colour=red", "unknown key `colour`"),
        ] {
            let e = TableConfig::from_spec(spec).unwrap_err().to_string();
            assert!(e.contains(why), "{spec}: {e}");
        }
    }
}
