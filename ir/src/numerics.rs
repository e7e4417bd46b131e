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
    t.to_f64_vec().into_iter().enumerate().find(|(_, v)| !v.is_finite())
}

/// The standard message for a non-finite result `(index, value)`.
pub fn describe(index: usize, value: f64) -> String {
    format!("produced {value} at element {index} (OAR_CHECK_NAN_INF)")
}
