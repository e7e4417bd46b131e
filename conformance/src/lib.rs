//! The backend conformance suite: one set of cases — every op of the IR, fused patterns, and
//! whole models — that runs on any registered backend through the [`Backend`] trait and
//! compares each output with the reference backend (the oracle).
//!
//! ```no_run
//! use oar_conformance::{SuiteFilter, run_suite};
//! let backend = oar::backend::get("reference").unwrap();
//! let report = run_suite(&*backend, &SuiteFilter::default());
//! println!("{report}");
//! assert!(report.is_success());
//! ```
//!
//! - **Sections.** `ops`: every primitive op for every dtype it accepts (elementwise, casts,
//!   `where`, reductions over several axes with and without `keepdim`, movement, indexing,
//!   generators with seeds, matmul, convolution, control flow) and every composite;
//!   [`required_op_keys`] lists what must be covered and a test checks that every `Op` variant
//!   is. `patterns`: the shapes fusion meets (elementwise chains through broadcast, transpose,
//!   slice and reshape; softmax, layer norm and GELU from primitives; matmul + bias +
//!   activation; conv + batch norm + relu + residual; attention with `kᵀ`; reductions feeding
//!   elementwise ops). `models`: an MLP, LeNet, ResNet-18, MobileNetV2 and a Transformer
//!   encoder, traced with [`oar::jit`] in eval mode, at small sizes (full sizes with
//!   [`SuiteFilter::full`]).
//! - **Inputs.** Drawn from a fixed seed mixed with the case's name ([`SUITE_SEED`]), inside
//!   each op's domain (no log of negatives, no integer division by zero, no overflowing
//!   integer products); model weights likewise.
//! - **Tolerances** (stated per case, by output dtype unless the case overrides them; see
//!   [`Tolerance`]): `|got − want| ≤ atol + rtol·|want|` with f32 `rtol 1e-4, atol 1e-5`
//!   (the absolute floor covers values near zero), f64 `1e-9 / 1e-12`, f16 `2e-3 / 1e-4`
//!   (two ulps), bf16 `1.6e-2 / 1e-3`; integers and bools exactly. NaN matches NaN.
//! - **Runs.** Each case is compiled once and run twice on the backend (state leaking from one
//!   run into the next fails the case); the oracle runs it once.
//! - **Status** of a case: pass, fail (which output, where, max abs/rel error), error (the
//!   backend's message, including panics), or unsupported ([`BackendError::Unsupported`]).
//!   A report succeeds when nothing failed or errored; unsupported cases are listed, not
//!   counted against it.

mod build;
mod compare;
mod coverage;
mod kit;
mod models;
mod ops;
mod patterns;

pub use build::SUITE_SEED;
pub use coverage::{op_keys, required_op_keys};
pub use kit::kit_main;

use oar_ir::{Backend, BackendError, DType, Graph, TensorData, Weights};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Once};
use std::time::Instant;

/// The three parts of the suite, reported in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Section {
    /// One case per op, attribute set and dtype.
    Ops,
    /// Small graphs in the shapes fusion meets.
    Patterns,
    /// Whole models traced from `oar::nn` layers.
    Models,
}

impl Section {
    /// Every section, in report order.
    pub const ALL: [Section; 3] = [Section::Ops, Section::Patterns, Section::Models];

    /// `ops`, `patterns` or `models`.
    pub fn name(self) -> &'static str {
        match self {
            Section::Ops => "ops",
            Section::Patterns => "patterns",
            Section::Models => "models",
        }
    }
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Section {
    type Err = String;
    fn from_str(s: &str) -> Result<Section, String> {
        Section::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| format!("unknown section `{s}` (expected ops, patterns or models)"))
    }
}

/// How far a float output may be from the oracle's: `|got − want| ≤ atol + rtol·|want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Relative part.
    pub rtol: f64,
    /// Absolute floor (for values near zero).
    pub atol: f64,
}

