//! Counting rewrites, so a pass can stop after step N (bisecting a bad rewrite by step).

/// What a step-limited run of a pass did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRun {
    /// Whether the graph changed.
    pub changed: bool,
    /// Rewrites applied, or `None` for a pass that does not count its rewrites.
    pub steps: Option<usize>,
}

/// A budget of rewrites: each rewrite asks [`StepBudget::take`] first and is skipped (with
/// all later ones) once the limit is reached.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepBudget {
    limit: Option<usize>,
    done: usize,
}

impl StepBudget {
    /// At most `limit` rewrites (`None`: no limit).
    pub fn new(limit: Option<usize>) -> StepBudget {
        StepBudget { limit, done: 0 }
    }

    /// True (and counts one step) if another rewrite is allowed.
    pub fn take(&mut self) -> bool {
        if self.limit.is_some_and(|l| self.done >= l) {
            return false;
        }
        self.done += 1;
        true
    }

    /// True once the limit is reached.
    pub fn exhausted(&self) -> bool {
        self.limit.is_some_and(|l| self.done >= l)
    }

    /// Rewrites applied so far.
    pub fn done(&self) -> usize {
        self.done
    }

    /// The result of a run that applied `self.done()` rewrites.
    pub fn run(&self) -> StepRun {
        StepRun {
            changed: self.done > 0,
            steps: Some(self.done),
        }
    }
}
