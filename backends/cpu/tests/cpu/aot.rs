//! Ahead-of-time compilation: objects, executables, shared libraries (with the C example),
//! CLIF listings; outputs against the reference backend and the JIT (relative tolerance
//! 1e-4); dependencies of the binaries; errors of the executable and of the C API.

use oar_backend_cpu::CpuBackend;
use oar_backend_cpu::CpuError;
use oar_backend_cpu::aot::{self, AotOptions, AotReport, Emit, WeightsMode};
use oar_ir::{Backend, Graph, TensorData, Weights};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Elementwise ops and reductions (no matmul/conv): a row softmax of `x * w`, a column max
/// plus `b`, and an integer output. Inputs are declared `x, b` while the program first reads
/// `b` late, so graph order and buffer order can differ.
const EW: &str = r#"
graph @ew {
  %x = input "x" : f32[N,4]
  %b = input "b" : f32[4]
  %w = param "w" : f32[4]
  %0 = mul(%x, %w) : f32[N,4]
  %1 = exp(%0) : f32[N,4]
  %2 = reduce_sum(%1) {axes = [1], keepdim = true} : f32[N,1]
  %3 = div(%1, %2) : f32[N,4]
  %4 = reduce_max(%x) {axes = [0], keepdim = false} : f32[4]
  %5 = add(%4, %b) : f32[4]
  %6 = tanh(%5) : f32[4]
  output "y" = %3
  output "m" = %6
}
"#;

/// An MLP: linear, relu, linear, softmax (matmul contractions with fused epilogues).
const MLP: &str = r#"
graph @mlp {
  %x = input "x" : f32[N,6]
  %w1 = param "w1" : f32[6,16]
  %b1 = param "b1" : f32[16]
  %w2 = param "w2" : f32[16,4]
  %b2 = param "b2" : f32[4]
  %0 = linear(%x, %w1, %b1) : f32[N,16]
  %1 = relu(%0) : f32[N,16]
  %2 = linear(%1, %w2, %b2) : f32[N,4]
  %3 = softmax(%2) {axis = 1} : f32[N,4]
  output "probs" = %3
}
"#;

/// A small CNN: conv (padded), relu, max pool, depthwise conv, relu, flatten, linear.
const CNN: &str = r#"
graph @cnn {
  %x = input "x" : f32[N,1,8,8]
  %w1 = param "w1" : f32[4,1,3,3]
  %b1 = param "b1" : f32[4]
  %w2 = param "w2" : f32[4,1,3,3]
  %w3 = param "w3" : f32[16,5]
  %b3 = param "b3" : f32[5]
  %0 = conv2d(%x, %w1, %b1) {stride = [1, 1], padding = [1, 1, 1, 1], dilation = [1, 1], groups = 1} : f32[N,4,8,8]
  %1 = relu(%0) : f32[N,4,8,8]
  %2 = max_pool2d(%1) {kernel = [2, 2], stride = [2, 2], padding = [0, 0, 0, 0], ceil_mode = false} : f32[N,4,4,4]
  %3 = conv2d(%2, %w2) {stride = [1, 1], padding = [0, 0, 0, 0], dilation = [1, 1], groups = 4} : f32[N,4,2,2]
  %4 = relu(%3) : f32[N,4,2,2]
  %5 = reshape(%4) : f32[N,16]
  %6 = linear(%5, %w3, %b3) : f32[N,5]
  output "logits" = %6
}
"#;

/// A graph from text with deterministic weights in [-1, 1) for its params.
fn with_weights(text: &str) -> (Graph, Weights) {
    let g = oar_ir::text::parse_graph(text).unwrap();
    let w = g
        .params()
        .into_iter()
        .enumerate()
        .map(|(i, (name, v))| {
            let shape = g.value_type(v).shape.as_static().unwrap();
            let n = shape.iter().product();
            (name, TensorData::from_vec(shape, values(n, 10 + i as u64)).unwrap())
        })
        .collect();
    (g, w)
}

