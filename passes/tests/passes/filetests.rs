//! File tests: each `passes/filetests/*.oir` file is a pipeline, an input graph and the expected
//! output, in the style of LLVM's FileCheck.
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

use oar_ir::text::{parse_graph, print_graph};
use oar_passes::{NumericsCheck, PassManager, SpecializeShapes, pass_by_name};
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

fn files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("passes/filetests exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "oir"))
        .collect();
    files.sort();
    files
}

#[test]
fn pass_file_tests() {
    let files = files();
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
