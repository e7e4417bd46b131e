//! Metrics, as Paddle's `paddle.metric`: streaming accumulators a training loop feeds batch by
//! batch — `update` with a batch's predictions and labels (returns that batch's values),
//! `accumulate` for everything since `reset`.
//!
//! - [`Accuracy`]: top-k accuracy of class scores `[N, C]` against labels `[N]` or `[N, 1]`.
//! - [`Precision`], [`Recall`]: binary, of probabilities `[N]` / `[N, 1]` rounded at 0.5 (`p ≥
//!   0.5` is positive, as Paddle's `floor(p + 0.5)`).
//! - [`Auc`]: ROC AUC, streaming over `num_thresholds` bins of the positive-class probability
//!   (`[N]`, `[N, 1]`, or `[N, 2]` whose column 1 is used), Paddle's estimate.
//! - [`MeanIou`]: mean intersection over union of segmentation labels (class scores `[N, C, …]`
//!   are reduced by argmax over axis 1), over the classes that occur in either.
//!
//! Labels may be of any dtype holding integers. Implement [`Metric`] to add one; tested
//! against scikit-learn (`tools/gen_metric_fixtures.py`).

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A streaming metric.
pub trait Metric {
    /// Names of the values [`Metric::accumulate`] returns (`acc_top1`, `precision`, …).
    fn names(&self) -> Vec<String>;
    /// Forget every update.
    fn reset(&mut self);
    /// Add a batch of predictions and labels; returns the batch's own values.
    fn update(&mut self, pred: &Tensor, label: &Tensor) -> Result<Vec<f64>>;
    /// The values over every batch since the last reset (0 where nothing was seen).
    fn accumulate(&self) -> Vec<f64>;
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.detach().try_data()?.to_f64_vec())
}

/// `label`'s values as classes: `[n]` or `[n, 1]`, integers in `0..classes`.
fn class_labels(metric: &str, label: &Tensor, n: usize, classes: usize) -> Result<Vec<usize>> {
    let dims = label.shape();
    if !(dims == [n] || dims == [n, 1]) {
        return Err(Error::invalid(
            metric,
            format!("labels of shape {dims:?} for {n} predictions: want [{n}] or [{n}, 1]"),
        ));
    }
    values(label)?
        .into_iter()
        .map(|v| {
            if v.fract() == 0.0 && v >= 0.0 && (v as usize) < classes {
                Ok(v as usize)
            } else {
                Err(Error::invalid(
                    metric,
                    format!("label {v} is not a class in 0..{classes}"),
                ))
            }
        })
        .collect()
}

/// Probabilities of the positive class: `[n]`, `[n, 1]`, or column 1 of `[n, 2]`.
fn positive_probs(metric: &str, pred: &Tensor) -> Result<Vec<f64>> {
    let dims = pred.shape();
    let v = values(pred)?;
    match dims.as_slice() {
        [_] | [_, 1] => Ok(v),
        [_, 2] => Ok(v.chunks_exact(2).map(|r| r[1]).collect()),
        _ => Err(Error::invalid(
            metric,
            format!("predictions of shape {dims:?}: want [N], [N, 1] or [N, 2] probabilities"),
        )),
    }
}

/// Top-k accuracy for each `k` of `topk`: a sample counts when fewer than `k` classes score
/// above its label's (ties go to the lower class index, as a stable sort).
pub struct Accuracy {
    topk: Vec<usize>,
    correct: Vec<u64>,
    total: u64,
}

impl Accuracy {
    /// Top-1 accuracy.
    pub fn new() -> Accuracy {
        Accuracy::topk(&[1]).expect("k = 1 is valid")
    }

    /// Top-k accuracy for each of `ks` (each at least 1).
    pub fn topk(ks: &[usize]) -> Result<Accuracy> {
        if ks.is_empty() || ks.contains(&0) {
            return Err(Error::invalid(
                "Accuracy",
                format!("top-k of {ks:?}: each k must be ≥ 1"),
            ));
        }
        Ok(Accuracy {
            topk: ks.to_vec(),
            correct: vec![0; ks.len()],
            total: 0,
        })
    }
}