fn ew_graph() -> (Graph, Weights) {
    let g = oar_ir::text::parse_graph(EW).unwrap();
    let w = Weights::from([(
        "w".to_string(),
        TensorData::from_vec(vec![4], vec![0.5f32, -1.0, 2.0, 0.25]).unwrap(),
    )]);
    (g, w)
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn ew_inputs(n: usize) -> BTreeMap<String, TensorData> {
    BTreeMap::from([
        (
            "x".to_string(),
            TensorData::from_vec(vec![n, 4], values(n * 4, 1)).unwrap(),
        ),
        ("b".to_string(), TensorData::from_vec(vec![4], values(4, 2)).unwrap()),
    ])
}

fn binds(n: usize) -> BTreeMap<String, usize> {
    BTreeMap::from([("N".to_string(), n)])
}

fn compile(g: &Graph, w: &Weights, emit: Emit, out: &Path, weights: WeightsMode) -> AotReport {
    aot::compile(
        g,
        w,
        &AotOptions {
            emit,
            output: out.to_path_buf(),
            bindings: binds(3),
            weights,
            runtime_lib: None,
            cpu: Default::default(),
        },
    )
    .unwrap_or_else(|e| panic!("compiling {emit:?}: {e}"))
}

fn reference(g: &Graph, w: &Weights, inputs: &BTreeMap<String, TensorData>) -> Vec<(String, TensorData)> {
    oar_backend_reference::run_graph(g, w, inputs).unwrap()
}

/// `got` equals `want` within relative tolerance 1e-4 (absolute 1e-6 near zero).
fn assert_close(got: &TensorData, want: &TensorData, what: &str) {
    assert_eq!(got.tensor_type(), want.tensor_type(), "{what}");
    for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!((a - b).abs() <= 1e-4 * b.abs() + 1e-6, "{what}[{i}]: got {a}, want {b}");
    }
}

fn run(cmd: &Path, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", cmd.display()))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "failed: {}{}", text(&o.stdout), text(&o.stderr));
    text(&o.stdout)
}

/// A failing run prints one `error:` line mentioning every needle, and no panic.
fn assert_error(o: &Output, needles: &[&str]) {
    let err = text(&o.stderr);
    assert!(!o.status.success(), "expected failure: {}{err}", text(&o.stdout));
    assert_eq!(err.lines().count(), 1, "one line expected: {err}");
    assert!(err.starts_with("error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "{err:?} should mention {n:?}");
    }
    assert!(!err.contains("panicked") && !err.contains("internal error"), "{err}");
}

fn write_inputs(dir: &Path, inputs: &BTreeMap<String, TensorData>) -> BTreeMap<String, PathBuf> {
    inputs
        .iter()
        .map(|(n, t)| {
            let p = dir.join(format!("{n}.npy"));
            oar_ir::npy::write_npy(&p, t).unwrap();
            (n.clone(), p)
        })
        .collect()
}

fn arg(name: &str, p: &Path) -> String {
    format!("{name}={}", p.display())
}

/// The DT_NEEDED entries of an ELF file (`readelf -d`).
fn needed(path: &Path) -> Vec<String> {
    let o = run(Path::new("readelf"), &["-d", path.to_str().unwrap()]);
    ok(&o)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1).map(|s| s.trim_end_matches(']').to_string()))
        .collect()
}

fn assert_libc_only(path: &Path) {
    let allowed = |n: &str| {
        n.starts_with("libc.so") || n.starts_with("libm.so") || n.starts_with("ld-linux") || n.starts_with("linux-vdso")
    };
    for n in needed(path) {
        assert!(allowed(&n), "{} needs {n}", path.display());
    }
    // ldd agrees (a static executable is "not a dynamic executable").
    let o = run(Path::new("ldd"), &[path.to_str().unwrap()]);
    let out = text(&o.stdout) + &text(&o.stderr);
    for line in out.lines() {
        let lib = line.split_whitespace().next().unwrap_or("");
        assert!(
            line.contains("not a dynamic executable")
                || line.contains("statically linked")
                || allowed(lib)
                || lib.starts_with('/'),
            "{}: ldd lists {line}",
            path.display()
        );
    }
}

#[test]
fn exe_matches_reference_and_jit() {
    let dir = tempfile::tempdir().unwrap();
    let (g, w) = ew_graph();
    let exe = dir.path().join("ew");
    let report = compile(&g, &w, Emit::Exe, &exe, WeightsMode::Embedded);
    assert_eq!(report.files[0].0, exe);
    let inputs = ew_inputs(3);
    let want = reference(&g, &w, &inputs);
    let jit = CpuBackend::new().compile(&g, &w).unwrap().run(&inputs).unwrap();
    let files = write_inputs(dir.path(), &inputs);

    // By name.
    let out = dir.path().join("out");
    let o = run(
        &exe,
        &[
            "--input",
            &arg("x", &files["x"]),
            "-i",
            &arg("b", &files["b"]),
            "--output-dir",
            out.to_str().unwrap(),
            "--threads",
            "2",
        ],
    );
    let s = ok(&o);
    assert!(s.contains("y: f32[3,4]") && s.contains("m: f32[4]"), "{s}");
    for (name, t) in &want {
        let got = oar_ir::npy::read_npy(&out.join(format!("{name}.npy"))).unwrap();
        assert_close(&got, t, &format!("exe {name} vs reference"));
        let j = &jit.iter().find(|(n, _)| n == name).unwrap().1;
        assert_close(&got, j, &format!("exe {name} vs JIT"));
    }

    // Positionally, in graph input order (x, b).
    let out2 = dir.path().join("out2");
    let o = run(
        &exe,
        &[
            files["x"].to_str().unwrap(),
            files["b"].to_str().unwrap(),
            "-o",
            out2.to_str().unwrap(),
        ],
    );
    ok(&o);
    for (name, t) in &want {
        let got = oar_ir::npy::read_npy(&out2.join(format!("{name}.npy"))).unwrap();
        assert_close(&got, t, &format!("positional {name}"));
    }

    let s = ok(&run(&exe, &["--info"]));
    assert!(
        s.contains("input 0: x: f32[3,4]") && s.contains("input 1: b: f32[4]") && s.contains("output 1: m: f32[4]"),
        "{s}"
    );
    assert_libc_only(&exe);
}

