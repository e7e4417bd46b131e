//! Pass manager behaviour: order, verification naming the pass, timing and node counts,
//! stop-after, IR printing, and the registry.

use oar_ir::ops::UnaryOp;
use oar_ir::{DType, Graph, Op, TensorType};
use oar_passes::{Pass, PassError, PassManager, list_passes, pass_by_name};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// Records its name into a shared log; optionally adds `grow` nodes and sleeps.
struct Recorder {
    name: &'static str,
    log: Rc<RefCell<Vec<&'static str>>>,
    grow: usize,
    sleep: Duration,
}

impl Pass for Recorder {
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        "test pass"
    }
    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        self.log.borrow_mut().push(self.name);
        std::thread::sleep(self.sleep);
        for _ in 0..self.grow {
            graph.add_scalar(DType::F32, 1.0);
        }
        Ok(self.grow > 0)
    }
}

fn rec(name: &'static str, log: &Rc<RefCell<Vec<&'static str>>>, grow: usize) -> Recorder {
    Recorder {
        name,
        log: log.clone(),
        grow,
        sleep: Duration::ZERO,
    }
}

/// Adds a `cond` whose regions declare param `w` with a type that conflicts with the top
/// level's `w`: every builder call succeeds, but the verifier rejects the graph.
struct BreakParams;

impl Pass for BreakParams {
    fn name(&self) -> &'static str {
        "break_params"
    }
    fn description(&self) -> &'static str {
        "makes the graph invalid"
    }
    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let region = || {
            let mut r = Graph::new("branch");
            let w = r.add_param("w", TensorType::of(DType::F32, &[3])).unwrap();
            r.add_output("w", w).unwrap();
            r
        };
        let pred = graph.add_scalar(DType::Bool, 1.0);
        graph
            .add_region_op(Op::Cond, &[pred], vec![region(), region()])
            .map_err(|e| PassError::ir(self.name(), e))?;
        Ok(true)
    }
}

fn small_graph() -> Graph {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::of(DType::F32, &[4])).unwrap();
    let w = g.add_param("w", TensorType::of(DType::F32, &[4])).unwrap();
    let y = g.binary(oar_ir::ops::BinaryOp::Mul, x, w).unwrap();
    let y = g.unary(UnaryOp::Exp, y).unwrap();
    g.add_output("y", y).unwrap();
    g
}

#[test]
fn passes_run_in_order_and_report_counts_and_time() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut pm = PassManager::new();
    pm.add(rec("a", &log, 2)).add(rec("b", &log, 0)).add(Recorder {
        name: "slow",
        log: log.clone(),
        grow: 1,
        sleep: Duration::from_millis(20),
    });
    assert_eq!(pm.pass_names(), ["a", "b", "slow"]);
    let mut g = small_graph();
    let report = pm.run(&mut g).unwrap();
    assert_eq!(*log.borrow(), ["a", "b", "slow"]);
    let r = &report.records;
    assert_eq!(r.iter().map(|r| r.name).collect::<Vec<_>>(), ["a", "b", "slow"]);
    assert_eq!((r[0].nodes_before, r[0].nodes_after), (4, 6));
    assert_eq!((r[1].nodes_before, r[1].nodes_after, r[1].changed), (6, 6, false));
    assert_eq!((r[2].nodes_before, r[2].nodes_after, r[2].changed), (6, 7, true));
    assert!(r[2].duration >= Duration::from_millis(20), "{:?}", r[2].duration);
    assert!(report.total_duration() >= r[2].duration && report.changed());
    assert_eq!(report.stopped_after, None);
    let table = report.to_string();
    assert!(table.contains("slow") && table.contains("total"), "{table}");
    // The manager can run again (passes are kept).
    pm.run(&mut g).unwrap();
    assert_eq!(log.borrow().len(), 6);
}

