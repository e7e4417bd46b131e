//! The NaN/Inf debug mode (Paddle's `FLAGS_check_nan_inf`): with `OAR_CHECK_NAN_INF=1` in the
//! environment, or inside [`check_nan_inf`]'s guard on this thread, eager ops, the reference
//! interpreter and every backend run through [`crate::runner`] stop at the first op (kernel)
//! whose float result holds a NaN or an infinity, with an error naming it.

use crate::TensorData;
use std::cell::Cell;
use std::sync::OnceLock;

thread_local! {
    static OVERRIDE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// True when results must be checked on this thread.
pub fn enabled() -> bool {
    OVERRIDE.with(Cell::get).unwrap_or_else(|| {
        static ENV: OnceLock<bool> = OnceLock::new();
        *ENV.get_or_init(|| {
            std::env::var("OAR_CHECK_NAN_INF").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "off"))
        })
    })
}

/// Turn the check on or off for this thread until the guard is dropped.
pub fn check_nan_inf(on: bool) -> Guard {
    Guard(OVERRIDE.with(|c| c.replace(Some(on))))
}

/// Restores the previous setting when dropped.
pub struct Guard(Option<bool>);

impl Drop for Guard {
    fn drop(&mut self) {
        OVERRIDE.with(|c| c.set(self.0));
    }
}

/// The first non-finite element of a float tensor: `(flat index, value)`.
pub fn first_non_finite(t: &TensorData) -> Option<(usize, f64)> {
    if !t.dtype().is_float() {
        return None;
    }
    let w = t.dtype().size_bytes();
    t.bytes()
        .chunks_exact(w)
        .map(|b| crate::tensor_data::read_as_f64(t.dtype(), b))
        .enumerate()
        .find(|(_, v)| !v.is_finite())
}

/// Where in the user's code the current call came from: the first stack frame whose source
/// is outside oar's crates, the standard library and other dependencies, as
/// `function (file:line:col)`. `None` in a build without line tables. Captures a backtrace:
/// for error paths only.
pub fn caller_location() -> Option<String> {
    use std::path::{Component, Path, PathBuf};
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    // oar's own sources (this workspace's library crates); its tests and examples are users.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf);
    let cwd = std::env::current_dir().ok();
    let internal = |file: &str| {
        // The C library's thread and process entry points (`./nptl/pthread_create.c`), which
        // a build without debug info for the user's code leaves as the only frames with a file.
        if file.starts_with("/rustc/")
            || file.contains("/.cargo/registry/")
            || file.contains("/.cargo/git/")
            || file.starts_with("./nptl/")
            || file.starts_with("./csu/")
            || file.contains("sysdeps/")
        {
            return true;
        }
        let path = Path::new(file);
        let abs: PathBuf = match (&cwd, path.is_relative()) {
            (Some(c), true) => c.join(path),
            _ => path.to_path_buf(),
        };
        let abs: PathBuf = abs.components().filter(|c| !matches!(c, Component::CurDir)).collect();
        root.as_ref().is_some_and(|r| {
            [
                "src",
                "ir",
                "passes",
                "backends",
                "onnx",
                "macros",
                "cli",
                "conformance",
            ]
            .iter()
            .any(|d| abs.starts_with(r.join(d)))
        })
    };
    let mut lines = trace.lines().map(str::trim).peekable();
    while let Some(line) = lines.next() {
        let Some((n, sym)) = line.split_once(": ") else {
            continue;
        };
        if n.parse::<usize>().is_err() {
            continue;
        }
        let Some(at) = lines.peek().and_then(|l| l.strip_prefix("at ")) else {
            continue;
        };
        // `file:line:col`
        let file = at.rsplitn(3, ':').nth(2).unwrap_or(at);
        if !internal(file) {
            return Some(format!("{sym} ({at})"));
        }
    }
    None
}

/// The standard message for a non-finite result `(index, value)`.
pub fn describe(index: usize, value: f64) -> String {
    format!("produced {value} at element {index} (OAR_CHECK_NAN_INF)")
}
