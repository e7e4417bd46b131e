//! The conformance harness proves itself: the reference backend passes its own suite; a
//! backend that perturbs one op fails exactly the case of that op; unsupported ops, errors and
//! panics are reported as such; and every `Op` variant, every unary/binary/reduce/arg-reduce op
//! and every composite has a case.

use oar::ir::ops::{ArgReduce, Random, Reduce, Scatter};
use oar::ir::ops::{ArgReduceOp, BinaryOp, ReduceOp, ScatterReduce, UnaryOp};
use oar::ir::{Backend, BackendError, DType, Executable, Graph, Op, ValueId, Weights};
use oar::reference::ReferenceBackend;
use oar_conformance::{Section, Status, Suite, SuiteFilter, required_op_keys, run_suite};
use std::collections::BTreeSet;

#[test]
fn reference_passes_its_own_suite() {
    let report = run_suite(&ReferenceBackend::new(), &SuiteFilter::all());
    println!("{report}");
    for s in Section::ALL {
        assert!(report.counts(Some(s)).total() > 0, "section {s} is empty");
    }
    let bad: Vec<String> = report
        .not_passed()
        .map(|r| format!("{}: {:?}", r.full_name(), r.status))
        .collect();
    assert!(
        bad.is_empty(),
        "the reference backend must pass its own suite:\n{}",
        bad.join("\n")
    );
    assert!(report.is_success());
    // Against itself every error is exactly zero.
    for r in &report.results {
        assert_eq!(
            r.status,
            Status::Pass {
                max_abs: 0.0,
                max_rel: 0.0
            },
            "{}",
            r.full_name()
        );
    }
}

/// The reference backend with every f64 `erf` multiplied by `1 + 1e-3`.
struct PerturbErfF64;

fn perturb(g: &mut Graph) {
    let targets: Vec<ValueId> = g
        .node_ids()
        .filter(|&id| {
            let n = g.node(id);
            n.op == Op::Unary(UnaryOp::Erf) && n.outputs()[0].dtype == DType::F64
        })
        .map(ValueId::first)
        .collect();
    for v in targets {
        let k = g.add_scalar(DType::F64, 1.0 + 1e-3);
        let p = g.binary(BinaryOp::Mul, v, k).unwrap();
        g.replace_all_uses(v, p).unwrap();
        // replace_all_uses also rewired the new node's own operand: point it back.
        g.set_operand(p.node, 0, v).unwrap();
    }
}

impl Backend for PerturbErfF64 {
    fn name(&self) -> &str {
        "perturbed"
    }
    fn description(&self) -> &str {
        "reference with a wrong f64 erf"
    }
    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        let mut g = graph.clone();
        perturb(&mut g);
        ReferenceBackend::new().compile(&g, weights)
    }
}

