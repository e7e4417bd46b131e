//! `oar compile`: ahead-of-time executables, libraries, objects and CLIF listings from the
//! command line; outputs checked against the reference backend (relative tolerance 1e-4).

use crate::common::{assert_clean_error, oar, stderr, stdout};
use oar::ir::file::Model;
use oar::ir::{TensorData, Weights};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Elementwise ops and a reduction (a scaled row softmax and a column max), with a
/// parameter and a symbolic batch dim.
const EW: &str = r#"
graph @ew {
  %x = input "x" : f32[N,3]
  %s = param "s" : f32[3]
  %0 = mul(%x, %s) : f32[N,3]
  %1 = exp(%0) : f32[N,3]
  %2 = reduce_sum(%1) {axes = [1], keepdim = true} : f32[N,1]
  %3 = div(%1, %2) : f32[N,3]
  %4 = reduce_max(%x) {axes = [0], keepdim = false} : f32[3]
  output "p" = %3
  output "m" = %4
}
"#;

fn model(dir: &Path) -> (PathBuf, Model) {
    let graph = oar::ir::text::parse_graph(EW).unwrap();
    let weights = Weights::from([(
        "s".to_string(),
        TensorData::from_vec(vec![3], vec![1.0f32, -0.5, 2.0]).unwrap(),
    )]);
    let path = dir.join("ew.oar");
    let m = Model { graph, weights };
    m.save(&path).unwrap();
    (path, m)
}

fn input() -> TensorData {
    TensorData::from_vec(vec![2, 3], vec![0.1f32, -0.7, 0.3, 1.2, 0.0, -0.4]).unwrap()
}

fn assert_close(got: &TensorData, want: &TensorData, what: &str) {
    assert_eq!(got.tensor_type(), want.tensor_type(), "{what}");
    for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!((a - b).abs() <= 1e-4 * b.abs() + 1e-6, "{what}[{i}]: got {a}, want {b}");
    }
}

