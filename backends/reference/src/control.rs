//! Control flow: `cond` and `while`, evaluating their regions recursively.
//!
//! Region nesting depth is bounded by the verifier, so recursion is bounded too; a `while`
//! that runs more than the configured number of iterations is an error, never a hang.

use crate::interp::{Bindings, Interp};
use crate::value::{Res, Site, Value};
use oar_ir::graph::Node;

impl Interp<'_> {
    /// `cond(pred, args...)`: region 0 if `pred`, else region 1.
    pub(crate) fn cond(&self, node: &Node, ins: &[&Value], site: &Site, binds: &Bindings) -> Res<Vec<Value>> {
        let (pred, args) = ins.split_first().ok_or_else(|| site.err("cond needs a predicate"))?;
        let p = pred.as_b(site, "predicate")?;
        let take = match p.iter().next() {
            Some(&b) if p.len() == 1 => b,
            _ => return Err(site.err(format!("predicate must be a bool scalar, got shape {:?}", p.shape()))),
        };
        let region = node
            .regions
            .get(if take { 0 } else { 1 })
            .ok_or_else(|| site.err("cond needs two regions"))?;
        let args: Vec<Value> = args.iter().map(|&v| v.clone()).collect();
        self.eval(region, &args, binds.clone())
    }

    /// `while(init...)`: run region 1 on the carried values while region 0 returns true.
    pub(crate) fn while_loop(&self, node: &Node, ins: &[&Value], site: &Site, binds: &Bindings) -> Res<Vec<Value>> {
        let [cond, body] = node.regions.as_slice() else {
            return Err(site.err("while needs two regions"));
        };
        let mut carried: Vec<Value> = ins.iter().map(|&v| v.clone()).collect();
        let mut iterations = 0u64;
        loop {
            let c = self.eval(cond, &carried, binds.clone())?;
            let keep_going = match c.as_slice() {
                [v] => match v.as_b(site, "while condition")?.iter().next() {
                    Some(&b) if v.shape().is_empty() => b,
                    _ => return Err(site.err("while condition must return a bool scalar")),
                },
                _ => return Err(site.err("while condition must return one value")),
            };
            if !keep_going {
                return Ok(carried);
            }
            if iterations >= self.max_while_iterations {
                return Err(site.err(format!("while loop exceeded {} iterations", self.max_while_iterations)));
            }
            iterations += 1;
            carried = self.eval(body, &carried, binds.clone())?;
        }
    }
}