impl Default for Accuracy {
    fn default() -> Accuracy {
        Accuracy::new()
    }
}

impl Metric for Accuracy {
    fn names(&self) -> Vec<String> {
        self.topk.iter().map(|k| format!("acc_top{k}")).collect()
    }

    fn reset(&mut self) {
        self.correct.iter_mut().for_each(|c| *c = 0);
        self.total = 0;
    }

    fn update(&mut self, pred: &Tensor, label: &Tensor) -> Result<Vec<f64>> {
        let dims = pred.shape();
        let [n, c] = dims.as_slice() else {
            return Err(Error::invalid(
                "Accuracy",
                format!("scores of shape {dims:?}: want [N, classes]"),
            ));
        };
        let (n, c) = (*n, *c);
        if let Some(&k) = self.topk.iter().find(|&&k| k > c) {
            return Err(Error::invalid("Accuracy", format!("top-{k} of {c} classes")));
        }
        let labels = class_labels("Accuracy", label, n, c)?;
        let scores = values(pred)?;
        let mut batch = vec![0u64; self.topk.len()];
        for (row, &l) in scores.chunks_exact(c.max(1)).zip(&labels) {
            let s = row[l];
            let rank = row
                .iter()
                .enumerate()
                .filter(|&(j, &v)| v > s || (v == s && j < l))
                .count();
            for (b, &k) in batch.iter_mut().zip(&self.topk) {
                *b += (rank < k) as u64;
            }
        }
        for (c, b) in self.correct.iter_mut().zip(&batch) {
            *c += b;
        }
        self.total += n as u64;
        Ok(batch.iter().map(|&b| ratio(b, n as u64)).collect())
    }

