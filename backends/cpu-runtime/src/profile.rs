//! Per-kernel wall times of compiled CPU programs, for finding where a model's time goes:
//! with `OAR_CPU_PROFILE=1` every step a [`crate::Model`] runs is timed and summed by kernel
//! (its name, how it runs and its output's shape); [`take`] returns the table, most time first.
//! Off (the default) it costs one cached check per step.

use crate::program::Step;
use oar_ir::kernel::{Kernel, KernelBody, KernelProgram};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// One kernel's runs.
#[derive(Clone, Debug)]
pub struct Row {
    /// The kernel's name, how it runs (`loop`, `rows`, `contraction: conv`, `native: pad`,
    /// `interpreted`) and its first output's shape.
    pub kernel: String,
    /// Runs.
    pub calls: u64,
    /// Total wall time (an interpreted step's is not included: the runner interprets it after
    /// the step returns).
    pub total: Duration,
}

/// Whether `OAR_CPU_PROFILE=1` (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("OAR_CPU_PROFILE").is_ok_and(|v| v == "1"))
}

fn table() -> &'static Mutex<BTreeMap<String, Row>> {
    static T: OnceLock<Mutex<BTreeMap<String, Row>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

pub(crate) fn record(p: &KernelProgram, k: &Kernel, step: &Step, t: Duration) {
    let how = match (step, &k.body) {
        (Step::Loop { .. }, _) => "loop".to_string(),
        (Step::Rows { .. }, _) => "rows".to_string(),
        (Step::Contraction { epilogue, .. }, KernelBody::Contraction(c)) => {
            let op = format!("{:?}", c.op);
            let name: String = op.chars().take_while(|c| c.is_alphanumeric()).collect();
            format!(
                "contraction: {}{}",
                name.to_lowercase(),
                if epilogue.is_some() { " + epilogue" } else { "" }
            )
        }
        (Step::Contraction { .. }, _) => "contraction".to_string(),
        (Step::Native { epilogue, .. }, KernelBody::Opaque(o)) => format!(
            "native: {}{}",
            o.op.name(),
            if epilogue.is_some() { " + epilogue" } else { "" }
        ),
        (Step::Native { .. }, _) => "native".to_string(),
        (Step::Fused { .. }, _) => "fused".to_string(),
        (Step::Control { .. }, _) => "control".to_string(),
        (Step::Fail { .. }, _) => "fail".to_string(),
        (Step::Interpret { .. }, KernelBody::Opaque(o)) => format!("interpreted: {}", o.op.name()),
        (Step::Interpret { .. }, _) => "interpreted".to_string(),
    };
    let shape = k
        .outputs
        .first()
        .map(|&b| p.buffer(b).ty.shape.to_string())
        .unwrap_or_default();
    let kernel = format!("{} ({how}) {shape}", k.name);
    let mut table = table().lock().unwrap_or_else(|e| e.into_inner());
    let row = table.entry(kernel.clone()).or_insert(Row {
        kernel,
        calls: 0,
        total: Duration::ZERO,
    });
    row.calls += 1;
    row.total += t;
}

/// The rows recorded so far, most time first, and clears them.
pub fn take() -> Vec<Row> {
    let mut rows: Vec<Row> = std::mem::take(&mut *table().lock().unwrap_or_else(|e| e.into_inner()))
        .into_values()
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.total));
    rows
}

/// [`take`] as a text table: share of the total, milliseconds per call, calls, kernel.
pub fn report() -> String {
    let rows = take();
    let total: Duration = rows.iter().map(|r| r.total).sum();
    let mut out = format!("{:>6} {:>10} {:>7}  kernel\n", "share", "ms/call", "calls");
    for r in &rows {
        out += &format!(
            "{:>5.1}% {:>10.4} {:>7}  {}\n",
            100.0 * r.total.as_secs_f64() / total.as_secs_f64().max(1e-12),
            1e3 * r.total.as_secs_f64() / r.calls.max(1) as f64,
            r.calls,
            r.kernel
        );
    }
    out
}
