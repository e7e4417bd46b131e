//! Helpers shared by the CLI tests: run the `oar` binary and read what it printed.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Run the `oar` binary.
pub fn oar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(args)
        .output()
        .expect("run oar")
}

/// A command's standard output.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's standard error.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failing command prints exactly one `error:` line and no panic.
pub fn assert_clean_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success: {err}");
    assert_eq!(err.lines().count(), 1, "one line expected: {err}");
    assert!(
        err.starts_with("error: ") && err.contains(needle),
        "{err:?} should mention {needle:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