impl Tolerance {
    /// f32: `rtol 1e-4`, absolute floor `1e-5`.
    pub const F32: Tolerance = Tolerance { rtol: 1e-4, atol: 1e-5 };
    /// f64: `rtol 1e-9`, absolute floor `1e-12`.
    pub const F64: Tolerance = Tolerance {
        rtol: 1e-9,
        atol: 1e-12,
    };
    /// f16: two ulps (`rtol 2e-3`), absolute floor `1e-4`.
    pub const F16: Tolerance = Tolerance { rtol: 2e-3, atol: 1e-4 };
    /// bf16: two ulps (`rtol 1.6e-2`), absolute floor `1e-3`.
    pub const BF16: Tolerance = Tolerance {
        rtol: 1.6e-2,
        atol: 1e-3,
    };

    /// The default for outputs of `dtype`; `None` (exact) for integers and bool.
    pub fn for_dtype(dtype: DType) -> Option<Tolerance> {
        match dtype {
            DType::F32 => Some(Tolerance::F32),
            DType::F64 => Some(Tolerance::F64),
            DType::F16 => Some(Tolerance::F16),
            DType::BF16 => Some(Tolerance::BF16),
            _ => None,
        }
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rtol {:e} atol {:e}", self.rtol, self.atol)
    }
}

/// What a case runs: a graph, its weights and its inputs.
#[derive(Clone, Debug)]
pub struct CaseData {
    /// The graph (outputs are compared in order).
    pub graph: Graph,
    /// Parameter values.
    pub weights: Weights,
    /// Input values by name.
    pub inputs: BTreeMap<String, TensorData>,
}

type BuildFn = dyn Fn() -> Result<CaseData, String> + Send + Sync;

/// One conformance case: a named, lazily built graph with inputs, and its tolerance.
#[derive(Clone)]
pub struct Case {
    section: Section,
    name: String,
    tolerance: Option<Tolerance>,
    build: Arc<BuildFn>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("section", &self.section)
            .field("name", &self.name)
            .field("tolerance", &self.tolerance)
            .finish_non_exhaustive()
    }
}

impl Case {
    /// A case built by `build` when it runs (so filtered-out cases cost nothing).
    pub fn new(
        section: Section,
        name: impl Into<String>,
        build: impl Fn() -> Result<CaseData, String> + Send + Sync + 'static,
    ) -> Case {
        Case {
            section,
            name: name.into(),
            tolerance: None,
            build: Arc::new(build),
        }
    }

    /// A case whose graph is built with a [`build::Builder`] seeded from its name.
    pub(crate) fn built(
        section: Section,
        name: impl Into<String>,
        f: impl Fn(&mut build::Builder) -> build::R<()> + Send + Sync + 'static,
    ) -> Case {
        let name = name.into();
        let seed_name = format!("{section}/{name}");
        Case::new(section, name, move || {
            let mut b = build::Builder::new(&seed_name);
            f(&mut b)?;
            Ok(b.finish())
        })
    }

    /// Use `t` for every float output instead of the per-dtype default.
    pub fn with_tolerance(mut self, t: Tolerance) -> Case {
        self.tolerance = Some(t);
        self
    }

    /// The section.
    pub fn section(&self) -> Section {
        self.section
    }

    /// The name within its section (`unary/exp/f32`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `section/name`, what filters match.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.section, self.name)
    }

    /// The tolerance for a float output of `dtype` (`None`: compared exactly).
    pub fn tolerance(&self, dtype: DType) -> Option<Tolerance> {
        if !dtype.is_float() {
            return None;
        }
        self.tolerance.or_else(|| Tolerance::for_dtype(dtype))
    }

    /// The tolerance override, if the case states one.
    pub fn tolerance_override(&self) -> Option<Tolerance> {
        self.tolerance
    }

    /// Build the graph, weights and inputs.
    pub fn build(&self) -> Result<CaseData, String> {
        catch(|| (self.build)()).and_then(|r| r)
    }
}

/// Which cases to run.
#[derive(Clone, Debug, Default)]
pub struct SuiteFilter {
    /// Only this section.
    pub section: Option<Section>,
    /// Only cases whose `section/name` contains this.
    pub substring: Option<String>,
    /// Include the full-size model variants (slow on the reference backend).
    pub full: bool,
}

