//! File tests: each `passes/filetests/*.oir` file is a pipeline, an input graph and the expected
//! output, in the style of LLVM's FileCheck; each `passes/filetests/*.okt` file the same for a
//! kernel program (the text `KernelProgram` prints) and the kernel-level transforms
//! (`legalize`, `legalize{NanMinMax,SaturatingCast}` with those natives, `split-stages`),
//! checked numerically on the reference's kernel interpreter (inputs drawn in [-3, 3]; floats
//! within 1e-6 relative, the legalized math's accuracy; everything else exactly).
//!
//! ```text
//! // RUN: canonicalize,fold
//! graph @g { ... }
//! // CHECK: %0 = constant dense<3.0>
//! // CHECK-NEXT: output "y" = %0
//! // CHECK-NOT: add(
//! ```
//!
//! - `// RUN:` lines (joined with commas) name the passes; `specialize-shapes{N=8,M=2}` binds
//!   symbols. The directives are comments, so the whole file is the input IR text.
//! - The pipeline runs with verification after each pass and the numerics check (reference
//!   backend, default tolerances), so every file test is also a numeric test of its passes.
//! - `CHECK:` matches a substring on a line after the previous match; `CHECK-NEXT:` on the line
//!   right after it; `CHECK-NOT:` must not occur between the previous match and the next
//!   positive match (or the end of the output).

use oar_backend_reference::run_kernel_program;
use oar_ir::kernel::{BufferKind, KernelProgram};
use oar_ir::text::{parse_graph, parse_kernel_program, print_graph};
use oar_ir::{TensorData, Weights};
use oar_passes::legalize::{Expand, Natives, legalize};
use oar_passes::{NumericsCheck, PassManager, SpecializeShapes, pass_by_name};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One directive of a file test.
#[derive(Debug)]
enum Check {
    Find(String),
    Next(String),
    Not(String),
}

/// The pipeline (pass specs) and checks of a file.
fn directives(text: &str) -> (Vec<String>, Vec<Check>) {
    let (mut passes, mut checks) = (Vec::new(), Vec::new());
    for line in text.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("//") else { continue };
        let rest = rest.trim_start();
        if let Some(p) = rest.strip_prefix("RUN:") {
            passes.extend(split_pipeline(p));
        } else if let Some(s) = rest.strip_prefix("CHECK-NEXT:") {
            checks.push(Check::Next(s.trim().to_string()));
        } else if let Some(s) = rest.strip_prefix("CHECK-NOT:") {
            checks.push(Check::Not(s.trim().to_string()));
        } else if let Some(s) = rest.strip_prefix("CHECK:") {
            checks.push(Check::Find(s.trim().to_string()));
        }
    }
    (passes, checks)
}