#[test]
fn a_perturbed_op_fails_exactly_its_case() {
    // Models have no f64 ops; ops and patterns hold every f64 case.
    let mut failed = Vec::new();
    for s in [Section::Ops, Section::Patterns] {
        let report = run_suite(&PerturbErfF64, &SuiteFilter::section(s));
        assert_eq!(report.counts(None).error, 0, "{}", report.table(true));
        failed.extend(report.not_passed().map(|r| (r.full_name(), r.status.clone())));
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (name, status) = &failed[0];
    assert_eq!(name, "ops/unary/erf/f64");
    match status {
        Status::Fail(m) => {
            assert_eq!(m.output, "y0");
            // erf(x)·1e-3 relative: far above f64's 1e-9.
            assert!(m.max_rel > 9e-4 && m.max_rel < 1.1e-3, "{m:?}");
            assert!(m.detail.contains("rtol 1e-9"), "{}", m.detail);
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// Returns a wrong first element from the second run of each executable on.
struct Stateful;

struct StatefulExe {
    inner: Box<dyn Executable>,
    runs: std::sync::atomic::AtomicUsize,
}

impl Executable for StatefulExe {
    fn run(
        &self,
        inputs: &std::collections::BTreeMap<String, oar::ir::TensorData>,
    ) -> Result<Vec<(String, oar::ir::TensorData)>, BackendError> {
        let mut out = self.inner.run(inputs)?;
        if self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            let (_, t) = &mut out[0];
            let mut v = t.to_f64_vec();
            v[0] += 1.0;
            *t = oar::ir::TensorData::from_f64_slice(t.dtype(), t.shape().to_vec(), &v).unwrap();
        }
        Ok(out)
    }
}

impl Backend for Stateful {
    fn name(&self) -> &str {
        "stateful"
    }
    fn description(&self) -> &str {
        "wrong from the second run on"
    }
    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        Ok(Box::new(StatefulExe {
            inner: ReferenceBackend::new().compile(graph, weights)?,
            runs: Default::default(),
        }))
    }
}

#[test]
fn state_leaking_into_a_second_run_fails() {
    let report = run_suite(&Stateful, &SuiteFilter::matching("ops/unary/exp/f64"));
    assert_eq!(report.results.len(), 1);
    for r in &report.results {
        match &r.status {
            Status::Fail(m) => assert!(
                m.detail.starts_with("second run of the same executable: `y0`[0"),
                "{}",
                m.detail
            ),
            other => panic!("{}: {other:?}", r.full_name()),
        }
    }
}

/// Refuses `while` (unsupported), fails to run `cond` (an error), panics on `iota`.
struct Picky;

struct FailingRun;

impl Executable for FailingRun {
    fn run(
        &self,
        _: &std::collections::BTreeMap<String, oar::ir::TensorData>,
    ) -> Result<Vec<(String, oar::ir::TensorData)>, BackendError> {
        Err(BackendError::Runtime {
            op: "cond".into(),
            value: "%3".into(),
            detail: "no branches today".into(),
        })
    }
}

impl Backend for Picky {
    fn name(&self) -> &str {
        "picky"
    }
    fn description(&self) -> &str {
        "refuses some ops"
    }
    fn compile(&self, graph: &Graph, weights: &Weights) -> Result<Box<dyn Executable>, BackendError> {
        let has = |f: &dyn Fn(&Op) -> bool| graph.node_ids().any(|id| f(&graph.node(id).op));
        if has(&|op| *op == Op::While) {
            return Err(BackendError::Unsupported {
                backend: "picky".into(),
                op: "while".into(),
            });
        }
        if has(&|op| *op == Op::Cond) {
            return Ok(Box::new(FailingRun));
        }
        if has(&|op| matches!(op, Op::Iota(_))) {
            panic!("iota is not implemented");
        }
        ReferenceBackend::new().compile(graph, weights)
    }
}

#[test]
fn unsupported_errors_and_panics_are_reported() {
    let suite = Suite::builtin(false);
    for (filter, label) in [
        ("ops/while/", "unsupported"),
        ("ops/cond/", "ERROR"),
        ("ops/iota/", "ERROR"),
        ("ops/unary/exp/f32", "pass"),
    ] {
        let report = suite.run(&Picky, &SuiteFilter::matching(filter));
        assert!(!report.results.is_empty(), "{filter}");
        for r in &report.results {
            assert_eq!(r.status.label(), label, "{}: {:?}", r.full_name(), r.status);
        }
        let text = report.to_string();
        match label {
            "unsupported" => {
                assert!(text.contains("does not support op `while`"), "{text}");
                assert!(report.is_success(), "unsupported is not a failure");
            }
            "ERROR" => {
                assert!(
                    text.contains("run: op `cond` at %3: no branches today")
                        || (text.contains("compile: panicked at conformance/tests/kit/reference.rs:")
                            && text.contains("iota is not implemented")),
                    "{text}"
                );
                assert!(!report.is_success());
                assert!(text.contains("FAILED"), "{text}");
            }
            _ => assert!(report.is_success() && text.contains("OK: backend `picky`"), "{text}"),
        }
    }
}

#[test]
fn filters_select_by_section_and_substring() {
    let suite = Suite::builtin(false);
    let n = |f: &SuiteFilter| suite.cases().iter().filter(|c| f.matches(c)).count();
    let all = n(&SuiteFilter::all());
    let by_section: usize = Section::ALL.iter().map(|&s| n(&SuiteFilter::section(s))).sum();
    assert_eq!(all, by_section);
    assert_eq!(n(&SuiteFilter::matching("models/resnet18")), 1);
    assert_eq!(
        Suite::builtin(true).cases().len(),
        suite.cases().len() + 3,
        "--full adds the three full-size models"
    );
    // Names are unique.
    let names: BTreeSet<String> = suite.cases().iter().map(|c| c.full_name()).collect();
    assert_eq!(names.len(), all);
}

/// The variant names of a serde-derived enum, read from what `Deserialize` asks for.
mod variants {
    use serde::de::{self, Deserialize, Deserializer, Visitor};
    use std::fmt;

    #[derive(Debug)]
    pub struct Stop;
    impl fmt::Display for Stop {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("stop")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<T: fmt::Display>(_: T) -> Self {
            Stop
        }
    }

    struct Probe<'a>(&'a mut Option<&'static [&'static str]>);

    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_enum<V: Visitor<'de>>(
            self,
            _name: &'static str,
            variants: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            *self.0 = Some(variants);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier
            ignored_any
        }
    }

    pub fn of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
        let mut v = None;
        let _ = T::deserialize(Probe(&mut v));
        v.expect("a serde enum")
    }
}

