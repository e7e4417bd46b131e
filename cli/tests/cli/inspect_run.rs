//! End-to-end tests of the `oar` command-line tool on a saved model.

use crate::common::{assert_clean_error, oar, stderr, stdout};
use oar::ir::file::Model;
use oar::ir::{Composite, DType, Dim, Graph, Op, TensorData, TensorType};
use std::collections::BTreeMap;
use std::path::Path;

/// y = relu(x @ w + b), with x: f32[N, 3], w: f32[3, 2], b: f32[2].
fn model(dir: &Path) -> std::path::PathBuf {
    let mut g = Graph::new("tiny");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(3)]))
        .unwrap();
    let w = g.add_param("w", TensorType::of(DType::F32, &[3, 2])).unwrap();
    let b = g.add_param("b", TensorType::of(DType::F32, &[2])).unwrap();
    let y = g.add_op1(Op::Composite(Composite::Linear), &[x, w, b]).unwrap();
    let y = g.add_op1(Op::Composite(Composite::Relu), &[y]).unwrap();
    g.add_output("y", y).unwrap();
    let weights = BTreeMap::from([
        (
            "w".to_string(),
            TensorData::from_vec(vec![3, 2], vec![1.0f32, -1.0, 2.0, 0.5, 0.0, 1.0]).unwrap(),
        ),
        (
            "b".to_string(),
            TensorData::from_vec(vec![2], vec![0.5f32, -4.0]).unwrap(),
        ),
    ]);
    let path = dir.join("tiny.oar");
    Model { graph: g, weights }.save(&path).unwrap();
    path
}