#[test]
fn exe_bench_prints_latency_stats() {
    let dir = tempfile::tempdir().unwrap();
    let (g, w) = ew_graph();
    let exe = dir.path().join("ew");
    compile(&g, &w, Emit::Exe, &exe, WeightsMode::Embedded);
    let files = write_inputs(dir.path(), &ew_inputs(3));
    let s = ok(&run(
        &exe,
        &[
            files["x"].to_str().unwrap(),
            files["b"].to_str().unwrap(),
            "--bench",
            "5",
        ],
    ));
    let line = s
        .lines()
        .find(|l| l.starts_with("bench: 5 runs"))
        .unwrap_or_else(|| panic!("{s}"));
    let num = |key: &str| -> f64 {
        let rest = line
            .split(&format!(" {key} "))
            .nth(1)
            .unwrap_or_else(|| panic!("{key} in {line}"));
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (min, median, mean, p90) = (num("min"), num("median"), num("mean"), num("p90"));
    assert!(min > 0.0 && min <= median && median <= p90 && min <= mean, "{line}");
}

#[test]
fn exe_errors_name_the_input_or_file() {
    let dir = tempfile::tempdir().unwrap();
    let (g, w) = ew_graph();
    let exe = dir.path().join("ew");
    compile(&g, &w, Emit::Exe, &exe, WeightsMode::Embedded);
    let files = write_inputs(dir.path(), &ew_inputs(3));
    let x = arg("x", &files["x"]);
    let b = arg("b", &files["b"]);

    // Wrong name.
    let o = run(&exe, &["-i", &x, "-i", &b, "-i", &arg("nope", &files["b"])]);
    assert_error(&o, &["unknown input `nope`", "x: f32[3,4]"]);
    // Wrong shape.
    let o = run(&exe, &["-i", &arg("x", &files["b"]), "-i", &b]);
    assert_error(&o, &["input `x`", "expected f32[3,4]", "got f32[4]"]);
    // Wrong dtype.
    let x64 = dir.path().join("x64.npy");
    let t = TensorData::from_vec(vec![3, 4], vec![0.5f64; 12]).unwrap();
    oar_ir::npy::write_npy(&x64, &t).unwrap();
    let o = run(&exe, &["-i", &arg("x", &x64), "-i", &b]);
    assert_error(&o, &["input `x`", "expected f32[3,4]", "got f64[3,4]"]);
    // Unreadable / not npy / missing.
    let o = run(&exe, &["-i", &arg("x", &dir.path().join("missing.npy")), "-i", &b]);
    assert_error(&o, &["input `x`", "missing.npy"]);
    let junk = dir.path().join("junk.npy");
    std::fs::write(&junk, b"not an npy file").unwrap();
    let o = run(&exe, &["-i", &arg("x", &junk), "-i", &b]);
    assert_error(&o, &["input `x`", "junk.npy", "not an npy file"]);
    let o = run(&exe, &["-i", &x]);
    assert_error(&o, &["missing input `b`", "f32[4]"]);
    let o = run(&exe, &["-i", &x, files["x"].to_str().unwrap(), "-i", &b]);
    assert_error(&o, &["input `x` is given twice"]);
    let o = run(&exe, &["a.npy", "b.npy", "c.npy"]);
    assert_error(&o, &["3 input files given, the model takes 2"]);
    // Bad command line: clap's message and exit code 2.
    let o = run(&exe, &["--threads", "zero"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
}

#[test]
fn external_weights_beside_the_exe_or_given() {
    let dir = tempfile::tempdir().unwrap();
    let (g, w) = ew_graph();
    let exe = dir.path().join("ew");
    let report = compile(&g, &w, Emit::Exe, &exe, WeightsMode::External);
    let wfile = dir.path().join("ew.weights");
    assert!(report.files.iter().any(|(p, _)| p == &wfile), "{:?}", report.files);
    let inputs = ew_inputs(3);
    let files = write_inputs(dir.path(), &inputs);
    let (x, b) = (files["x"].to_str().unwrap(), files["b"].to_str().unwrap());
    let out = dir.path().join("out");
    ok(&run(&exe, &[x, b, "-o", out.to_str().unwrap()]));
    let want = reference(&g, &w, &inputs);
    let got = oar_ir::npy::read_npy(&out.join("y.npy")).unwrap();
    assert_close(&got, &want[0].1, "y with ew.weights");

    // Other weights through --weights.
    let w2 = Weights::from([(
        "w".to_string(),
        TensorData::from_vec(vec![4], vec![-2.0f32, 1.0, 0.0, 3.0]).unwrap(),
    )]);
    let other = dir.path().join("other.weights");
    std::fs::write(&other, oar_ir::file::encode_weights(&w2).unwrap()).unwrap();
    ok(&run(
        &exe,
        &[x, b, "-o", out.to_str().unwrap(), "--weights", other.to_str().unwrap()],
    ));
    let want2 = reference(&g, &w2, &inputs);
    let got = oar_ir::npy::read_npy(&out.join("y.npy")).unwrap();
    assert_close(&got, &want2[0].1, "y with other.weights");

    // A weights file with the wrong tensor type.
    let bad = Weights::from([("w".to_string(), TensorData::from_vec(vec![3], vec![1.0f32; 3]).unwrap())]);
    std::fs::write(&other, oar_ir::file::encode_weights(&bad).unwrap()).unwrap();
    let o = run(&exe, &[x, b, "--weights", other.to_str().unwrap()]);
    assert_error(&o, &["other.weights", "parameter `w`", "expected f32[4]"]);
    // Corrupt, then missing.
    std::fs::write(&wfile, b"garbage").unwrap();
    let o = run(&exe, &[x, b]);
    assert_error(&o, &["ew.weights", "not a valid safetensors file"]);
    std::fs::remove_file(&wfile).unwrap();
    let o = run(&exe, &[x, b]);
    assert_error(&o, &["weights file", "ew.weights"]);
}

fn raw_inputs(dir: &Path, inputs: &BTreeMap<String, TensorData>, order: &[&str]) -> Vec<String> {
    order
        .iter()
        .map(|n| {
            let p = dir.join(format!("{n}.bin"));
            std::fs::write(&p, inputs[*n].bytes()).unwrap();
            p.display().to_string()
        })
        .collect()
}

/// Compile `c_file` against `dir/HEADER` and `lib`.
fn build_c(c_file: &Path, dir: &Path, header: &str, lib: &Path, out: &Path) {
    let o = run(
        Path::new("cc"),
        &[
            "-O1",
            "-Wall",
            "-Werror",
            "-I",
            dir.to_str().unwrap(),
            &format!("-DOAR_MODEL_HEADER=\"{header}\""),
            c_file.to_str().unwrap(),
            lib.to_str().unwrap(),
            &format!("-Wl,-rpath,{}", dir.display()),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    ok(&o);
}

/// `output NAME DTYPE [dims]` then a line of values, per output.
fn parse_c_outputs(s: &str) -> BTreeMap<String, (String, Vec<f64>)> {
    let mut lines = s.lines();
    let mut out = BTreeMap::new();
    while let Some(l) = lines.next() {
        if let Some(rest) = l.strip_prefix("output ") {
            let mut parts = rest.splitn(2, ' ');
            let name = parts.next().unwrap().to_string();
            let ty = parts.next().unwrap().to_string();
            let vals = lines
                .next()
                .unwrap()
                .split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect();
            out.insert(name, (ty, vals));
        }
    }
    out
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/c/run_model.c")
}

#[test]
fn shared_library_with_the_c_example() {
    let dir = tempfile::tempdir().unwrap();
    let (g, w) = ew_graph();
    let so = dir.path().join("ew.so");
    let report = compile(&g, &w, Emit::So, &so, WeightsMode::Embedded);
    let header = dir.path().join("ew.h");
    assert!(report.files.iter().any(|(p, _)| p == &header));
    let h = std::fs::read_to_string(&header).unwrap();
    for needle in [
        "#define OAR_MODEL_NAME \"ew\"",
        "#define OAR_MODEL_INPUT0_NAME \"x\"",
        "#define OAR_MODEL_INPUT0_SHAPE {3, 4}",
        "#define OAR_MODEL_INPUT1_BYTES 16",
        "#define OAR_MODEL_OUTPUT1_NAME \"m\"",
        "#define OAR_MODEL_OUTPUT0_DTYPE OAR_DTYPE_F32",
        "oar_model* oar_model_create(const char* weights_path, char** error);",
    ] {
        assert!(h.contains(needle), "header lacks {needle}:\n{h}");
    }
    assert_libc_only(&so);
    // Only the C API is exported.
    let o = run(Path::new("readelf"), &["--dyn-syms", "-W", so.to_str().unwrap()]);
    let syms = ok(&o);
    for l in syms.lines().filter(|l| l.contains(" GLOBAL ") && !l.contains(" UND ")) {
        let name = l.split_whitespace().last().unwrap();
        assert!(
            name.starts_with("oar_model_") || name == "oar_string_free" || name == "oar_dtype_name",
            "{name} exported"
        );
    }

    let prog = dir.path().join("run_model");
    build_c(&example(), dir.path(), "ew.h", &so, &prog);
    let inputs = ew_inputs(3);
    let bins = raw_inputs(dir.path(), &inputs, &["x", "b"]);
    let args: Vec<&str> = bins.iter().map(|s| s.as_str()).collect();
    let s = ok(&run(&prog, &args));
    assert!(s.contains("input 0 x f32 [3,4] (48 bytes)"), "{s}");
    let got = parse_c_outputs(&s);
    for (name, t) in reference(&g, &w, &inputs) {
        let (ty, vals) = &got[&name];
        assert_eq!(
            ty,
            &format!(
                "f32 [{}]",
                t.shape().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
            )
        );
        let got_t = TensorData::from_f64_slice(t.dtype(), t.shape().to_vec(), vals).unwrap();
        assert_close(&got_t, &t, &format!("C example {name}"));
    }
    // With the pattern inputs and one thread it runs too.
    ok(&run(&prog, &["--threads", "1"]));
}

/// Exercises the C API's error paths; prints one line per case.
const C_ERRORS: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include OAR_MODEL_HEADER

static void report(const char* what, int rc, char* err) {
    printf("%s: rc=%d %s\n", what, rc, err ? err : "(no error)");
    oar_string_free(err);
}

int main(int argc, char** argv) {
    char* err = NULL;
    oar_model* m = oar_model_create(argc > 1 ? argv[1] : NULL, &err);
    if (!m) { report("create", -1, err); return 0; }
    oar_tensor in[OAR_MODEL_NUM_INPUTS], out[OAR_MODEL_NUM_OUTPUTS];
    for (size_t i = 0; i < OAR_MODEL_NUM_INPUTS; i++) {
        oar_model_input_info(m, i, &in[i]);
        in[i].data = calloc(1, in[i].byte_size);
    }
    for (size_t i = 0; i < OAR_MODEL_NUM_OUTPUTS; i++) {
        oar_model_output_info(m, i, &out[i]);
        out[i].data = calloc(1, out[i].byte_size);
    }
    int rc;
    in[0].name = "nope";
    rc = oar_model_run(m, in, OAR_MODEL_NUM_INPUTS, out, OAR_MODEL_NUM_OUTPUTS, &err); report("name", rc, err);
    in[0].name = OAR_MODEL_INPUT0_NAME;
    const int64_t* good_shape = in[0].shape;
    int64_t bad_shape[2] = {5, 4};
    in[0].shape = bad_shape;
    in[0].byte_size = 5 * 4 * 4;
    rc = oar_model_run(m, in, OAR_MODEL_NUM_INPUTS, out, OAR_MODEL_NUM_OUTPUTS, &err); report("shape", rc, err);
    in[0].shape = good_shape;
    in[0].byte_size = OAR_MODEL_INPUT0_BYTES;
    in[0].dtype = OAR_DTYPE_I32;
    rc = oar_model_run(m, in, OAR_MODEL_NUM_INPUTS, out, OAR_MODEL_NUM_OUTPUTS, &err); report("dtype", rc, err);
    in[0].dtype = OAR_MODEL_INPUT0_DTYPE;
    in[0].byte_size = 7;
    rc = oar_model_run(m, in, OAR_MODEL_NUM_INPUTS, out, OAR_MODEL_NUM_OUTPUTS, &err); report("bytes", rc, err);
    in[0].byte_size = OAR_MODEL_INPUT0_BYTES;
    rc = oar_model_run(m, in, OAR_MODEL_NUM_INPUTS - 1, out, OAR_MODEL_NUM_OUTPUTS, &err); report("missing", rc, err);
    out[0].byte_size = 3;
    rc = oar_model_run(m, in, OAR_MODEL_NUM_INPUTS, out, OAR_MODEL_NUM_OUTPUTS, &err); report("small output", rc, err);
    out[0].byte_size = OAR_MODEL_OUTPUT0_BYTES;
    rc = oar_model_run(m, in, OAR_MODEL_NUM_INPUTS, out, OAR_MODEL_NUM_OUTPUTS - 1, &err); report("outputs", rc, err);
    rc = oar_model_run(m, in, OAR_MODEL_NUM_INPUTS, out, OAR_MODEL_NUM_OUTPUTS, &err); report("ok", rc, err);
    oar_tensor info;
    printf("info out of range: %d\n", oar_model_input_info(m, 99, &info));
    oar_model_destroy(m);
    return 0;
}
"#;

#[test]
fn c_api_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (g, w) = ew_graph();
    let so = dir.path().join("ew.so");
    compile(&g, &w, Emit::So, &so, WeightsMode::Embedded);
    let c = dir.path().join("errors.c");
    std::fs::write(&c, C_ERRORS).unwrap();
    let prog = dir.path().join("errors");
    build_c(&c, dir.path(), "ew.h", &so, &prog);
    let s = ok(&run(&prog, &[]));
    let line = |what: &str| {
        s.lines()
            .find(|l| l.starts_with(&format!("{what}: ")))
            .unwrap_or_else(|| panic!("no {what} in {s}"))
            .to_string()
    };
    let expect = |what: &str, needles: &[&str]| {
        let l = line(what);
        for n in needles {
            assert!(l.contains(n), "{l:?} should mention {n:?}");
        }
    };
    expect("name", &["rc=-1", "unknown input `nope`", "x: f32[3,4]"]);
    expect("shape", &["rc=-1", "input `x`: expected f32[3,4], got f32[5,4]"]);
    expect("dtype", &["rc=-1", "input `x`: expected f32[3,4], got i32[3,4]"]);
    expect("bytes", &["rc=-1", "input `x`: byte_size is 7", "48 bytes"]);
    expect("missing", &["rc=-1", "missing input `b`"]);
    expect("small output", &["rc=-1", "output `y`: byte_size is 3"]);
    expect("outputs", &["rc=-1", "1 output tensors given, the model has 2"]);
    expect("ok", &["rc=0", "(no error)"]);
    assert!(s.contains("info out of range: -1"), "{s}");

    // A library with external weights: found beside the library, or missing / corrupt.
    let so2 = dir.path().join("ew2.so");
    compile(&g, &w, Emit::So, &so2, WeightsMode::External);
    let c2 = dir.path().join("errors2");
    build_c(&c, dir.path(), "ew2.h", &so2, &c2);
    let s = ok(&run(&c2, &[]));
    assert!(s.contains("ok: rc=0"), "{s}");
    let s = ok(&run(&c2, &["/nonexistent/w.weights"]));
    assert!(
        s.starts_with("create: rc=-1 weights file `/nonexistent/w.weights`"),
        "{s}"
    );
    std::fs::write(dir.path().join("ew2.so.weights"), b"\x08\0\0\0\0\0\0\0{}").unwrap();
    let s = ok(&run(&c2, &[]));
    assert!(s.starts_with("create: rc=-1") && s.contains("ew2.so.weights"), "{s}");
    std::fs::remove_file(dir.path().join("ew2.so.weights")).unwrap();
    let s = ok(&run(&c2, &[]));
    assert!(
        s.starts_with("create: rc=-1 weights file") && s.contains("ew2.so.weights"),
        "{s}"
    );
}

#[test]
fn object_and_clif_listing() {
    let dir = tempfile::tempdir().unwrap();
    let (g, w) = ew_graph();
    let obj = dir.path().join("ew.o");
    let report = compile(&g, &w, Emit::Obj, &obj, WeightsMode::Embedded);
    let bytes = std::fs::read(&obj).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF");
    assert!(dir.path().join("ew.h").is_file());
    let syms = ok(&run(Path::new("readelf"), &["-s", "-W", obj.to_str().unwrap()]));
    assert!(
        syms.contains("oar_model_create") && syms.contains("oar_rt_model_create"),
        "{syms}"
    );
    assert!(report.kernels > 0);

    // The object links statically with the runtime library into the C example.
    let prog = dir.path().join("run_model_static");
    let rt = aot::find_runtime_lib().unwrap();
    let o = run(
        Path::new("cc"),
        &[
            "-I",
            dir.path().to_str().unwrap(),
            "-DOAR_MODEL_HEADER=\"ew.h\"",
            example().to_str().unwrap(),
            obj.to_str().unwrap(),
            rt.to_str().unwrap(),
            "-lm",
            "-lpthread",
            "-ldl",
            "-o",
            prog.to_str().unwrap(),
        ],
    );
    ok(&o);
    let inputs = ew_inputs(3);
    let bins = raw_inputs(dir.path(), &inputs, &["x", "b"]);
    let s = ok(&run(&prog, &[&bins[0], &bins[1]]));
    let got = parse_c_outputs(&s);
    let want = reference(&g, &w, &inputs);
    let m = TensorData::from_f64_slice(oar_ir::DType::F32, vec![4], &got["m"].1).unwrap();
    assert_close(&m, &want[1].1, "m through the object");

    let clif = dir.path().join("ew.clif");
    // A listing needs no weights.
    let report = compile(&g, &Weights::new(), Emit::Clif, &clif, WeightsMode::Embedded);
    let s = std::fs::read_to_string(&clif).unwrap();
    assert!(s.starts_with("; oar model `ew`:"), "{s}");
    let kernel_lines = s.lines().filter(|l| l.starts_with(";   kernel ")).count();
    assert_eq!(kernel_lines, report.kernels, "{s}");
    for (k, reason) in &report.interpreted {
        assert!(
            s.contains(&format!("`{k}`: interpreted by the reference backend ({reason})")),
            "{s}"
        );
    }
    // Every generated function is listed with its CLIF body.
    assert_eq!(
        s.matches("\nfunction ").count() + s.starts_with("function ") as usize,
        report.functions,
        "{s}"
    );
}

#[test]
fn unbound_symbolic_dim_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let (g, w) = ew_graph();
    let e = aot::compile(
        &g,
        &w,
        &AotOptions {
            emit: Emit::Exe,
            output: dir.path().join("ew"),
            bindings: BTreeMap::new(),
            weights: WeightsMode::Embedded,
            runtime_lib: None,
            cpu: Default::default(),
        },
    )
    .unwrap_err();
    match &e {
        CpuError::Symbolic(s) => assert_eq!(s, &vec!["N".to_string()]),
        other => panic!("expected Symbolic, got {other}"),
    }
    assert!(e.to_string().contains("--bind N=1"), "{e}");
    assert!(!dir.path().join("ew").exists());

    // A missing weight is a compile-time error too.
    let e = aot::compile(
        &g,
        &Weights::new(),
        &AotOptions {
            emit: Emit::Exe,
            output: dir.path().join("ew"),
            bindings: binds(2),
            weights: WeightsMode::Embedded,
            runtime_lib: None,
            cpu: Default::default(),
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("parameter `w`: no weight given"), "{e}");
    // A runtime library that does not exist.
    let e = aot::compile(
        &g,
        &w,
        &AotOptions {
            emit: Emit::Exe,
            output: dir.path().join("ew"),
            bindings: binds(2),
            weights: WeightsMode::Embedded,
            runtime_lib: Some(dir.path().join("nope.a")),
            cpu: Default::default(),
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("nope.a"), "{e}");
}

/// The exe and the library (through the C example) of an MLP and a CNN match the reference
/// backend and the JIT.
#[test]
fn mlp_and_cnn_match_reference_and_jit() {
    let dir = tempfile::tempdir().unwrap();
    for (text, input, shape) in [(MLP, "x", vec![3usize, 6]), (CNN, "x", vec![3, 1, 8, 8])] {
        let (g, w) = with_weights(text);
        let name = g.name().to_string();
        let n = shape.iter().product();
        let inputs = BTreeMap::from([(input.to_string(), TensorData::from_vec(shape, values(n, 7)).unwrap())]);
        let want = reference(&g, &w, &inputs);
        let jit = CpuBackend::new().compile(&g, &w).unwrap().run(&inputs).unwrap();

        let exe = dir.path().join(&name);
        let report = compile(&g, &w, Emit::Exe, &exe, WeightsMode::Embedded);
        assert!(
            report.functions > 0,
            "{name}: no generated functions: {:?}",
            report.interpreted
        );
        let files = write_inputs(dir.path(), &inputs);
        let out = dir.path().join(format!("{name}-out"));
        ok(&run(
            &exe,
            &[files[input].to_str().unwrap(), "-o", out.to_str().unwrap()],
        ));
        for (o, t) in &want {
            let got = oar_ir::npy::read_npy(&out.join(format!("{o}.npy"))).unwrap();
            assert_close(&got, t, &format!("{name} exe {o} vs reference"));
            let j = &jit.iter().find(|(n, _)| n == o).unwrap().1;
            assert_close(&got, j, &format!("{name} exe {o} vs JIT"));
        }
        // The same binary through the runtime's AVX2 and baseline kernel instances (what it
        // picks on an older CPU; OAR_CPU_SIMD only narrows the host's choice).
        for simd in ["avx2", "baseline"] {
            let out = dir.path().join(format!("{name}-{simd}"));
            let o = Command::new(&exe)
                .args([files[input].to_str().unwrap(), "-o", out.to_str().unwrap()])
                .env("OAR_CPU_SIMD", simd)
                .output()
                .unwrap();
            ok(&o);
            for (o, t) in &want {
                let got = oar_ir::npy::read_npy(&out.join(format!("{o}.npy"))).unwrap();
                assert_close(
                    &got,
                    t,
                    &format!("{name} exe {o} with OAR_CPU_SIMD={simd} vs reference"),
                );
            }
        }

        let so = dir.path().join(format!("{name}.so"));
        compile(&g, &w, Emit::So, &so, WeightsMode::External);
        let prog = dir.path().join(format!("run_{name}"));
        build_c(&example(), dir.path(), &format!("{name}.h"), &so, &prog);
        let bins = raw_inputs(dir.path(), &inputs, &[input]);
        let s = ok(&run(&prog, &[&bins[0]]));
        let got = parse_c_outputs(&s);
        for (o, t) in &want {
            let g = TensorData::from_f64_slice(t.dtype(), t.shape().to_vec(), &got[o].1).unwrap();
            assert_close(&g, t, &format!("{name} library {o} vs reference"));
        }
        let clif = dir.path().join(format!("{name}.clif"));
        let report = compile(&g, &w, Emit::Clif, &clif, WeightsMode::Embedded);
        let s = std::fs::read_to_string(&clif).unwrap();
        assert_eq!(s.matches("\nfunction ").count(), report.functions, "{s}");
        assert!(s.contains("gemm contraction"), "{s}");
    }
}

/// A model with `cond` and `while` as an executable: the regions are compiled into the same
/// object (their own programs in the blob, their constants among the weights) and the exe
/// matches the reference on both branches.
#[test]
fn control_flow_runs_compiled_in_an_executable() {
    let dir = tempfile::tempdir().unwrap();
    let g = oar_ir::text::parse_graph(crate::codegen::CONTROL_FLOW).unwrap();
    let w = Weights::from([(
        "w".to_string(),
        TensorData::from_vec(vec![4], vec![0.5f32, -1.0, 2.0, 0.25]).unwrap(),
    )]);
    let exe = dir.path().join("control");
    let report = compile(&g, &w, Emit::Exe, &exe, WeightsMode::Embedded);
    assert!(report.interpreted.is_empty(), "{:?}", report.interpreted);
    for p in [true, false] {
        let inputs = BTreeMap::from([
            ("p".to_string(), TensorData::from_vec(vec![], vec![p]).unwrap()),
            (
                "x".to_string(),
                TensorData::from_vec(vec![4], vec![0.1f32, -2.0, 1.5, 3.0]).unwrap(),
            ),
        ]);
        let want = reference(&g, &w, &inputs);
        let files = write_inputs(dir.path(), &inputs);
        let out = dir.path().join(format!("out{p}"));
        ok(&run(
            &exe,
            &[
                "-i",
                &arg("p", &files["p"]),
                "-i",
                &arg("x", &files["x"]),
                "-o",
                out.to_str().unwrap(),
            ],
        ));
        for (name, t) in &want {
            let got = oar_ir::npy::read_npy(&out.join(format!("{name}.npy"))).unwrap();
            assert_close(&got, t, &format!("exe {name} (p = {p}) vs reference"));
        }
    }
}

/// `CpuTarget::Portable` (the default) writes generated code any x86-64-v2 CPU runs: no VEX or
/// EVEX instruction (AVX, AVX2, FMA, AVX-512) in the object; `Native` on an AVX host uses them.
/// The runtime's kernels, linked in later, choose their instruction set when the binary runs.
#[cfg(target_arch = "x86_64")]
#[test]
fn portable_objects_use_no_avx() {
    let dir = tempfile::tempdir().unwrap();
    let (g, w) = with_weights(CNN);
    let vex = |cpu: aot::CpuTarget| -> Option<Vec<String>> {
        let obj = dir.path().join(format!("cnn-{cpu:?}.o"));
        let opts = AotOptions {
            emit: Emit::Obj,
            output: obj.clone(),
            bindings: binds(3),
            weights: WeightsMode::Embedded,
            runtime_lib: None,
            cpu,
        };
        aot::compile(&g, &w, &opts).unwrap();
        // objdump (binutils, which `cc` links with) prints one instruction per line.
        let o = Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(&obj)
            .output()
            .ok()?;
        assert!(o.status.success(), "objdump: {}", text(&o.stderr));
        let code = text(&o.stdout);
        assert!(code.lines().filter(|l| l.contains(":\t")).count() > 20, "{code}");
        Some(
            code.lines()
                .filter_map(|l| l.split('\t').nth(1))
                .filter(|m| m.starts_with('v'))
                .map(str::to_string)
                .collect(),
        )
    };
    let Some(portable) = vex(aot::CpuTarget::Portable) else {
        eprintln!("objdump not found: skipping the instruction check");
        return;
    };
    assert!(
        portable.is_empty(),
        "VEX/EVEX instructions in a portable object: {portable:?}"
    );
    if std::arch::is_x86_feature_detected!("avx") {
        let native = vex(aot::CpuTarget::Native).unwrap();
        assert!(!native.is_empty(), "a native object on an AVX host uses AVX encodings");
    }
}