/// Split `a,b{N=8,M=2},c` at the commas outside braces.
fn split_pipeline(p: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in p.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// A pass manager for the specs, and the numerics check matching its bindings.
fn pipeline(specs: &[String]) -> Result<PassManager, String> {
    let mut pm = PassManager::new();
    let mut check = NumericsCheck::new();
    for spec in specs {
        if let Some(binds) = spec
            .strip_prefix("specialize-shapes{")
            .and_then(|s| s.strip_suffix('}'))
        {
            let mut pairs = Vec::new();
            for b in binds.split(',') {
                let (k, v) = b.split_once('=').ok_or(format!("bad binding `{b}`"))?;
                let n: usize = v.trim().parse().map_err(|_| format!("bad size in `{b}`"))?;
                check = check.bind(k.trim(), n);
                pairs.push((k.trim().to_string(), n));
            }
            pm.add(SpecializeShapes::new(pairs));
        } else {
            pm.add_boxed(pass_by_name(spec).ok_or(format!("unknown pass `{spec}`"))?);
        }
    }
    pm.verify_each(true).check_numerics(check);
    Ok(pm)
}

/// Match `checks` against `output`, FileCheck style.
fn file_check(output: &str, checks: &[Check]) -> Result<(), String> {
    let lines: Vec<&str> = output.lines().collect();
    // Index of the line after the last match; `last` is the last matched line.
    let mut next = 0usize;
    let mut last: Option<usize> = None;
    let mut pending_not: Vec<&str> = Vec::new();
    let forbid = |nots: &[&str], from: usize, to: usize| -> Result<(), String> {
        for n in nots {
            if let Some(i) = (from..to).find(|&i| lines[i].contains(n)) {
                return Err(format!("CHECK-NOT: `{n}` found on output line {}: {}", i + 1, lines[i]));
            }
        }
        Ok(())
    };
    for c in checks {
        match c {
            Check::Not(s) => pending_not.push(s),
            Check::Find(s) => {
                let i = (next..lines.len())
                    .find(|&i| lines[i].contains(s.as_str()))
                    .ok_or(format!("CHECK: `{s}` not found after output line {next}"))?;
                forbid(&pending_not, next, i)?;
                pending_not.clear();
                (next, last) = (i + 1, Some(i));
            }
            Check::Next(s) => {
                let i = last.map_or(0, |l| l + 1);
                if !lines.get(i).is_some_and(|l| l.contains(s.as_str())) {
                    return Err(format!(
                        "CHECK-NEXT: `{s}` not on output line {}: {:?}",
                        i + 1,
                        lines.get(i)
                    ));
                }
                forbid(&pending_not, next, i)?;
                pending_not.clear();
                (next, last) = (i + 1, Some(i));
            }
        }
    }
    forbid(&pending_not, next, lines.len())
}

/// Run one file test; the error says what failed and shows the output.
fn run_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (specs, checks) = directives(&text);
    if specs.is_empty() || checks.is_empty() {
        return Err("needs a `// RUN:` line and at least one `// CHECK` line".into());
    }
    let mut graph = parse_graph(&text).map_err(|e| format!("parse: {e}"))?;
    let mut pm = pipeline(&specs)?;
    pm.run(&mut graph).map_err(|e| e.to_string())?;
    let out = print_graph(&graph);
    file_check(&out, &checks).map_err(|e| format!("{e}\n--- output ---\n{out}"))
}

/// Apply one kernel-level transform spec.
fn kernel_transform(p: &mut KernelProgram, spec: &str) -> Result<(), String> {
    if spec == "split-stages" {
        *p = p.split_stages()?;
        return Ok(());
    }
    let natives = match spec.strip_prefix("legalize") {
        Some("") => Natives::none(),
        Some(r) => {
            let list = r
                .strip_prefix('{')
                .and_then(|r| r.strip_suffix('}'))
                .ok_or(format!("bad `{spec}`"))?;
            let ops: Vec<Expand> = list
                .split(',')
                .map(|n| Expand::from_name(n.trim()).ok_or(format!("unknown expansion `{n}`")))
                .collect::<Result<_, _>>()?;
            Natives::of(&ops)
        }
        None => return Err(format!("unknown kernel transform `{spec}`")),
    };
    legalize(p, &natives);
    Ok(())
}

/// Inputs for every input buffer of `p` (static shapes), drawn in [-3, 3].
fn kernel_feeds(p: &KernelProgram) -> Result<BTreeMap<String, TensorData>, String> {
    let mut feeds = BTreeMap::new();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for b in &p.buffers {
        if let BufferKind::Input { name } = &b.kind {
            let shape =
                b.ty.shape
                    .as_static()
                    .ok_or(format!("input {name} has a symbolic shape"))?;
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((state >> 11) as f64 / (1u64 << 53) as f64) * 6.0 - 3.0
                })
                .collect();
            feeds.insert(
                name.clone(),
                TensorData::from_f64_slice(b.ty.dtype, shape, &v).map_err(|e| e.to_string())?,
            );
        }
    }
    Ok(feeds)
}

/// Run one kernel file test: parse, transform, check the text, compare the numerics.
fn run_kernel_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (specs, checks) = directives(&text);
    if specs.is_empty() || checks.is_empty() {
        return Err("needs a `// RUN:` line and at least one `// CHECK` line".into());
    }
    let before = parse_kernel_program(&text).map_err(|e| format!("parse: {e}"))?;
    let mut p = before.clone();
    for spec in &specs {
        kernel_transform(&mut p, spec)?;
    }
    let out = p.to_string();
    file_check(&out, &checks).map_err(|e| format!("{e}\n--- output ---\n{out}"))?;
    let feeds = kernel_feeds(&before)?;
    let want = run_kernel_program(&before, &Weights::new(), &feeds).map_err(|e| e.to_string())?;
    let got = run_kernel_program(&p, &Weights::new(), &feeds).map_err(|e| e.to_string())?;
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        let float = w.dtype().is_float();
        for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            let ok = if float && b.is_finite() {
                (a - b).abs() <= 1e-6 * b.abs().max(1e-30)
            } else {
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
            };
            if !ok {
                return Err(format!("{name}[{i}]: {a} after the transforms, {b} before\n{out}"));
            }
        }
    }
    Ok(())
}