/// `Unary(Exp)` → `Unary`: the variant name of a Debug string.
fn variant(debug: &str) -> String {
    debug
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .next()
        .unwrap_or_default()
        .to_string()
}

fn collect_ops(g: &Graph, out: &mut BTreeSet<String>) {
    for id in g.node_ids() {
        let n = g.node(id);
        let outer = variant(&format!("{:?}", n.op));
        let inner = match &n.op {
            Op::Unary(u) => format!("{u:?}"),
            Op::Binary(b) => format!("{b:?}"),
            Op::Reduce(Reduce { op, .. }) => format!("{op:?}"),
            Op::ArgReduce(ArgReduce { op, .. }) => format!("{op:?}"),
            Op::Scatter(Scatter { reduce, .. }) => format!("{reduce:?}"),
            Op::Random(Random { dist, .. }) => variant(&format!("{dist:?}")),
            Op::Composite(c) => variant(&format!("{c:?}")),
            _ => String::new(),
        };
        out.insert(outer.clone());
        if !inner.is_empty() {
            out.insert(format!("{outer}::{inner}"));
        }
        for r in &n.regions {
            collect_ops(r, out);
        }
    }
}

#[test]
fn every_op_variant_has_a_case() {
    // What the IR has, read from the enums themselves (serde's variant lists and `ALL`).
    let mut want: BTreeSet<String> = variants::of::<Op>().iter().map(|s| s.to_string()).collect();
    let family = |outer: &str, inner: Vec<String>, want: &mut BTreeSet<String>| {
        want.extend(inner.into_iter().map(|i| format!("{outer}::{i}")));
    };
    family(
        "Unary",
        UnaryOp::ALL.iter().map(|x| format!("{x:?}")).collect(),
        &mut want,
    );
    family(
        "Binary",
        BinaryOp::ALL.iter().map(|x| format!("{x:?}")).collect(),
        &mut want,
    );
    family(
        "Reduce",
        ReduceOp::ALL.iter().map(|x| format!("{x:?}")).collect(),
        &mut want,
    );
    family(
        "ArgReduce",
        ArgReduceOp::ALL.iter().map(|x| format!("{x:?}")).collect(),
        &mut want,
    );
    family(
        "Scatter",
        ScatterReduce::ALL.iter().map(|x| format!("{x:?}")).collect(),
        &mut want,
    );
    family(
        "Random",
        variants::of::<oar::ir::ops::RandomDist>()
            .iter()
            .map(|s| s.to_string())
            .collect(),
        &mut want,
    );
    family(
        "Composite",
        variants::of::<oar::ir::Composite>()
            .iter()
            .map(|s| s.to_string())
            .collect(),
        &mut want,
    );
    assert!(want.contains("While") && want.contains("Composite::ScaledDotProductAttention"));

    // What the ops section's graphs contain.
    let suite = Suite::builtin(false);
    let mut have = BTreeSet::new();
    for c in suite.cases().iter().filter(|c| c.section() == Section::Ops) {
        collect_ops(&c.build().unwrap().graph, &mut have);
    }
    let missing: Vec<&String> = want.difference(&have).collect();
    assert!(missing.is_empty(), "ops without a conformance case: {missing:?}");

    // The library's own coverage keys (modes included) agree.
    let missing = suite.missing_ops(&SuiteFilter::section(Section::Ops)).unwrap();
    assert!(missing.is_empty(), "required keys without a case: {missing:?}");
    assert!(required_op_keys().len() > 80);
}

#[test]
fn elementwise_ops_cover_every_dtype_they_accept() {
    use oar::ir::TensorType;
    let names: BTreeSet<String> = Suite::builtin(false).cases().iter().map(|c| c.full_name()).collect();
    for d in DType::ALL {
        for &u in UnaryOp::ALL {
            let ok = oar::ir::ops::infer_types(&Op::Unary(u), &[TensorType::of(d, &[2])], &[]).is_ok();
            assert_eq!(names.contains(&format!("ops/unary/{}/{d}", u.name())), ok, "{u:?} {d}");
        }
        for &b in BinaryOp::ALL {
            let t = TensorType::of(d, &[2]);
            let ok = oar::ir::ops::infer_types(&Op::Binary(b), &[t.clone(), t], &[]).is_ok();
            assert_eq!(names.contains(&format!("ops/binary/{}/{d}", b.name())), ok, "{b:?} {d}");
        }
        for to in DType::ALL {
            assert!(names.contains(&format!("ops/cast/{d}->{to}")));
        }
    }
}