    fn accumulate(&self) -> Vec<f64> {
        self.correct.iter().map(|&c| ratio(c, self.total)).collect()
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Counts of a binary classifier's outcomes.
#[derive(Clone, Copy, Debug, Default)]
struct Confusion {
    tp: u64,
    fp: u64,
    fn_: u64,
}

impl Confusion {
    fn of(metric: &str, pred: &Tensor, label: &Tensor) -> Result<Confusion> {
        let p = positive_probs(metric, pred)?;
        let l = class_labels(metric, label, p.len(), 2)?;
        let mut c = Confusion::default();
        for (p, l) in p.iter().zip(&l) {
            match (*p >= 0.5, *l == 1) {
                (true, true) => c.tp += 1,
                (true, false) => c.fp += 1,
                (false, true) => c.fn_ += 1,
                (false, false) => {}
            }
        }
        Ok(c)
    }

    fn add(&mut self, o: Confusion) {
        self.tp += o.tp;
        self.fp += o.fp;
        self.fn_ += o.fn_;
    }
}

/// A binary rate `tp / (tp + missed)` over [`Confusion`] counts, as a metric.
macro_rules! binary_rate {
    ($(#[$m:meta])* $name:ident, $key:literal, $missed:ident) => {
        $(#[$m])*
        #[derive(Default)]
        pub struct $name(Confusion);

        impl $name {
            /// An empty accumulator.
            pub fn new() -> $name {
                $name::default()
            }

            fn rate(c: &Confusion) -> f64 {
                ratio(c.tp, c.tp + c.$missed)
            }
        }

        impl Metric for $name {
            fn names(&self) -> Vec<String> {
                vec![$key.into()]
            }

            fn reset(&mut self) {
                self.0 = Confusion::default();
            }

            fn update(&mut self, pred: &Tensor, label: &Tensor) -> Result<Vec<f64>> {
                let c = Confusion::of(stringify!($name), pred, label)?;
                self.0.add(c);
                Ok(vec![$name::rate(&c)])
            }

            fn accumulate(&self) -> Vec<f64> {
                vec![$name::rate(&self.0)]
            }
        }
    };
}

binary_rate!(
    /// Binary precision `tp / (tp + fp)` of probabilities rounded at 0.5 (0 with no positive
    /// prediction).
    Precision,
    "precision",
    fp
);
binary_rate!(
    /// Binary recall `tp / (tp + fn)` of probabilities rounded at 0.5 (0 with no positive
    /// label).
    Recall,
    "recall",
    fn_
);

/// ROC AUC, streaming (Paddle's `Auc`): each probability of the positive class counts in bin
/// `⌊p · num_thresholds⌋`; the curve through the bins' cumulative rates is integrated by
/// trapezoids (samples sharing a bin count as ties). Exact ROC AUC when no positive and
/// negative share a bin.
pub struct Auc {
    num_thresholds: usize,
    pos: Vec<u64>,
    neg: Vec<u64>,
}

impl Auc {
    /// Paddle's default: 4095 thresholds.
    pub fn new() -> Auc {
        Auc::with_thresholds(4095).expect("4095 thresholds are valid")
    }

    /// `num_thresholds` bins (1 ..= 2^24).
    pub fn with_thresholds(num_thresholds: usize) -> Result<Auc> {
        if !(1..=1 << 24).contains(&num_thresholds) {
            return Err(Error::invalid(
                "Auc",
                format!("{num_thresholds} thresholds: want 1 to 2^24"),
            ));
        }
        Ok(Auc {
            num_thresholds,
            pos: vec![0; num_thresholds + 1],
            neg: vec![0; num_thresholds + 1],
        })
    }

    fn area(pos: &[u64], neg: &[u64]) -> f64 {
        let (mut tot_pos, mut tot_neg, mut area) = (0f64, 0f64, 0f64);
        for (p, n) in pos.iter().zip(neg).rev() {
            let (prev_pos, prev_neg) = (tot_pos, tot_neg);
            tot_pos += *p as f64;
            tot_neg += *n as f64;
            area += (tot_neg - prev_neg) * (tot_pos + prev_pos) / 2.0;
        }
        if tot_pos > 0.0 && tot_neg > 0.0 {
            area / (tot_pos * tot_neg)
        } else {
            0.0
        }
    }
}

impl Default for Auc {
    fn default() -> Auc {
        Auc::new()
    }
}

impl Metric for Auc {
    fn names(&self) -> Vec<String> {
        vec!["auc".into()]
    }

    fn reset(&mut self) {
        self.pos.iter_mut().for_each(|c| *c = 0);
        self.neg.iter_mut().for_each(|c| *c = 0);
    }

    fn update(&mut self, pred: &Tensor, label: &Tensor) -> Result<Vec<f64>> {
        let p = positive_probs("Auc", pred)?;
        let l = class_labels("Auc", label, p.len(), 2)?;
        if let Some(bad) = p.iter().find(|p| !(0.0..=1.0).contains(*p)) {
            return Err(Error::invalid("Auc", format!("probability {bad} is not in [0, 1]")));
        }
        let (mut pos, mut neg) = (vec![0u64; self.pos.len()], vec![0u64; self.neg.len()]);
        for (p, l) in p.iter().zip(&l) {
            let bin = (p * self.num_thresholds as f64) as usize;
            if *l == 1 {
                pos[bin] += 1;
            } else {
                neg[bin] += 1;
            }
        }
        for (acc, b) in self.pos.iter_mut().zip(&pos) {
            *acc += b;
        }
        for (acc, b) in self.neg.iter_mut().zip(&neg) {
            *acc += b;
        }
        Ok(vec![Auc::area(&pos, &neg)])
    }

    fn accumulate(&self) -> Vec<f64> {
        vec![Auc::area(&self.pos, &self.neg)]
    }
}

/// Mean intersection over union of segmentation labels over `classes` classes: per class
/// `tp / (tp + fp + fn)`, averaged over the classes that occur in the labels or predictions.
pub struct MeanIou {
    classes: usize,
    /// `[truth][pred]` counts.
    confusion: Vec<u64>,
}

impl MeanIou {
    /// Over `classes` classes (at least 1).
    pub fn new(classes: usize) -> Result<MeanIou> {
        if classes == 0 {
            return Err(Error::invalid("MeanIou", "0 classes"));
        }
        Ok(MeanIou {
            classes,
            confusion: vec![0; classes * classes],
        })
    }

    /// Each class's IoU (`None` for a class that occurs nowhere yet).
    pub fn per_class(&self) -> Vec<Option<f64>> {
        Self::ious(&self.confusion, self.classes)
    }

    fn ious(m: &[u64], c: usize) -> Vec<Option<f64>> {
        (0..c)
            .map(|k| {
                let tp = m[k * c + k];
                let row: u64 = m[k * c..(k + 1) * c].iter().sum();
                let col: u64 = (0..c).map(|t| m[t * c + k]).sum();
                let union = row + col - tp;
                (union > 0).then(|| tp as f64 / union as f64)
            })
            .collect()
    }

    fn mean(m: &[u64], c: usize) -> f64 {
        let present: Vec<f64> = Self::ious(m, c).into_iter().flatten().collect();
        if present.is_empty() {
            0.0
        } else {
            present.iter().sum::<f64>() / present.len() as f64
        }
    }

    /// Predicted classes: `pred` as labels of `label`'s shape, or scores `[N, C, …]` reduced
    /// by argmax over axis 1 (ties to the lower class).
    fn predicted(&self, pred: &Tensor, label: &Tensor) -> Result<Vec<f64>> {
        let (pd, ld) = (pred.shape(), label.shape());
        if pd == ld {
            return values(pred);
        }
        let c = self.classes;
        let squeezed: Vec<usize> = pd
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != 1)
            .map(|(_, &d)| d)
            .collect();
        if pd.len() < 2 || pd[1] != c || squeezed != ld {
            return Err(Error::invalid(
                "MeanIou",
                format!("predictions of shape {pd:?} for labels {ld:?}: want the labels' shape, or scores [N, {c}, …]"),
            ));
        }
        let v = values(pred)?;
        let inner: usize = pd[2..].iter().product();
        let mut out = Vec::with_capacity(v.len() / c.max(1));
        for img in v.chunks_exact((c * inner).max(1)) {
            for i in 0..inner {
                let best = (0..c).fold(0, |b, k| if img[k * inner + i] > img[b * inner + i] { k } else { b });
                out.push(best as f64);
            }
        }
        Ok(out)
    }
}

impl Metric for MeanIou {
    fn names(&self) -> Vec<String> {
        vec!["mean_iou".into()]
    }

    fn reset(&mut self) {
        self.confusion.iter_mut().for_each(|c| *c = 0);
    }

    fn update(&mut self, pred: &Tensor, label: &Tensor) -> Result<Vec<f64>> {
        let c = self.classes;
        let p = self.predicted(pred, label)?;
        let t = values(label)?;
        let class = |v: f64, what: &str| {
            if v.fract() == 0.0 && v >= 0.0 && (v as usize) < c {
                Ok(v as usize)
            } else {
                Err(Error::invalid(
                    "MeanIou",
                    format!("{what} {v} is not a class in 0..{c}"),
                ))
            }
        };
        let mut batch = vec![0u64; c * c];
        for (p, t) in p.iter().zip(&t) {
            batch[class(*t, "label")? * c + class(*p, "prediction")?] += 1;
        }
        for (acc, b) in self.confusion.iter_mut().zip(&batch) {
            *acc += b;
        }
        Ok(vec![Self::mean(&batch, c)])
    }

    fn accumulate(&self) -> Vec<f64> {
        vec![Self::mean(&self.confusion, self.classes)]
    }
}