impl SuiteFilter {
    /// Everything at the default sizes.
    pub fn all() -> SuiteFilter {
        SuiteFilter::default()
    }

    /// Only `section`.
    pub fn section(section: Section) -> SuiteFilter {
        SuiteFilter {
            section: Some(section),
            ..SuiteFilter::default()
        }
    }

    /// Only cases whose `section/name` contains `substring`.
    pub fn matching(substring: &str) -> SuiteFilter {
        SuiteFilter {
            substring: Some(substring.to_string()),
            ..SuiteFilter::default()
        }
    }

    /// True if `case` is selected.
    pub fn matches(&self, case: &Case) -> bool {
        self.section.is_none_or(|s| s == case.section)
            && self
                .substring
                .as_deref()
                .is_none_or(|sub| case.full_name().contains(sub))
    }
}

/// A set of cases.
#[derive(Clone, Debug, Default)]
pub struct Suite {
    cases: Vec<Case>,
}

impl Suite {
    /// A suite of these cases.
    pub fn new(cases: Vec<Case>) -> Suite {
        Suite { cases }
    }

    /// oar's suite: ops, patterns and models (`full`: plus the full-size models).
    pub fn builtin(full: bool) -> Suite {
        let mut cases = ops::cases();
        cases.extend(patterns::cases());
        cases.extend(models::cases(full));
        Suite { cases }
    }

    /// Add a case.
    pub fn push(&mut self, case: Case) {
        self.cases.push(case);
    }

    /// Every case.
    pub fn cases(&self) -> &[Case] {
        &self.cases
    }

    /// Op coverage: the [`op_keys`] of every op (regions included) in the graphs of the cases
    /// `filter` selects, with how many cases use each.
    pub fn coverage(&self, filter: &SuiteFilter) -> Result<BTreeMap<String, usize>, String> {
        let mut out = BTreeMap::new();
        for c in self.cases.iter().filter(|c| filter.matches(c)) {
            let data = c.build().map_err(|e| format!("{}: {e}", c.full_name()))?;
            let mut keys = BTreeSet::new();
            coverage::collect(&data.graph, &mut keys);
            for k in keys {
                *out.entry(k).or_insert(0) += 1;
            }
        }
        Ok(out)
    }

    /// Required op keys no selected case covers (empty when coverage is complete).
    pub fn missing_ops(&self, filter: &SuiteFilter) -> Result<Vec<String>, String> {
        let cov = self.coverage(filter)?;
        Ok(required_op_keys()
            .into_iter()
            .filter(|k| !cov.contains_key(k))
            .collect())
    }

    /// Run the selected cases on `backend` and compare with the reference backend.
    pub fn run(&self, backend: &dyn Backend, filter: &SuiteFilter) -> SuiteReport {
        self.run_against(backend, &oar_backend_reference::ReferenceBackend::new(), filter)
    }

    /// Run the selected cases on `backend` and compare with `oracle`.
    pub fn run_against(&self, backend: &dyn Backend, oracle: &dyn Backend, filter: &SuiteFilter) -> SuiteReport {
        self.run_with(backend, oracle, filter, &mut |_| {})
    }

    /// [`Suite::run_against`], calling `progress` after each case (for live output).
    pub fn run_with(
        &self,
        backend: &dyn Backend,
        oracle: &dyn Backend,
        filter: &SuiteFilter,
        progress: &mut dyn FnMut(&CaseResult),
    ) -> SuiteReport {
        let results = self
            .cases
            .iter()
            .filter(|c| filter.matches(c))
            .map(|c| {
                let r = run_case(c, backend, oracle);
                progress(&r);
                r
            })
            .collect();
        SuiteReport {
            backend: backend.name().to_string(),
            oracle: oracle.name().to_string(),
            results,
        }
    }
}

/// Run oar's suite ([`Suite::builtin`], full-size models if `filter.full`) on `backend`
/// against the reference backend.
pub fn run_suite(backend: &dyn Backend, filter: &SuiteFilter) -> SuiteReport {
    Suite::builtin(filter.full).run(backend, filter)
}

