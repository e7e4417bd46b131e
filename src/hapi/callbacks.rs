//! Callbacks for [`Model::fit_with`]: hooks at the start and end of training, of each epoch
//! and after each batch, as Paddle's `paddle.callbacks`. [`EarlyStopping`],
//! [`ModelCheckpoint`], [`LrSchedule`], [`ReduceLrOnPlateau`], [`MetricsLogger`] and [`PlotCurves`] are here;
//! implement [`Callback`] for more (the progress bar is `fit`'s own, [`Model::verbose`]).

use super::{EpochLogs, Model};
use crate::error::{Error, Result};
use crate::optimizer::lr::LRScheduler;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a callback tells `fit` at the end of an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Train on.
    Continue,
    /// Stop after this epoch.
    Stop,
}

/// Hooks into [`Model::fit_with`]; every method does nothing by default.
pub trait Callback {
    /// Before the first epoch of this `fit`.
    fn on_train_begin(&mut self, _model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// Before epoch `epoch` (counting every epoch the model has trained).
    fn on_epoch_begin(&mut self, _model: &mut Model, _epoch: usize) -> Result<()> {
        Ok(())
    }
    /// After training batch `batch` of the epoch, with its loss.
    fn on_batch_end(&mut self, _model: &mut Model, _batch: usize, _loss: f64) -> Result<()> {
        Ok(())
    }
    /// After an epoch (and its evaluation): its logs; [`Control::Stop`] ends training.
    fn on_epoch_end(&mut self, _model: &mut Model, _logs: &EpochLogs) -> Result<Control> {
        Ok(Control::Continue)
    }
    /// After the last epoch of this `fit`, with its history.
    fn on_train_end(&mut self, _model: &mut Model, _history: &[EpochLogs]) -> Result<()> {
        Ok(())
    }
}

/// Whether a monitored value should fall or rise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Lower is better (losses).
    Min,
    /// Higher is better (accuracies).
    Max,
}

/// A value of an epoch's logs: `eval/<name>` or `train/<name>`, or a bare `<name>` (the
/// evaluation's when there is one, else training's).
fn monitored(logs: &EpochLogs, key: &str, who: &str) -> Result<f64> {
    let found = match key.split_once('/') {
        Some(("eval", k)) => logs.eval.get(k),
        Some(("train", k)) => logs.train.get(k),
        _ => logs.eval.get(key).or_else(|| logs.train.get(key)),
    };
    found.copied().ok_or_else(|| {
        Error::invalid(
            who,
            format!(
                "no `{key}` in the epoch's logs (train: {:?}, eval: {:?})",
                logs.train.keys().collect::<Vec<_>>(),
                logs.eval.keys().collect::<Vec<_>>()
            ),
        )
    })
}

/// Create `dir` (and its parents) if missing.
fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io {
        path: dir.display().to_string(),
        detail: e.to_string(),
    })
}

/// Tracks the best value of a monitored quantity.
#[derive(Clone, Debug)]
struct Best {
    mode: Mode,
    min_delta: f64,
    value: Option<f64>,
}

impl Best {
    /// Nothing seen yet, improvements of any size count.
    fn new(mode: Mode) -> Best {
        Best {
            mode,
            min_delta: 0.0,
            value: None,
        }
    }

    /// Record `v`; whether it improved on the best by more than `min_delta`.
    fn improved(&mut self, v: f64) -> bool {
        let better = match (self.value, self.mode) {
            (None, _) => !v.is_nan(),
            (Some(b), Mode::Min) => v < b - self.min_delta,
            (Some(b), Mode::Max) => v > b + self.min_delta,
        };
        if better {
            self.value = Some(v);
        }
        better
    }
}

/// Stop when `monitor` has not improved (by more than `min_delta`) for `patience` epochs.
pub struct EarlyStopping {
    monitor: String,
    best: Best,
    patience: usize,
    wait: usize,
    /// The epoch training stopped after, if it did.
    pub stopped_epoch: Option<usize>,
}