#[test]
fn verify_each_names_the_failing_pass() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut pm = PassManager::new();
    pm.add(rec("ok", &log, 0)).add(BreakParams).add(rec("never", &log, 0));
    pm.verify_each(true);
    let err = pm.run(&mut small_graph()).unwrap_err();
    match &err {
        PassError::Verify { pass, .. } => assert_eq!(pass, "break_params"),
        e => panic!("expected a verify error, got {e}"),
    }
    assert!(
        err.to_string().contains("break_params") && err.to_string().contains("`w`"),
        "{err}"
    );
    assert_eq!(*log.borrow(), ["ok"], "the pipeline stops at the failure");
    // Without verification the broken graph goes through.
    let mut pm = PassManager::new();
    pm.add(BreakParams);
    assert!(pm.run(&mut small_graph()).is_ok());
}

#[test]
fn verify_each_checks_the_input_graph() {
    let mut g = small_graph();
    BreakParams.run(&mut g).unwrap();
    let mut pm = PassManager::new();
    pm.add(oar_passes::Dce).verify_each(true);
    let err = pm.run(&mut g).unwrap_err();
    assert!(
        matches!(&err, PassError::Verify { pass, .. } if pass == "<input>"),
        "{err}"
    );
}

#[test]
fn stop_after_runs_only_the_first_n_passes() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut pm = PassManager::new();
    pm.add(rec("a", &log, 1)).add(rec("b", &log, 1)).add(rec("c", &log, 1));
    pm.stop_after(2);
    let mut g = small_graph();
    let report = pm.run(&mut g).unwrap();
    assert_eq!(*log.borrow(), ["a", "b"]);
    assert_eq!(report.records.len(), 2);
    assert_eq!(report.stopped_after, Some(2));
    assert_eq!(g.node_count(), 6);
    assert!(report.to_string().contains("stopped after pass 2"));
    let mut none = PassManager::new();
    none.add(rec("a", &log, 1)).stop_after(0);
    assert!(none.run(&mut g).unwrap().records.is_empty());
}

#[test]
fn printing_goes_to_the_sink_for_the_chosen_passes() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let seen = Rc::new(RefCell::new(Vec::new()));
    let sink_seen = seen.clone();
    let mut pm = PassManager::new();
    pm.add(rec("a", &log, 1)).add(rec("b", &log, 1));
    pm.print_before("b").print_after("a").print_after("b");
    pm.ir_sink(Box::new(move |pass: &str, when: &str, g: &Graph| {
        sink_seen.borrow_mut().push(format!("{when} {pass} {}", g.node_count()));
    }));
    pm.run(&mut small_graph()).unwrap();
    assert_eq!(*seen.borrow(), ["after a 5", "before b 5", "after b 6"]);
    seen.borrow_mut().clear();
    pm.print_before_all();
    pm.run(&mut small_graph()).unwrap();
    assert_eq!(*seen.borrow(), ["before a 4", "after a 5", "before b 5", "after b 6"]);
}

#[test]
fn registry_finds_passes_by_name() {
    let names: Vec<_> = list_passes().iter().map(|(n, _)| *n).collect();
    for expected in [
        "dce",
        "decompose",
        "canonicalize",
        "fold",
        "fold-batch-norm",
        "recompose",
        "cse",
        "specialize-shapes",
        "simplify",
        "fuse",
        "amp",
        "fake-quant-to-qdq",
        "quantize",
    ] {
        assert!(names.contains(&expected), "{expected} missing from {names:?}");
    }
    let unique: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "duplicate pass names: {names:?}");
    assert!(list_passes().iter().all(|(_, d)| !d.is_empty()));
    assert_eq!(pass_by_name("dce").unwrap().name(), "dce");
    assert!(pass_by_name("nope").is_none());
    let pm = PassManager::from_names(&["decompose", "dce"]).unwrap();
    assert_eq!(pm.pass_names(), ["decompose", "dce"]);
    let err = PassManager::from_names(&["dce", "cse?"]).err().expect("unknown pass");
    let msg = err.to_string();
    assert!(msg.contains("cse?") && msg.contains("decompose"), "{msg}");
}