/// Why a case failed: which output, and how far off.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The output's name (`-` when the outputs' count differs).
    pub output: String,
    /// Where and how (the worst element, how many are off, the tolerance).
    pub detail: String,
    /// Largest absolute error of that output.
    pub max_abs: f64,
    /// Largest relative error of that output (over elements above the absolute floor).
    pub max_rel: f64,
}

/// The outcome of one case.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// Every output matches; the largest errors seen.
    Pass {
        /// Largest absolute error.
        max_abs: f64,
        /// Largest relative error.
        max_rel: f64,
    },
    /// An output differs.
    Fail(Mismatch),
    /// Compiling or running failed (or the case itself could not be built or run by the
    /// oracle; the message says which).
    Error(String),
    /// The backend does not support an op of the case.
    Unsupported(String),
}

impl Status {
    /// `pass`, `FAIL`, `ERROR` or `unsupported`.
    pub fn label(&self) -> &'static str {
        match self {
            Status::Pass { .. } => "pass",
            Status::Fail(_) => "FAIL",
            Status::Error(_) => "ERROR",
            Status::Unsupported(_) => "unsupported",
        }
    }

    /// True for pass.
    pub fn is_pass(&self) -> bool {
        matches!(self, Status::Pass { .. })
    }

    /// True for fail and error (what makes a report unsuccessful).
    pub fn is_failure(&self) -> bool {
        matches!(self, Status::Fail(_) | Status::Error(_))
    }
}

/// One row of the report.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// The case's section.
    pub section: Section,
    /// The case's name.
    pub name: String,
    /// What happened.
    pub status: Status,
    /// The tolerance override the case states, if any (else per-dtype defaults).
    pub tolerance: Option<Tolerance>,
    /// Seconds the backend spent compiling and running (twice).
    pub seconds: f64,
}

impl CaseResult {
    /// `section/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.section, self.name)
    }
}

/// Counts of each status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Passed.
    pub pass: usize,
    /// Failed (wrong values).
    pub fail: usize,
    /// Errored.
    pub error: usize,
    /// Unsupported.
    pub unsupported: usize,
}

impl Counts {
    /// Total cases.
    pub fn total(&self) -> usize {
        self.pass + self.fail + self.error + self.unsupported
    }

    fn add(&mut self, s: &Status) {
        match s {
            Status::Pass { .. } => self.pass += 1,
            Status::Fail(_) => self.fail += 1,
            Status::Error(_) => self.error += 1,
            Status::Unsupported(_) => self.unsupported += 1,
        }
    }
}

/// The result of a suite run: one row per case, printed as a table grouped by section with
/// totals.
#[derive(Clone, Debug)]
pub struct SuiteReport {
    /// The backend tested.
    pub backend: String,
    /// The oracle it was compared with.
    pub oracle: String,
    /// One result per case, in suite order.
    pub results: Vec<CaseResult>,
}

impl SuiteReport {
    /// Counts for one section (`None`: all).
    pub fn counts(&self, section: Option<Section>) -> Counts {
        let mut c = Counts::default();
        for r in self.results.iter().filter(|r| section.is_none_or(|s| s == r.section)) {
            c.add(&r.status);
        }
        c
    }

    /// True when no case failed or errored.
    pub fn is_success(&self) -> bool {
        !self.results.iter().any(|r| r.status.is_failure())
    }

    /// The result of the case called `section/name`.
    pub fn get(&self, full_name: &str) -> Option<&CaseResult> {
        self.results.iter().find(|r| r.full_name() == full_name)
    }

    /// Results that are not passes.
    pub fn not_passed(&self) -> impl Iterator<Item = &CaseResult> {
        self.results.iter().filter(|r| !r.status.is_pass())
    }

