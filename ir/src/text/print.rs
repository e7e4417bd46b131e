//! The printer: inputs first (in call order), then every other node in `Graph::topo_order`,
//! then the outputs; regions print nested, each with its own value numbering. Inputs and
//! params are named after themselves (`%x`, `%fc1.weight`), other values numbered.

use super::lexer::is_ident;
use super::literal::fmt_dense;
use crate::graph::{Graph, NodeId, ValueId};
use crate::ops::{Input, Param};
use crate::{Dim, Op, TensorType};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// A double-quoted string with `\" \\ \n \t \r` and `\u{..}` escapes for other control chars.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => write!(out, "\\u{{{:x}}}", c as u32).expect("write to string"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A name bare if it is an identifier, quoted otherwise.
fn name_or_quoted(s: &str) -> String {
    if is_ident(s) { s.to_string() } else { quote(s) }
}

/// `f32[N,784]`; symbolic dims that are not identifiers are quoted.
pub(crate) fn fmt_type(t: &TensorType) -> String {
    let dims: Vec<_> = t
        .shape
        .0
        .iter()
        .map(|d| match d {
            Dim::Static(n) => n.to_string(),
            Dim::Sym(s) => name_or_quoted(s),
            Dim::Expr(e) => e.to_string(),
        })
        .collect();
    format!("{}[{}]", t.dtype, dims.join(","))
}

/// The names of the two regions of a control-flow op, in order.
pub(crate) fn region_roles(op: &Op) -> [&'static str; 2] {
    match op {
        Op::While => ["cond", "body"],
        _ => ["then", "else"],
    }
}

/// The order nodes print in: inputs in call order, then the rest topologically (lowest id
/// first among ready nodes); nodes on a cycle (an invalid graph) come last, in id order.
fn print_order(g: &Graph) -> Vec<NodeId> {
    let mut order: Vec<NodeId> = g.inputs().iter().copied().filter(|&n| g.get(n).is_some()).collect();
    let mut seen: HashSet<NodeId> = order.iter().copied().collect();
    for n in g.topo_order().into_iter().chain(g.node_ids()) {
        if seen.insert(n) {
            order.push(n);
        }
    }
    order
}

struct Printer<'g> {
    g: &'g Graph,
    names: HashMap<NodeId, String>,
}

impl Printer<'_> {
    fn value(&self, v: ValueId) -> String {
        let Some(name) = self.names.get(&v.node) else {
            return format!("%dangling.{}", v.node.index());
        };
        let multi = self.g.get(v.node).is_some_and(|n| n.outputs().len() > 1);
        if multi || v.output > 0 {
            format!("%{name}#{}", v.output)
        } else {
            format!("%{name}")
        }
    }
}

/// Print `g` as a graph block at `indent` spaces, with regions labelled by `role` (`graph`
/// at the top level).
pub(crate) fn print_block(g: &Graph, role: &str, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    let inner = " ".repeat(indent + 2);
    let order = print_order(g);
    let mut p = Printer {
        g,
        names: HashMap::new(),
    };
    // Inputs, then params, keep their names when those are identifiers not yet taken
    // (numbers never clash: identifiers start with a letter or `_`).
    let mut taken: HashSet<&str> = HashSet::new();
    for &id in &order {
        if let Op::Input(Input { name, .. }) = &g.node(id).op
            && is_ident(name)
            && taken.insert(name)
        {
            p.names.insert(id, name.clone());
        }
    }
    for &id in &order {
        if let Op::Param(Param { name, .. }) = &g.node(id).op
            && is_ident(name)
            && taken.insert(name)
        {
            p.names.insert(id, name.clone());
        }
    }
    let mut next = 0usize;
    for &id in &order {
        let node = g.node(id);
        match &node.op {
            _ if p.names.contains_key(&id) => {}
            _ if node.outputs().is_empty() => {
                p.names.insert(id, String::new());
            }
            _ => {
                p.names.insert(id, next.to_string());
                next += 1;
            }
        }
    }
    writeln!(out, "{pad}{role} @{} {{", name_or_quoted(g.name())).expect("write to string");
    for &id in &order {
        let node = g.node(id);
        out.push_str(&inner);
        let name = &p.names[&id];
        match node.outputs().len() {
            0 => {}
            1 => write!(out, "%{name} = ").expect("write to string"),
            k => write!(out, "%{name}:{k} = ").expect("write to string"),
        }
        match &node.op {
            Op::Input(Input { name, ty }) => write!(out, "input {} : {}", quote(name), fmt_type(ty)),
            Op::Param(Param { name, ty }) => write!(out, "param {} : {}", quote(name), fmt_type(ty)),
            Op::Constant(t) => write!(out, "constant dense<{}> : {}", fmt_dense(t), fmt_type(&t.tensor_type())),
            op => {
                let args: Vec<_> = node.inputs().iter().map(|v| p.value(*v)).collect();
                write!(out, "{}({})", op.name(), args.join(", ")).expect("write to string");
                let attrs = crate::ops::OpText::print_attrs(op);
                if !attrs.is_empty() {
                    let kv: Vec<_> = attrs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                    write!(out, " {{{}}}", kv.join(", ")).expect("write to string");
                }
                let types: Vec<_> = node.outputs().iter().map(fmt_type).collect();
                if types.is_empty() {
                    out.push_str(" : ()");
                } else {
                    write!(out, " : {}", types.join(", ")).expect("write to string");
                }
                if !node.regions.is_empty() {
                    out.push_str(" {\n");
                    let roles = region_roles(op);
                    for (i, r) in node.regions.iter().enumerate() {
                        print_block(r, roles.get(i).copied().unwrap_or("region"), indent + 4, out);
                    }
                    write!(out, "{inner}}}").expect("write to string");
                }
                Ok(())
            }
        }
        .expect("write to string");
        out.push('\n');
    }
    for o in g.outputs() {
        writeln!(out, "{inner}output {} = {}", quote(&o.name), p.value(o.value)).expect("write to string");
    }
    writeln!(out, "{pad}}}").expect("write to string");
}
