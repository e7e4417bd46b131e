//! Dispatch interception: how a tracer takes over eager ops without `tensor` knowing it.
//!
//! Every eager op goes through `tensor::apply`. An [`Interceptor`] — the tracer of
//! `jit::to_static` is the one oar has — receives the op instead of the kernels when one of its
//! inputs carries a [`Traced`] link to it, or when it is the interceptor current on this thread
//! ([`Guard::enter`]). Tensors it returns carry [`Traced`] links instead of data. `tensor`
//! depends on nothing of `jit`; `jit` implements the trait.

use super::Tensor;
use crate::error::Result;
use oar_ir::{DType, Dim, Op, TensorType, ValueId};
use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

/// Something that records ops instead of running them.
pub(crate) trait Interceptor: Send + Sync {
    /// Take `op` on `inputs` (instead of computing it); returns the results' tensors.
    fn intercept(self: Arc<Self>, op: Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>>;
    /// The type of value `v` with its symbolic dims (gradient rules read it while tracing).
    fn symbolic_type(&self, v: ValueId) -> TensorType;
    /// `self` as `Any`, so the interceptor's own module can recover its type.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// A tensor's link to the interceptor that made it: which of its values it is, and its type
/// (with its symbolic dims: `N`, `N*C`).
#[derive(Clone)]
pub(crate) struct Traced {
    pub(crate) ctx: Arc<dyn Interceptor>,
    pub(crate) value: ValueId,
    pub(crate) dtype: DType,
    pub(crate) dims: Vec<Dim>,
}

/// What [`Tensor::shape`] reads for a symbolic dim while tracing: larger than any tensor oar
/// allocates, so a size computed from it is caught ([`check_sizes`]) instead of being baked into
/// the graph as a number. Symbolic-aware code reads [`Tensor::dims`].
pub const SYMBOLIC_SIZE: usize = 1 << 40;

/// Sizes at or above this, seen while tracing, come from [`SYMBOLIC_SIZE`] (`n`, `n * 784`,
/// `n / 4`).
const SYMBOLIC_THRESHOLD: usize = 1 << 31;

/// An error if a trace is running and `sizes` holds a size derived from a symbolic dim read
/// through `shape()`.
pub(crate) fn check_sizes(op: &str, sizes: impl IntoIterator<Item = usize>) -> Result<()> {
    if current().is_some() && sizes.into_iter().any(|s| s >= SYMBOLIC_THRESHOLD) {
        return Err(crate::error::Error::invalid(
            op,
            "a size computed from a symbolic dim read with `shape()` while tracing; use `dims()` (symbolic \
             sizes such as N or N*C), `reshape` with 0/-1, or `full_dims`",
        ));
    }
    Ok(())
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<dyn Interceptor>>> = const { RefCell::new(None) };
}

/// The interceptor running on this thread, if any: while it runs, every op goes to it, even
/// one whose inputs are all eager (e.g. a parameter broadcast to the batch size).
pub(crate) fn current() -> Option<Arc<dyn Interceptor>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Makes an interceptor the current one until dropped (then the previous one is again).
pub(crate) struct Guard(Option<Arc<dyn Interceptor>>);

impl Guard {
    pub(crate) fn enter(i: Arc<dyn Interceptor>) -> Guard {
        Guard(CURRENT.with(|c| c.replace(Some(i))))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = self.0.take());
    }
}