impl EarlyStopping {
    /// Watch `monitor` (`loss`, `eval/acc_top1`, …) in `mode`.
    pub fn new(monitor: &str, mode: Mode, patience: usize) -> EarlyStopping {
        EarlyStopping {
            monitor: monitor.to_string(),
            best: Best::new(mode),
            patience,
            wait: 0,
            stopped_epoch: None,
        }
    }

    /// Improvements of at most `delta` do not count.
    pub fn min_delta(mut self, delta: f64) -> EarlyStopping {
        self.best.min_delta = delta.abs();
        self
    }
}

impl Callback for EarlyStopping {
    fn on_train_begin(&mut self, _: &mut Model) -> Result<()> {
        self.wait = 0;
        self.stopped_epoch = None;
        Ok(())
    }

    fn on_epoch_end(&mut self, _: &mut Model, logs: &EpochLogs) -> Result<Control> {
        let v = monitored(logs, &self.monitor, "EarlyStopping")?;
        if self.best.improved(v) {
            self.wait = 0;
            return Ok(Control::Continue);
        }
        self.wait += 1;
        if self.wait > self.patience {
            self.stopped_epoch = Some(logs.epoch);
            return Ok(Control::Stop);
        }
        Ok(Control::Continue)
    }
}

/// Write `last.safetensors` after every epoch and, with a monitored value, `best.safetensors`
/// whenever it improves ([`Model::save`] checkpoints, written atomically) into a directory.
pub struct ModelCheckpoint {
    dir: PathBuf,
    best: Option<(String, Best)>,
}

impl ModelCheckpoint {
    /// Checkpoints in `dir` (created if missing): the last epoch's only.
    pub fn new(dir: impl AsRef<Path>) -> ModelCheckpoint {
        ModelCheckpoint {
            dir: dir.as_ref().to_path_buf(),
            best: None,
        }
    }

    /// Also keep the best epoch's by `monitor` in `mode`.
    pub fn save_best(mut self, monitor: &str, mode: Mode) -> ModelCheckpoint {
        self.best = Some((monitor.to_string(), Best::new(mode)));
        self
    }

    /// The last epoch's checkpoint.
    pub fn last_path(&self) -> PathBuf {
        self.dir.join("last.safetensors")
    }

    /// The best epoch's checkpoint.
    pub fn best_path(&self) -> PathBuf {
        self.dir.join("best.safetensors")
    }
}

impl Callback for ModelCheckpoint {
    fn on_train_begin(&mut self, _: &mut Model) -> Result<()> {
        create_dir(&self.dir)
    }

    fn on_epoch_end(&mut self, model: &mut Model, logs: &EpochLogs) -> Result<Control> {
        model.save(self.last_path())?;
        if let Some((key, best)) = &mut self.best
            && best.improved(monitored(logs, key, "ModelCheckpoint")?)
        {
            model.save(self.best_path())?;
        }
        Ok(Control::Continue)
    }
}

/// Step a learning-rate schedule once per epoch (the optimizer was built with a clone of it:
/// clones share the epoch). At the start of training the schedule is set to the epochs the
/// model has trained, so a resumed run continues the schedule.
pub struct LrSchedule<S: LRScheduler>(pub S);

impl<S: LRScheduler> Callback for LrSchedule<S> {
    fn on_train_begin(&mut self, model: &mut Model) -> Result<()> {
        self.0.set_last_epoch(model.epochs_trained() as u64);
        Ok(())
    }

    fn on_epoch_end(&mut self, _: &mut Model, _: &EpochLogs) -> Result<Control> {
        self.0.step();
        Ok(Control::Continue)
    }
}

/// Multiply the optimizer's learning rate by `factor` when `monitor` has not improved for
/// `patience` epochs, down to `min_lr` (Paddle's `ReduceLROnPlateau`); then wait `cooldown`
/// epochs before counting again.
pub struct ReduceLrOnPlateau {
    monitor: String,
    best: Best,
    factor: f64,
    patience: usize,
    cooldown: usize,
    min_lr: f64,
    wait: usize,
    cooling: usize,
}