#[test]
fn inspect_run_dot_and_backends() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let m = m.to_str().unwrap();

    let o = oar(&["inspect", m, "--bind", "N=10"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains("linear") && s.contains("relu"), "{s}");
    assert!(s.contains("parameters: 2 tensors, 8 elements, 32 B"), "{s}");
    // linear: 2*K*out + bias adds = 2*3*20 + 20 = 140; relu: 20.
    assert!(s.contains("flops: 160 per run (N=10)"), "{s}");

    let x = TensorData::from_vec(vec![2, 3], vec![1.0f32, 2.0, 3.0, -1.0, 0.0, 1.0]).unwrap();
    let xp = dir.path().join("x.npy");
    oar::ir::npy::write_npy(&xp, &x).unwrap();
    let out = dir.path().join("out");
    let o = oar(&[
        "run",
        m,
        "--input",
        &format!("x={}", xp.display()),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let y = oar::ir::npy::read_npy(&out.join("y.npy")).unwrap();
    // Row 0: [1*1+2*2+3*0+0.5, 1*-1+2*0.5+3*1-4] = [5.5, -1 → 0]; row 1: [-1+0.5, 1+1-4 → 0] = [0, 0].
    assert_eq!(y.shape(), &[2, 2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![5.5, 0.0, 0.0, 0.0]);

    let o = oar(&["dot", m]);
    assert!(
        o.status.success() && stdout(&o).starts_with("digraph"),
        "{}",
        stderr(&o)
    );
    let o = oar(&["backends"]);
    assert!(stdout(&o).contains("reference"), "{}", stdout(&o));
    let gpu = stdout(&o).lines().find(|l| l.starts_with("gpu ")).map(str::to_string);
    assert!(
        gpu.as_deref().is_some_and(|l| l.contains("ptx runtime: ")),
        "the gpu device runtime is listed with its state:\n{}",
        stdout(&o)
    );
}

#[test]
fn errors_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let m = m.to_str().unwrap();
    assert_clean_error(&oar(&["inspect", "/no/such/model.oar"]), "/no/such/model.oar");

    let junk = dir.path().join("junk.oar");
    std::fs::write(&junk, b"definitely not a model").unwrap();
    assert_clean_error(&oar(&["inspect", junk.to_str().unwrap()]), "junk.oar");

    let bad = dir.path().join("bad.npy");
    std::fs::write(&bad, b"\x93NUMPY garbage").unwrap();
    assert_clean_error(&oar(&["run", m, "--input", &format!("x={}", bad.display())]), "x");

    let wrong = dir.path().join("wrong.npy");
    oar::ir::npy::write_npy(&wrong, &TensorData::from_vec(vec![2, 4], vec![0.0f32; 8]).unwrap()).unwrap();
    assert_clean_error(
        &oar(&["run", m, "--input", &format!("x={}", wrong.display())]),
        "f32[N,3]",
    );
    assert_clean_error(&oar(&["run", m]), "missing input `x`");
    assert_clean_error(&oar(&["run", m, "--backend", "tpu9000"]), "tpu9000");
    assert_clean_error(&oar(&["run", m, "--target", "tpu9000"]), "(registered: reference, cpu");
    assert_clean_error(&oar(&["inspect", m, "--bind", "N"]), "SYM=SIZE");
}

/// Outputs whose names differ only in characters a file name cannot hold (`a/b`, `a_b`) land
/// in different files (reliability reproducer 06: one was silently overwritten).
#[test]
fn run_writes_every_output_to_its_own_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = "graph @g {\n  %x = input \"x\" : f32[2]\n  %n = neg(%x) : f32[2]\n  output \"a/b\" = %x\n  output \"a_b\" = %n\n}\n";
    let m = dir.path().join("collide.oir");
    std::fs::write(&m, text).unwrap();
    let xp = dir.path().join("x.npy");
    oar::ir::npy::write_npy(&xp, &TensorData::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap()).unwrap();
    let out = dir.path().join("out");
    let o = oar(&[
        "run",
        m.to_str().unwrap(),
        "-i",
        &format!("x={}", xp.display()),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let read = |f: &str| oar::ir::npy::read_npy(&out.join(f)).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(read("a%2Fb.npy"), vec![1.0, 2.0]);
    assert_eq!(read("a_b.npy"), vec![-1.0, -2.0]);
}

/// `oar opt big.oir | head -c1`: the reader goes away mid-output and oar ends quietly (by
/// SIGPIPE, like any Unix tool) instead of panicking in println! (reliability reproducer 09).
#[cfg(unix)]
#[test]
fn a_closed_stdout_pipe_is_not_a_panic() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("graph @g {\n  %v0 = input \"x\" : f32[4]\n");
    for i in 1..=5000 {
        text.push_str(&format!("  %v{i} = tanh(%v{}) : f32[4]\n", i - 1));
    }
    text.push_str("  output \"y\" = %v5000\n}\n");
    let m = dir.path().join("big.oir");
    std::fs::write(&m, text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["opt", m.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut one = [0u8; 1];
    child.stdout.take().unwrap().read_exact(&mut one).unwrap(); // then the pipe closes
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && !err.contains("internal error"), "{err}");
}

/// The memory budget (reliability reproducers 02): sizes past `--max-memory` / OAR_MAX_MEMORY
/// are one clear error naming the tensor, its bytes and the limit — on the cpu and reference
/// backends, for `compile`, and in a compiled executable — never an abort or a panic.
#[test]
fn sizes_past_the_memory_budget_are_clean_errors() {
    let dir = tempfile::tempdir().unwrap();
    let graph = |name: &str, body: &str, ty: &str| {
        let p = dir.path().join(name);
        std::fs::write(
            &p,
            format!("graph @g {{\n  %0 = {body} : {ty}\n  output \"y\" = %0\n}}\n"),
        )
        .unwrap();
        p
    };
    let cases = [
        graph("iota_2p30.oir", "iota() {axis = 0}", "f32[1073741824]"),
        graph("iota_2p40.oir", "iota() {axis = 0}", "f32[1099511627776]"),
        graph("iota_u64max.oir", "iota() {axis = 0}", "f32[18446744073709551615]"),
        graph(
            "random_2p32.oir",
            "random() {dist = normal, mean = 0.0, std = 1.0, seed = 1}",
            "f32[4294967296]",
        ),
    ];
    for p in &cases {
        let p = p.to_str().unwrap();
        for backend in ["cpu", "reference"] {
            let o = oar(&["run", p, "-b", backend, "--max-memory", "64M"]);
            assert_clean_error(&o, "limit is 67108864 bytes");
        }
        let o = oar(&[
            "compile",
            p,
            "--emit",
            "obj",
            "-o",
            dir.path().join("t.o").to_str().unwrap(),
            "--max-memory",
            "64M",
        ]);
        assert_clean_error(&o, "too large");
    }
    // The environment variable works too, and a small graph runs under a small limit.
    let small = graph("small.oir", "iota() {axis = 0}", "f32[1024]");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["run", cases[0].to_str().unwrap()])
        .env("OAR_MAX_MEMORY", "1M")
        .output()
        .unwrap();
    assert_clean_error(&o, "OAR_MAX_MEMORY");
    let o = oar(&["run", small.to_str().unwrap(), "--max-memory", "64K"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // An executable checks its own budget before allocating.
    let exe = dir.path().join("small_exe");
    let o = oar(&[
        "compile",
        small.to_str().unwrap(),
        "--emit",
        "exe",
        "-o",
        exe.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = std::process::Command::new(&exe)
        .args(["--max-memory", "1K"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("memory limit is 1024 bytes"),
        "{err}"
    );
    let o = oar(&["run", small.to_str().unwrap(), "--max-memory", "lots"]);
    assert!(!o.status.success() && stderr(&o).contains("lots"), "{}", stderr(&o));
}

/// Misleading or blocking answers of reliability reproducer 09, each now one clear line: a FLOP
/// count that overflows, a `--bind` of a symbol the graph lacks, a symbol with an empty name,
/// a FIFO given as an input.
#[test]
fn misleading_answers_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let mm = write(
        "mm.oir",
        "graph @g {\n  %x = input \"x\" : f32[2147483648,2147483648]\n  %0 = matmul(%x, %x) : f32[2147483648,2147483648]\n  output \"y\" = %0\n}\n",
    );
    let o = oar(&["inspect", "--summary", mm.to_str().unwrap()]);
    assert!(
        o.status.success() && stdout(&o).contains("overflows u64"),
        "{}",
        stdout(&o)
    );
    let m = model(dir.path());
    let o = oar(&["inspect", m.to_str().unwrap(), "--bind", "Q=3"]);
    assert_clean_error(&o, "no symbolic dim `Q` (its symbols: N)");
    let empty = write(
        "empty.oir",
        "graph @g {\n  %x = input \"x\" : f32[\"\",3]\n  output \"y\" = %x\n}\n",
    );
    let o = oar(&["inspect", empty.to_str().unwrap()]);
    assert!(
        !o.status.success() && stderr(&o).contains("empty name"),
        "{}",
        stderr(&o)
    );
    #[cfg(unix)]
    {
        let fifo = dir.path().join("x.npy");
        if std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success())
        {
            let o = oar(&["run", m.to_str().unwrap(), "-i", &format!("x={}", fifo.display())]);
            assert_clean_error(&o, "not a regular file");
        }
    }
}
