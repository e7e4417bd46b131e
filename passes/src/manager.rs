//! The pass manager: runs a pipeline with verification, IR printing, timing and stop-after.

use crate::check_numerics::{Checker, Mismatch, NumericsCheck};
use crate::{Pass, PassError, pass_by_name, registry::list_passes};
use oar_ir::{Float, Graph};
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Receives the graph around a pass: `(pass name, "before" | "after", graph)`.
pub type IrSink = Box<dyn FnMut(&str, &str, &Graph)>;

/// Which passes the graph is printed around.
#[derive(Clone, Debug, Default)]
enum PrintSelect {
    #[default]
    None,
    All,
    Named(BTreeSet<String>),
}

impl PrintSelect {
    fn wants(&self, pass: &str) -> bool {
        match self {
            PrintSelect::None => false,
            PrintSelect::All => true,
            PrintSelect::Named(names) => names.contains(pass),
        }
    }

    fn add(&mut self, pass: &str) {
        match self {
            PrintSelect::All => {}
            PrintSelect::Named(names) => {
                names.insert(pass.to_string());
            }
            PrintSelect::None => *self = PrintSelect::Named(BTreeSet::from([pass.to_string()])),
        }
    }
}

/// What one pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassRecord {
    /// The pass's name.
    pub name: &'static str,
    /// Whether it changed the graph.
    pub changed: bool,
    /// Wall time of the pass (verification and printing excluded).
    pub duration: Duration,
    /// Nodes before the pass, regions included.
    pub nodes_before: usize,
    /// Nodes after the pass, regions included.
    pub nodes_after: usize,
}

/// What a pipeline run did, pass by pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// One record per pass that ran, in order.
    pub records: Vec<PassRecord>,
    /// Set when `stop_after` cut the pipeline short: how many passes ran.
    pub stopped_after: Option<usize>,
}

impl PassReport {
    /// True if any pass changed the graph.
    pub fn changed(&self) -> bool {
        self.records.iter().any(|r| r.changed)
    }

    /// Total time spent in passes.
    pub fn total_duration(&self) -> Duration {
        self.records.iter().map(|r| r.duration).sum()
    }
}

impl fmt::Display for PassReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:>3}  {:<20} {:>7} {:>8} {:>8} {:>12}",
            "#", "pass", "changed", "before", "after", "time"
        )?;
        for (i, r) in self.records.iter().enumerate() {
            writeln!(
                f,
                "{:>3}  {:<20} {:>7} {:>8} {:>8} {:>12?}",
                i + 1,
                r.name,
                if r.changed { "yes" } else { "no" },
                r.nodes_before,
                r.nodes_after,
                r.duration
            )?;
        }
        if let Some(n) = self.stopped_after {
            writeln!(f, "stopped after pass {n}")?;
        }
        write!(f, "total {:?}", self.total_duration())
    }
}

/// Nodes of `graph` and of all its regions, recursively.
pub fn count_nodes(graph: &Graph) -> usize {
    graph
        .node_ids()
        .map(|n| 1 + graph.node(n).regions.iter().map(count_nodes).sum::<usize>())
        .sum()
}

/// Runs passes in order, with the observability options of MLIR's pass manager.
#[derive(Default)]
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    verify_each: bool,
    print_before: PrintSelect,
    print_after: PrintSelect,
    sink: Option<IrSink>,
    stop_after: Option<usize>,
    dump_dir: Option<PathBuf>,
    numerics: Option<NumericsCheck>,
}

impl PassManager {
    /// An empty pipeline with every option off.
    pub fn new() -> PassManager {
        PassManager::default()
    }

    /// A pipeline of registered passes, by name (default configurations).
    pub fn from_names(names: &[&str]) -> Result<PassManager, PassError> {
        let mut pm = PassManager::new();
        for name in names {
            let pass = pass_by_name(name).ok_or_else(|| PassError::UnknownPass {
                name: name.to_string(),
                known: list_passes().iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            })?;
            pm.add_boxed(pass);
        }
        Ok(pm)
    }

    /// Append a pass.
    pub fn add(&mut self, pass: impl Pass + 'static) -> &mut Self {
        self.add_boxed(Box::new(pass))
    }

    /// Append a boxed pass (from [`pass_by_name`]).
    pub fn add_boxed(&mut self, pass: Box<dyn Pass>) -> &mut Self {
        self.passes.push(pass);
        self
    }

    /// The pipeline's pass names, in order.
    pub fn pass_names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Verify the input graph and the graph after each pass; a failure names the pass.
    pub fn verify_each(&mut self, on: bool) -> &mut Self {
        self.verify_each = on;
        self
    }

    /// Print the graph before every pass.
    pub fn print_before_all(&mut self) -> &mut Self {
        self.print_before = PrintSelect::All;
        self
    }

    /// Print the graph after every pass.
    pub fn print_after_all(&mut self) -> &mut Self {
        self.print_after = PrintSelect::All;
        self
    }

    /// Print the graph before each run of the pass named `pass`.
    pub fn print_before(&mut self, pass: &str) -> &mut Self {
        self.print_before.add(pass);
        self
    }

    /// Print the graph after each run of the pass named `pass`.
    pub fn print_after(&mut self, pass: &str) -> &mut Self {
        self.print_after.add(pass);
        self
    }

    /// Where printed graphs go (the caller renders them, e.g. with the text printer).
    pub fn ir_sink(&mut self, sink: IrSink) -> &mut Self {
        self.sink = Some(sink);
        self
    }

    /// Run only the first `n` passes (bisecting a bad rewrite by pass number).
    pub fn stop_after(&mut self, n: usize) -> &mut Self {
        self.stop_after = Some(n);
        self
    }