    /// Check the report against a backend's allow-list of `(case, reason)` entries: an error
    /// (the totals, every case that did not pass and is not allowed, and every allowed entry
    /// that now passes or no longer exists) unless both lists are empty.
    pub fn check_allowed(&self, allowed: &[(&str, &str)]) -> Result<(), String> {
        let unexpected: Vec<String> = self
            .not_passed()
            .filter(|r| !allowed.iter().any(|(n, _)| *n == r.full_name()))
            .map(|r| format!("  {} [{}]: {:?}", r.full_name(), r.status.label(), r.status))
            .collect();
        let stale: Vec<&str> = allowed
            .iter()
            .filter(|(n, _)| self.get(n).is_none_or(|r| r.status.is_pass()))
            .map(|(n, _)| *n)
            .collect();
        if unexpected.is_empty() && stale.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{}\ncases that did not pass ({}):\n{}\nallowed entries that now pass or no longer exist: {stale:?}",
            self.summary(),
            unexpected.len(),
            unexpected.join("\n")
        ))
    }

    /// Only the totals table.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        self.write_totals(&mut out).expect("writing to a String");
        out
    }

    fn write_totals(&self, f: &mut impl fmt::Write) -> fmt::Result {
        writeln!(
            f,
            "{:<10} {:>6} {:>6} {:>6} {:>6} {:>11}",
            "totals", "cases", "pass", "fail", "error", "unsupported"
        )?;
        let row = |f: &mut dyn fmt::Write, label: &str, c: Counts| {
            writeln!(
                f,
                "{label:<10} {:>6} {:>6} {:>6} {:>6} {:>11}",
                c.total(),
                c.pass,
                c.fail,
                c.error,
                c.unsupported
            )
        };
        for s in Section::ALL {
            let c = self.counts(Some(s));
            if c.total() > 0 {
                row(f, s.name(), c)?;
            }
        }
        row(f, "all", self.counts(None))?;
        let c = self.counts(None);
        if self.is_success() {
            writeln!(
                f,
                "OK: backend `{}` matches `{}` on {} of {} cases ({} unsupported)",
                self.backend,
                self.oracle,
                c.pass,
                c.total(),
                c.unsupported
            )
        } else {
            writeln!(
                f,
                "FAILED: {} failed and {} errored of {} cases on backend `{}`",
                c.fail,
                c.error,
                c.total(),
                self.backend
            )
        }
    }
}

fn sci(x: f64) -> String {
    if x == 0.0 { "0".into() } else { format!("{x:.1e}") }
}

impl SuiteReport {
    /// The table: one row per case (only the cases that did not pass if `not_passed_only`),
    /// grouped by section, then the totals.
    pub fn table(&self, not_passed_only: bool) -> String {
        let mut out = String::new();
        self.write_table(&mut out, not_passed_only)
            .expect("writing to a String");
        out
    }

    fn write_table(&self, f: &mut impl fmt::Write, not_passed_only: bool) -> fmt::Result {
        writeln!(f, "conformance: backend `{}` against `{}`", self.backend, self.oracle)?;
        writeln!(
            f,
            "tolerance |got - want| <= atol + rtol*|want|: f32 {}, f64 {}, f16 {}, bf16 {}; \
             integers and bools exact; a case's own tolerance is shown in its row",
            Tolerance::F32,
            Tolerance::F64,
            Tolerance::F16,
            Tolerance::BF16
        )?;
        let width = self.results.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
        for s in Section::ALL {
            let all = self.results.iter().filter(|r| r.section == s).count();
            let rows: Vec<&CaseResult> = self
                .results
                .iter()
                .filter(|r| r.section == s && !(not_passed_only && r.status.is_pass()))
                .collect();
            if all == 0 {
                continue;
            }
            writeln!(f, "\n== {s} ({all} cases) ==")?;
            if rows.is_empty() {
                writeln!(f, "  (all passed)")?;
                continue;
            }
            writeln!(
                f,
                "  {:<width$}  {:<11} {:>8} {:>8} {:>8}  detail",
                "case", "status", "max abs", "max rel", "ms"
            )?;
            for r in rows {
                let (abs, rel, detail) = match &r.status {
                    Status::Pass { max_abs, max_rel } => (sci(*max_abs), sci(*max_rel), String::new()),
                    Status::Fail(m) => (sci(m.max_abs), sci(m.max_rel), m.detail.clone()),
                    Status::Error(e) | Status::Unsupported(e) => ("-".into(), "-".into(), e.clone()),
                };
                let detail = match (&r.tolerance, detail.is_empty()) {
                    (Some(t), true) => format!("({t})"),
                    _ => detail.replace('\n', " "),
                };
                writeln!(
                    f,
                    "  {:<width$}  {:<11} {:>8} {:>8} {:>8.1}  {detail}",
                    r.name,
                    r.status.label(),
                    abs,
                    rel,
                    r.seconds * 1e3
                )?;
            }
        }
        writeln!(f)?;
        self.write_totals(f)
    }
}