fn files(ext: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("passes/filetests exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

#[test]
fn kernel_file_tests() {
    let files = files("okt");
    assert!(
        files.len() >= 3,
        "expected the kernel file tests, found {}",
        files.len()
    );
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| run_kernel_file(f).err().map(|e| format!("{}: {e}", f.display())))
        .collect();
    assert!(
        failures.is_empty(),
        "{} kernel file test(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn pass_file_tests() {
    let files = files("oir");
    assert!(files.len() >= 12, "expected the file tests, found {}", files.len());
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| run_file(f).err().map(|e| format!("{}: {e}", f.display())))
        .collect();
    assert!(
        failures.is_empty(),
        "{} file test(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn file_check_semantics() {
    let out = "a\nb x\nc\nd";
    let ok = |c: Vec<Check>| file_check(out, &c);
    assert!(ok(vec![Check::Find("b".into()), Check::Next("c".into())]).is_ok());
    assert!(ok(vec![Check::Find("a".into()), Check::Next("c".into())]).is_err());
    assert!(
        ok(vec![Check::Find("c".into()), Check::Find("b".into())]).is_err(),
        "order matters"
    );
    assert!(
        ok(vec![
            Check::Find("a".into()),
            Check::Not("x".into()),
            Check::Find("d".into())
        ])
        .is_err()
    );
    assert!(ok(vec![Check::Find("c".into()), Check::Not("x".into())]).is_ok());
    assert!(ok(vec![Check::Not("zz".into())]).is_ok());
    assert_eq!(
        split_pipeline("fold, specialize-shapes{N=8,M=2},cse"),
        ["fold", "specialize-shapes{N=8,M=2}", "cse"]
    );
}

/// The kernel text form round-trips: every op sample and every pass file test's graph
/// (symbols bound to 3), lowered to kernels, printed, parsed back — equal to the original.
#[test]
fn kernel_text_round_trips() {
    use oar_ir::{Graph, Op, TensorType};
    let check = |what: &str, p: &KernelProgram| {
        let regions = p
            .kernels
            .iter()
            .any(|k| matches!(&k.body, oar_ir::kernel::KernelBody::Opaque(o) if !o.regions.is_empty()));
        if regions {
            return; // cond/while regions have no kernel text form
        }
        let text = p.to_string();
        let q = parse_kernel_program(&text).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
        assert!(q == *p, "{what}: the parsed program differs\n{text}\n---\n{q}");
    };
    let mut n = 0;
    for s in Op::all_samples() {
        let mut g = Graph::new("sample");
        let ins: Vec<_> = s
            .inputs
            .iter()
            .enumerate()
            .map(|(i, x)| {
                g.add_input(&format!("x{i}"), TensorType::of(x.dtype, &x.shape))
                    .unwrap()
            })
            .collect();
        for (i, v) in g.add_op(s.op.clone(), &ins).unwrap().into_iter().enumerate() {
            g.add_output(&format!("y{i}"), v).unwrap();
        }
        let p = oar_passes::fuse::lower_to_kernels(&g, &BTreeMap::new()).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        check(&s.name, &p);
        n += 1;
    }
    for f in files("oir") {
        let g = parse_graph(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let binds: BTreeMap<String, usize> = g
            .input_specs()
            .iter()
            .flat_map(|(_, t)| t.shape.dims().to_vec())
            .flat_map(|d| d.symbols())
            .map(|s| (s, 3))
            .collect();
        let p = oar_passes::fuse::lower_to_kernels(&g, &binds).unwrap();
        check(&f.display().to_string(), &p);
        n += 1;
    }
    assert!(n > 40, "{n} programs");
}
