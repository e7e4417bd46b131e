//! Argument types that accept one number or one per axis, as Paddle's `int | list` arguments.

/// One size per spatial axis: `3` or `[3, 2]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair(pub [usize; 2]);

impl From<usize> for Pair {
    fn from(v: usize) -> Pair {
        Pair([v, v])
    }
}

impl From<[usize; 2]> for Pair {
    fn from(v: [usize; 2]) -> Pair {
        Pair(v)
    }
}

/// 2-d padding `(top, left, bottom, right)`: `1`, `[ph, pw]`, or `[top, left, bottom, right]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pad2d(pub [usize; 4]);

impl From<usize> for Pad2d {
    fn from(v: usize) -> Pad2d {
        Pad2d([v; 4])
    }
}

impl From<[usize; 2]> for Pad2d {
    fn from(v: [usize; 2]) -> Pad2d {
        Pad2d([v[0], v[1], v[0], v[1]])
    }
}

impl From<[usize; 4]> for Pad2d {
    fn from(v: [usize; 4]) -> Pad2d {
        Pad2d(v)
    }
}
