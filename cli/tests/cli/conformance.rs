//! `oar conformance`: listing, running, and its errors.

use crate::common::{assert_clean_error, oar as oar_cli, stdout};

#[test]
fn cli_runs_lists_and_reports_errors() {
    let o = oar_cli(&[
        "conformance",
        "--backend",
        "reference",
        "--section",
        "ops",
        "--filter",
        "unary/exp/",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("unary/exp/f32 ") && out.contains("OK: backend `reference`"),
        "{out}"
    );
    assert!(!out.contains("patterns"), "{out}");
    let o = oar_cli(&["conformance", "--list", "--section", "models"]);
    let out = stdout(&o);
    assert!(o.status.success() && out.lines().count() == 5, "{out}");
    assert!(out.lines().all(|l| l.starts_with("models/")), "{out}");
    assert_clean_error(
        &oar_cli(&["conformance", "--backend", "nonexistent", "--filter", "unary/exp/f32"]),
        "no backend named `nonexistent`",
    );
    // `--target` is an alias of `--backend`; an unknown name lists the registered backends.
    let o = oar_cli(&["conformance", "--target", "reference", "--filter", "unary/exp/f32"]);
    assert!(
        o.status.success() && stdout(&o).contains("OK: backend `reference`"),
        "{}",
        stdout(&o)
    );
    assert_clean_error(
        &oar_cli(&["conformance", "--target", "nonexistent", "--filter", "unary/exp/f32"]),
        "(registered: reference, cpu",
    );
    assert_clean_error(
        &oar_cli(&["conformance", "--filter", "no such case"]),
        "no conformance case",
    );
    let o = oar_cli(&["conformance", "--section", "layers"]);
    assert!(!o.status.success());
    assert!(crate::common::stderr(&o).contains("unknown section `layers`"));
}