    /// Print graphs around the selected passes as IR text ([`oar_ir::text::print_graph`]), each
    /// under a `// ----- IR after <pass> -----` header, to `out`.
    pub fn ir_text_sink(&mut self, mut out: impl FnMut(&str) + 'static) -> &mut Self {
        self.ir_sink(Box::new(move |pass, when, graph| {
            out(&format!(
                "// ----- IR {when} {pass} -----\n{}",
                oar_ir::text::print_graph(graph)
            ))
        }))
    }

    /// Print graphs around the selected passes as IR text to standard error.
    pub fn print_ir_to_stderr(&mut self) -> &mut Self {
        self.ir_text_sink(|text| eprint!("{text}"))
    }

    /// Write the IR text of the input and of the graph after each pass to numbered files in
    /// `dir` (`00-input.oir`, `01-canonicalize.oir`, ...); the directory is created if needed.
    pub fn dump_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.dump_dir = Some(dir.into());
        self
    }

    /// Check the numerics after every pass against the input graph on the reference backend;
    /// the first pass that changes them fails the run with [`PassError::Numerics`].
    pub fn check_numerics(&mut self, check: NumericsCheck) -> &mut Self {
        self.numerics = Some(check);
        self
    }

    fn dump(&self, index: usize, label: &str, graph: &Graph) -> Result<(), PassError> {
        let Some(dir) = &self.dump_dir else { return Ok(()) };
        let path = dir.join(format!("{index:02}-{label}.oir"));
        let fail = |path: &Path, e: std::io::Error| PassError::Dump {
            path: path.display().to_string(),
            detail: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(|e| fail(dir, e))?;
        oar_ir::file::write_atomically(&path, oar_ir::text::print_graph(graph).as_bytes()).map_err(|e| fail(&path, e))
    }

    fn emit(&mut self, pass: &str, when: &str, graph: &Graph) {
        let wanted = match when {
            "before" => self.print_before.wants(pass),
            _ => self.print_after.wants(pass),
        };
        if let (true, Some(sink)) = (wanted, self.sink.as_mut()) {
            sink(pass, when, graph);
        }
    }

    /// Run the pipeline on `graph`.
    pub fn run(&mut self, graph: &mut Graph) -> Result<PassReport, PassError> {
        if self.verify_each {
            oar_ir::verify(graph).map_err(|source| PassError::Verify {
                pass: "<input>".into(),
                source,
            })?;
        }
        self.dump(0, "input", graph)?;
        let checker = match &self.numerics {
            Some(cfg) => Some(Checker::new(cfg, graph).map_err(|detail| PassError::NumericsSetup { detail })?),
            None => None,
        };
        let mut report = PassReport::default();
        let passes = std::mem::take(&mut self.passes);
        let result = self.run_passes(&passes, graph, &mut report, checker.as_ref());
        self.passes = passes;
        result.map(|()| report)
    }

    fn run_passes(
        &mut self,
        passes: &[Box<dyn Pass>],
        graph: &mut Graph,
        report: &mut PassReport,
        checker: Option<&Checker>,
    ) -> Result<(), PassError> {
        for (i, pass) in passes.iter().enumerate() {
            if self.stop_after.is_some_and(|n| i >= n) {
                report.stopped_after = Some(i);
                break;
            }
            let name = pass.name();
            self.emit(name, "before", graph);
            let nodes_before = count_nodes(graph);
            let before = checker.map(|_| graph.clone());
            let start = Instant::now();
            let (changed, steps) = match checker {
                Some(_) => {
                    let run = pass.run_steps(graph, None)?;
                    (run.changed, run.steps)
                }
                None => (pass.run(graph)?, None),
            };
            let duration = start.elapsed();
            report.records.push(PassRecord {
                name,
                changed,
                duration,
                nodes_before,
                nodes_after: count_nodes(graph),
            });
            if self.verify_each {
                oar_ir::verify(graph).map_err(|source| PassError::Verify {
                    pass: name.to_string(),
                    source,
                })?;
            }
            self.emit(name, "after", graph);
            self.dump(i + 1, name, graph)?;
            if let (Some(checker), Some(before)) = (checker, before) {
                check_pass(checker, pass.as_ref(), i + 1, &before, graph, steps)?;
            }
        }
        Ok(())
    }
}

/// Compare `after` (what `pass` made of `before`) with the baseline; on a difference, find the
/// smallest step count of the pass that already differs (passes that count steps only).
fn check_pass(
    checker: &Checker,
    pass: &dyn Pass,
    index: usize,
    before: &Graph,
    after: &Graph,
    steps: Option<usize>,
) -> Result<(), PassError> {
    let setup = |detail: String| PassError::NumericsSetup {
        detail: format!("after pass `{}` (#{index}): {detail}", pass.name()),
    };
    let Some(mismatch) = checker.compare(after).map_err(setup)? else {
        return Ok(());
    };
    let mut guilty: (Option<usize>, Mismatch) = (steps, mismatch);
    if let Some(n) = steps.filter(|&n| n > 0) {
        // Invariant: running `hi` steps differs; fewer than `lo` steps do not.
        let (mut lo, mut hi) = (1, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let mut g = before.clone();
            pass.run_steps(&mut g, Some(mid))?;
            match checker.compare(&g).map_err(setup)? {
                Some(m) => {
                    hi = mid;
                    guilty = (Some(mid), m);
                }
                None => lo = mid + 1,
            }
        }
        guilty.0 = Some(hi);
    }
    let (step, m) = guilty;
    Err(PassError::Numerics {
        pass: pass.name().to_string(),
        index,
        step,
        output: m.output,
        max_abs_err: Float(m.max_abs_err),
        detail: m.detail,
    })
}