/// Run executable `exe` on [`input`] (written to `dir/x.npy`); returns that path and, per
/// output of `model`, what the executable wrote and what the reference computes.
fn run_exe(exe: &Path, dir: &Path, model: &Model) -> (PathBuf, Vec<(String, TensorData, TensorData)>) {
    let x = dir.join("x.npy");
    oar::ir::npy::write_npy(&x, &input()).unwrap();
    let out = dir.join("out");
    let r = Command::new(exe)
        .args([x.to_str().unwrap(), "--output-dir", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let inputs = BTreeMap::from([("x".to_string(), input())]);
    let want = oar_backend_reference::run_graph(&model.graph, &model.weights, &inputs).unwrap();
    let outputs = want
        .into_iter()
        .map(|(name, t)| {
            let got = oar::ir::npy::read_npy(&out.join(format!("{name}.npy"))).unwrap();
            (name, got, t)
        })
        .collect();
    (x, outputs)
}

/// [`run_exe`], checking the outputs against the reference's (relative tolerance 1e-4).
fn run_and_check(exe: &Path, dir: &Path, model: &Model) -> PathBuf {
    let (x, outputs) = run_exe(exe, dir, model);
    for (name, got, want) in &outputs {
        assert_close(got, want, name);
    }
    x
}

#[test]
fn compile_exe_and_run_it() {
    let dir = tempfile::tempdir().unwrap();
    let (m, model) = model(dir.path());
    let exe = dir.path().join("ew");
    let o = oar(&[
        "compile",
        m.to_str().unwrap(),
        "--target",
        "cpu",
        "--emit",
        "exe",
        "-o",
        exe.to_str().unwrap(),
        "--bind",
        "N=2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains(&format!("wrote {}", exe.display())), "{s}");

    let x = run_and_check(&exe, dir.path(), &model);

    // `--weights FILE` replaces the parameters: it must hold exactly the model's tensors
    // (reliability reproducer 07: empty, foreign or partial files ran with exit 0).
    let write = |name: &str, w: Weights| {
        let p = dir.path().join(name);
        std::fs::write(&p, oar::ir::file::encode_weights(&w).unwrap()).unwrap();
        p
    };
    let s3 = |v: [f32; 3]| TensorData::from_vec(vec![3], v.to_vec()).unwrap();
    let cases = [
        (write("empty.st", Weights::new()), "missing parameters"),
        (
            write(
                "foreign.st",
                Weights::from([("s".to_string(), s3([1.0; 3])), ("t".to_string(), s3([1.0; 3]))]),
            ),
            "does not have",
        ),
        (
            write(
                "shape.st",
                Weights::from([("s".to_string(), TensorData::from_vec(vec![1], vec![1.0f32]).unwrap())]),
            ),
            "expected f32[3]",
        ),
    ];
    for (file, needle) in &cases {
        let r = Command::new(&exe)
            .args([x.to_str().unwrap(), "--weights", file.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success() && err.contains(needle), "{}: {err}", file.display());
    }
    // Bounded command-line values: a clear usage error, not an allocation or thousands of threads.
    for bad in [
        ["--bench", "18446744073709551615"],
        ["--threads", "100000"],
        ["--threads", "0"],
    ] {
        let r = Command::new(&exe).arg(x.to_str().unwrap()).args(bad).output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains(bad[0]) && !err.contains("panicked"), "{bad:?}: {err}");
    }
    let good = write("good.st", Weights::from([("s".to_string(), s3([2.0, 2.0, 2.0]))]));
    let r = Command::new(&exe)
        .args([x.to_str().unwrap(), "--weights", good.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

/// An installed `oar` — copied away from target/, where cargo leaves the runtime's static
/// library — links executables and shared libraries with the runtime library it carries
/// (`embedded_runtime!()`), and the executable matches the reference.
#[test]
fn oar_copied_away_from_target_links_with_the_runtime_it_carries() {
    let dir = tempfile::tempdir().unwrap();
    let (m, model) = model(dir.path());
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let installed = bin.join("oar");
    std::fs::copy(env!("CARGO_BIN_EXE_oar"), &installed).unwrap();
    let compile = |emit: &str, out: &Path| {
        let o = Command::new(&installed)
            .args(["compile", m.to_str().unwrap(), "--emit", emit, "-o"])
            .arg(out)
            .args(["--bind", "N=2"])
            .env_remove("OAR_CPU_RUNTIME_LIB")
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "--emit {emit}: {}", stderr(&o));
    };
    let exe = dir.path().join("ew");
    compile("exe", &exe);
    run_and_check(&exe, dir.path(), &model);
    let so = dir.path().join("libew.so");
    compile("so", &so);
    assert!(std::fs::metadata(&so).unwrap().len() > 0);
    // Nothing left behind but what was asked for (the unpacked archive lives in the link's
    // scratch directory).
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["bin", "ew", "ew.oar", "libew.h", "libew.so", "out", "x.npy"]);
}

#[test]
fn compile_so_obj_clif_and_external_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = model(dir.path());
    let m = m.to_str().unwrap();
    let so = dir.path().join("libew.so");
    let o = oar(&[
        "compile",
        m,
        "--emit",
        "so",
        "-o",
        so.to_str().unwrap(),
        "--bind",
        "N=4",
        "--weights",
        "external",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(so.is_file());
    let h = std::fs::read_to_string(dir.path().join("libew.h")).unwrap();
    assert!(h.contains("#define OAR_MODEL_INPUT0_SHAPE {4, 3}"), "{h}");
    assert!(h.contains("#define OAR_MODEL_EXTERNAL_WEIGHTS 1"), "{h}");
    let w = std::fs::read(dir.path().join("libew.so.weights")).unwrap();
    let w = oar::ir::file::decode_weights(&w).unwrap();
    assert_eq!(w.keys().collect::<Vec<_>>(), vec!["s"]);

    let obj = dir.path().join("ew.o");
    let o = oar(&[
        "compile",
        m,
        "--emit",
        "obj",
        "-o",
        obj.to_str().unwrap(),
        "--bind",
        "N=1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(&std::fs::read(&obj).unwrap()[..4], b"\x7fELF");

    let clif = dir.path().join("ew.clif");
    let o = oar(&[
        "compile",
        m,
        "--emit",
        "clif",
        "-o",
        clif.to_str().unwrap(),
        "--bind",
        "N=1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = std::fs::read_to_string(&clif).unwrap();
    assert!(s.starts_with("; oar model `ew`:"), "{s}");
    assert!(stdout(&o).contains("kernels:"), "{}", stdout(&o));
}

#[test]
fn compile_errors_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = model(dir.path());
    let m = m.to_str().unwrap();
    let out = dir.path().join("ew");
    let out = out.to_str().unwrap();
    assert_clean_error(&oar(&["compile", m, "-o", out]), "--bind N=1");
    assert_clean_error(&oar(&["compile", m, "-o", out, "--bind", "N"]), "SYM=SIZE");
    assert_clean_error(&oar(&["compile", "/no/such.oar", "-o", out]), "/no/such.oar");
    assert_clean_error(
        &oar(&["compile", m, "-o", out, "--bind", "N=1", "--runtime-lib", "/no/rt.a"]),
        "/no/rt.a",
    );
    // An unknown emit kind is a usage error.
    let o = oar(&["compile", m, "-o", out, "--emit", "dll"]);
    assert!(!o.status.success() && stderr(&o).contains("dll"), "{}", stderr(&o));
    assert!(!Path::new(out).exists());
}

/// The ONNX path end to end: `oar import resnet18.onnx` (the committed reduced-width torchvision
/// ResNet-18), then `oar compile --emit exe`, then the executable on the committed input; its
/// output matches onnxruntime's committed output within 1e-4 relative (+1e-5 absolute).
#[test]
fn import_onnx_resnet18_then_compile_and_run() {
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../onnx/tests/models");
    let dir = tempfile::tempdir().unwrap();
    let oar_file = dir.path().join("resnet18.oar");
    let o = oar(&[
        "import",
        models.join("resnet18.onnx").to_str().unwrap(),
        "-o",
        oar_file.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let exe = dir.path().join("resnet18");
    let o = oar(&[
        "compile",
        oar_file.to_str().unwrap(),
        "--target",
        "cpu",
        "--emit",
        "exe",
        "-o",
        exe.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("out");
    let input = models.join("resnet18.input_0.npy");
    let r = Command::new(&exe)
        .args([
            "--input",
            &format!("input_0={}", input.display()),
            "--output-dir",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let got = oar::ir::npy::read_npy(&out.join("output_0.npy")).unwrap();
    let want = oar::ir::npy::read_npy(&models.join("resnet18.output_0.npy")).unwrap();
    assert_eq!(got.tensor_type(), want.tensor_type());
    for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs() + 1e-5,
            "output_0[{i}]: got {a}, onnxruntime {b}"
        );
    }
}

/// `oar opt --pass amp=bf16` and `oar compile --precision bf16`: the matmul runs in bf16
/// (casts in the IR), the signature stays f32, and the executable's outputs are within bf16's
/// precision of the f32 reference — and not equal to it (the low precision is really used).
#[test]
fn amp_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = oar::ir::Graph::new("mm");
    let x = g
        .add_input("x", oar::ir::TensorType::of(oar::ir::DType::F32, &[2, 3]))
        .unwrap();
    let w = g
        .add_param("w", oar::ir::TensorType::of(oar::ir::DType::F32, &[3, 4]))
        .unwrap();
    let y = g.add_op1(oar::ir::Op::MatMul, &[x, w]).unwrap();
    let s = g
        .add_op1(
            oar::ir::Op::Composite(oar::ir::Composite::Softmax(oar::ir::ops::Softmax { axis: 1 })),
            &[y],
        )
        .unwrap();
    g.add_output("y", y).unwrap();
    g.add_output("s", s).unwrap();
    let wv: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
    let model = Model {
        graph: g,
        weights: Weights::from([("w".to_string(), TensorData::from_vec(vec![3, 4], wv).unwrap())]),
    };
    let m = dir.path().join("mm.oar");
    model.save(&m).unwrap();
    let opt = oar(&["opt", m.to_str().unwrap(), "--pass", "amp=bf16"]);
    assert!(opt.status.success(), "{}", stderr(&opt));
    let ir = stdout(&opt);
    assert!(ir.contains("matmul(") && ir.contains(": bf16[2,4]"), "{ir}");
    assert!(ir.contains("softmax(") && ir.contains("output \"y\""), "{ir}");
    let bad = oar(&["opt", m.to_str().unwrap(), "--pass", "amp=f64"]);
    assert_clean_error(&bad, "amp");

    let exe = dir.path().join("mm");
    let o = oar(&[
        "compile",
        m.to_str().unwrap(),
        "--precision",
        "bf16",
        "-o",
        exe.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, outputs) = run_exe(&exe, dir.path(), &model);
    for (name, got, want) in &outputs {
        assert_eq!(got.tensor_type(), want.tensor_type(), "{name}: the signature is kept");
        let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
        let err = a.iter().zip(&b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        // bf16 operands: relative error ≤ 2^-8 each, three products summed.
        assert!(err <= 2e-2 && err > 0.0, "{name}: max error {err}");
    }
}