impl ReduceLrOnPlateau {
    /// Watch `monitor` in `mode`; `factor` in (0, 1).
    pub fn new(monitor: &str, mode: Mode, factor: f64, patience: usize) -> Result<ReduceLrOnPlateau> {
        if !(factor > 0.0 && factor < 1.0) {
            return Err(Error::invalid(
                "ReduceLrOnPlateau",
                format!("factor {factor} is not in (0, 1)"),
            ));
        }
        Ok(ReduceLrOnPlateau {
            monitor: monitor.to_string(),
            best: Best::new(mode),
            factor,
            patience,
            cooldown: 0,
            min_lr: 0.0,
            wait: 0,
            cooling: 0,
        })
    }

    /// The learning rate never goes below `lr`.
    pub fn min_lr(mut self, lr: f64) -> ReduceLrOnPlateau {
        self.min_lr = lr;
        self
    }

    /// Epochs to wait after a reduction before counting again.
    pub fn cooldown(mut self, epochs: usize) -> ReduceLrOnPlateau {
        self.cooldown = epochs;
        self
    }
}

impl Callback for ReduceLrOnPlateau {
    fn on_epoch_end(&mut self, model: &mut Model, logs: &EpochLogs) -> Result<Control> {
        let v = monitored(logs, &self.monitor, "ReduceLrOnPlateau")?;
        if self.best.improved(v) {
            self.wait = 0;
        } else if self.cooling > 0 {
            self.cooling -= 1;
        } else {
            self.wait += 1;
            if self.wait > self.patience {
                let opt = model.optimizer_mut().ok_or_else(|| {
                    Error::invalid("ReduceLrOnPlateau", "the model has no optimizer: call prepare first")
                })?;
                let lr = (opt.get_lr() * self.factor).max(self.min_lr);
                opt.set_lr(lr);
                self.wait = 0;
                self.cooling = self.cooldown;
            }
        }
        Ok(Control::Continue)
    }
}

/// The format of a [`MetricsLogger`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// A header row (`epoch`, `train/<name>`…, `eval/<name>`…), then a row per epoch.
    Csv,
    /// One JSON object per epoch and line.
    JsonLines,
}

/// Append each epoch's logs to a file (created or truncated when training begins), flushed
/// after every epoch so that a crash keeps what was written.
pub struct MetricsLogger {
    path: PathBuf,
    format: LogFormat,
    file: Option<std::fs::File>,
    columns: Vec<String>,
}

impl MetricsLogger {
    /// Log to `path` in `format`.
    pub fn new(path: impl AsRef<Path>, format: LogFormat) -> MetricsLogger {
        MetricsLogger {
            path: path.as_ref().to_path_buf(),
            format,
            file: None,
            columns: Vec::new(),
        }
    }

    fn io(&self, e: impl std::fmt::Display) -> Error {
        Error::Io {
            path: self.path.display().to_string(),
            detail: e.to_string(),
        }
    }
}

/// An epoch's values as `(column, value)`: `epoch`, then `train/…`, then `eval/…`.
fn columns(logs: &EpochLogs) -> Vec<(String, f64)> {
    let mut v = vec![("epoch".to_string(), logs.epoch as f64)];
    v.extend(logs.train.iter().map(|(k, x)| (format!("train/{k}"), *x)));
    v.extend(logs.eval.iter().map(|(k, x)| (format!("eval/{k}"), *x)));
    v
}

impl Callback for MetricsLogger {
    fn on_train_begin(&mut self, _: &mut Model) -> Result<()> {
        self.file = Some(std::fs::File::create(&self.path).map_err(|e| self.io(e))?);
        self.columns.clear();
        Ok(())
    }

