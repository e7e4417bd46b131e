//! Per-thread scratch vectors kept between kernel calls: a kernel that needs a patch matrix or
//! a product buffer takes one ([`Pooled::take`]) and gives it back when the guard drops, so
//! its pages are faulted in and zeroed once per thread, not on every call (a fresh
//! allocation of a few hundred KB is an `mmap` whose pages the kernel clears on first touch).
//! The contents of a taken vector are whatever the last user left: callers write every element
//! they read.

use std::any::Any;
use std::cell::RefCell;

/// Vectors kept per thread at most (the largest are kept).
const KEEP: usize = 8;

thread_local! {
    static POOL: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// A scratch vector of at least the length asked for, returned to the thread's pool on drop.
pub(crate) struct Pooled<T: Copy + Default + 'static>(Vec<T>);

impl<T: Copy + Default + 'static> Pooled<T> {
    /// A vector of `n` elements from the calling thread's pool (grown with defaults if the
    /// one found is shorter), or a new one.
    pub(crate) fn take(n: usize) -> Pooled<T> {
        let found = POOL.with_borrow_mut(|pool| {
            let at = pool.iter().position(|b| b.is::<Vec<T>>())?;
            pool.swap_remove(at).downcast::<Vec<T>>().ok()
        });
        let mut v = found.map(|b| *b).unwrap_or_default();
        if v.len() < n {
            v.resize(n, T::default());
        }
        v.truncate(n);
        Pooled(v)
    }
}

impl<T: Copy + Default + 'static> std::ops::Deref for Pooled<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Copy + Default + 'static> std::ops::DerefMut for Pooled<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T: Copy + Default + 'static> Drop for Pooled<T> {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        if v.capacity() == 0 {
            return;
        }
        // `try_with`: a thread being torn down just frees it.
        let _ = POOL.try_with(|pool| {
            let Ok(mut pool) = pool.try_borrow_mut() else {
                return;
            };
            pool.push(Box::new(v));
            if pool.len() > KEEP {
                // Drop the smallest.
                let bytes =
                    |b: &Box<dyn Any>| -> usize { b.downcast_ref::<Vec<T>>().map_or(usize::MAX, |v| v.capacity()) };
                if let Some((i, _)) = pool.iter().enumerate().min_by_key(|(_, b)| bytes(b)) {
                    pool.swap_remove(i);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_come_back_with_their_pages() {
        let ptr = {
            let mut a = Pooled::<f32>::take(1000);
            a[999] = 7.0;
            a.as_ptr()
        };
        // The same allocation, shortened: no new pages, old contents.
        let b = Pooled::<f32>::take(500);
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(b.len(), 500);
        // Another type gets its own; a longer one grows with zeros.
        let c = Pooled::<f64>::take(10);
        assert!(c.iter().all(|&v| v == 0.0));
        drop(b);
        let d = Pooled::<f32>::take(2000);
        assert_eq!(d.len(), 2000);
        assert_eq!(d[1500], 0.0);
    }
}