impl fmt::Display for SuiteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_table(f, false)
    }
}

thread_local! {
    /// True while this thread runs backend code under [`catch`]: panics are recorded, not printed.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    /// The last panic recorded while quiet (message and location).
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Install (once) a panic hook that records panics of threads inside [`catch`] instead of
/// printing them, and hands every other panic to the hook that was there before.
fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                LAST_PANIC.with(|l| *l.borrow_mut() = Some(info.to_string().replace('\n', " ")));
            } else {
                previous(info);
            }
        }));
    });
}

/// Run `f`, turning a panic into an error message (with its location) without printing it.
fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_quiet_hook();
    let was_quiet = QUIET.with(|q| q.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was_quiet));
    result.map_err(|p| {
        LAST_PANIC.with(|l| l.borrow_mut().take()).unwrap_or_else(|| {
            let msg = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            format!("panicked: {msg}")
        })
    })
}

/// Compile `data` on `backend` and run it `runs` times (the same executable each time).
fn execute(backend: &dyn Backend, data: &CaseData, runs: usize) -> Result<Vec<Vec<(String, TensorData)>>, Status> {
    let status = |stage: &str, e: BackendError| match e {
        BackendError::Unsupported { .. } => Status::Unsupported(e.to_string()),
        e => Status::Error(format!("{stage}: {e}")),
    };
    let exe = catch(|| backend.compile(&data.graph, &data.weights))
        .map_err(|p| Status::Error(format!("compile: {p}")))?
        .map_err(|e| status("compile", e))?;
    (0..runs)
        .map(|_| {
            catch(|| exe.run(&data.inputs))
                .map_err(|p| Status::Error(format!("run: {p}")))?
                .map_err(|e| status("run", e))
        })
        .collect()
}

fn run_case(case: &Case, backend: &dyn Backend, oracle: &dyn Backend) -> CaseResult {
    let mut seconds = 0.0;
    let status = (|| {
        let data = case
            .build()
            .map_err(|e| Status::Error(format!("building the case: {e}")))?;
        let want = execute(oracle, &data, 1)
            .map_err(|s| {
                Status::Error(format!(
                    "oracle `{}`: {}",
                    oracle.name(),
                    match s {
                        Status::Error(e) | Status::Unsupported(e) => e,
                        other => format!("{other:?}"),
                    }
                ))
            })?
            .remove(0);
        // Two runs of one executable: state left over from the first run (an accumulator not
        // reset, a buffer reused too early) shows up in the second.
        let start = Instant::now();
        let got = execute(backend, &data, 2);
        seconds = start.elapsed().as_secs_f64();
        let tol = |d| case.tolerance(d);
        let mut status = Status::Pass {
            max_abs: 0.0,
            max_rel: 0.0,
        };
        for (run, got) in got?.iter().enumerate() {
            status = match compare::compare(got, &want, &tol) {
                Status::Fail(mut m) if run > 0 => {
                    m.detail = format!("second run of the same executable: {}", m.detail);
                    return Ok(Status::Fail(m));
                }
                Status::Pass { .. } if run > 0 => status,
                s => s,
            };
            if !status.is_pass() {
                break;
            }
        }
        Ok(status)
    })()
    .unwrap_or_else(|s: Status| s);
    CaseResult {
        section: case.section,
        name: case.name.clone(),
        status,
        tolerance: case.tolerance,
        seconds,
    }
}