    fn on_epoch_end(&mut self, _: &mut Model, logs: &EpochLogs) -> Result<Control> {
        let values = columns(logs);
        let mut line = String::new();
        match self.format {
            LogFormat::Csv => {
                if self.columns.is_empty() {
                    self.columns = values.iter().map(|(k, _)| k.clone()).collect();
                    line.push_str(&self.columns.join(","));
                    line.push('\n');
                }
                let row: Vec<String> = self
                    .columns
                    .iter()
                    .map(|c| {
                        values
                            .iter()
                            .find(|(k, _)| k == c)
                            .map_or(String::new(), |(_, v)| v.to_string())
                    })
                    .collect();
                line.push_str(&row.join(","));
            }
            LogFormat::JsonLines => {
                let fields: Vec<String> = values
                    .iter()
                    .map(|(k, v)| {
                        // JSON has no NaN or infinities: they are written as null.
                        let v = if v.is_finite() { v.to_string() } else { "null".into() };
                        format!("\"{k}\":{v}")
                    })
                    .collect();
                line.push('{');
                line.push_str(&fields.join(","));
                line.push('}');
            }
        }
        line.push('\n');
        let written = match self.file.as_mut() {
            Some(file) => file.write_all(line.as_bytes()).and_then(|_| file.flush()),
            None => Err(std::io::Error::other("written before training began")),
        };
        written.map_err(|e| self.io(e))?;
        Ok(Control::Continue)
    }
}

/// Draw each logged quantity's curve over the epochs — training in blue, evaluation in red —
/// as `<dir>/<name>.svg` (`loss.svg`, `acc_top1.svg`, …), rewritten after every epoch so
/// that the pictures follow a long run. Non-finite values are left out.
pub struct PlotCurves {
    dir: PathBuf,
    history: Vec<EpochLogs>,
}

impl PlotCurves {
    /// Plots in `dir` (created if missing).
    pub fn new(dir: impl AsRef<Path>) -> PlotCurves {
        PlotCurves {
            dir: dir.as_ref().to_path_buf(),
            history: Vec::new(),
        }
    }

    /// The file a quantity's curves go to.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.svg"))
    }

    fn draw(&self) -> Result<()> {
        let mut names: Vec<&String> = self
            .history
            .iter()
            .flat_map(|h| h.train.keys().chain(h.eval.keys()))
            .collect();
        names.sort();
        names.dedup();
        for name in names {
            let series = |eval: bool| -> Vec<(f64, f64)> {
                self.history
                    .iter()
                    .filter_map(|h| {
                        let v = if eval { h.eval.get(name) } else { h.train.get(name) }?;
                        v.is_finite().then_some((h.epoch as f64, *v))
                    })
                    .collect()
            };
            let (train, eval) = (series(false), series(true));
            let path = self.path(name);
            plot(&path, name, &train, &eval).map_err(|e| Error::Io {
                path: path.display().to_string(),
                detail: format!("drawing the `{name}` curves: {e}"),
            })?;
        }
        Ok(())
    }
}

/// One SVG: `train` (blue) and `eval` (red) against the epoch.
fn plot(path: &Path, name: &str, train: &[(f64, f64)], eval: &[(f64, f64)]) -> std::result::Result<(), String> {
    use plotters::prelude::*;
    let all = || train.iter().chain(eval);
    let (x0, x1) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if !x0.is_finite() {
        return Ok(());
    }
    // A single epoch or a flat curve still gets a visible range.
    let (x1, pad) = (x1.max(x0 + 1.0), ((y1 - y0) * 0.05).max(1e-6 * y1.abs().max(1.0)));
    let root = SVGBackend::new(path, (640, 400)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(name, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
        .map_err(|x| e(&x))?;
    chart.configure_mesh().x_desc("epoch").draw().map_err(|x| e(&x))?;
    for (points, color, label) in [(train, BLUE, "train"), (eval, RED, "eval")] {
        if points.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color))
            .map_err(|x| e(&x))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))
}

impl Callback for PlotCurves {
    fn on_train_begin(&mut self, _: &mut Model) -> Result<()> {
        self.history.clear();
        create_dir(&self.dir)
    }

    fn on_epoch_end(&mut self, _: &mut Model, logs: &EpochLogs) -> Result<Control> {
        self.history.push(logs.clone());
        self.draw()?;
        Ok(Control::Continue)
    }
}
