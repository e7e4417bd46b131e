//! Graphviz output of a graph, for `oar dot`.

use crate::graph::Graph;
use crate::ops::Op;
use crate::ops::{Input, Param};
use std::fmt::Write;

/// The graph as a Graphviz `digraph`: one box per op (label: op, result types), one edge per
/// operand; regions become clusters.
pub fn to_dot(graph: &Graph) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", escape(graph.name()));
    let _ = writeln!(
        out,
        "  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];"
    );
    let mut counter = 0usize;
    write_body(graph, "n", &mut out, &mut counter, 1);
    out.push_str("}\n");
    out
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn write_body(graph: &Graph, prefix: &str, out: &mut String, counter: &mut usize, indent: usize) {
    let pad = "  ".repeat(indent);
    for id in graph.topo_order() {
        let node = graph.node(id);
        let types = node
            .outputs()
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let (label, style) = match &node.op {
            Op::Input(Input { name, .. }) => (format!("input {name}"), ", style=filled, fillcolor=\"#dbeafe\""),
            Op::Param(Param { name, .. }) => (format!("param {name}"), ", style=filled, fillcolor=\"#fef3c7\""),
            Op::Constant(_) => ("constant".to_string(), ", style=filled, fillcolor=\"#f3f4f6\""),
            Op::Composite(_) => (node.op.name().to_string(), ", style=filled, fillcolor=\"#ede9fe\""),
            _ => (node.op.name().to_string(), ""),
        };
        let _ = writeln!(
            out,
            "{pad}{prefix}{} [label=\"%{}: {}\\n{}\"{style}];",
            id.index(),
            id.index(),
            escape(&label),
            escape(&types)
        );
        for v in node.inputs() {
            let _ = writeln!(out, "{pad}{prefix}{} -> {prefix}{};", v.node.index(), id.index());
        }
        for (ri, region) in node.regions.iter().enumerate() {
            *counter += 1;
            let sub = format!("{prefix}{}r{ri}_", id.index());
            let _ = writeln!(out, "{pad}subgraph cluster_{counter} {{");
            let _ = writeln!(out, "{pad}  label=\"%{} region {ri}\"; style=dashed;", id.index());
            write_body(region, &sub, out, counter, indent + 1);
            let _ = writeln!(out, "{pad}}}");
        }
    }
    for o in graph.outputs() {
        let _ = writeln!(
            out,
            "{pad}{prefix}out_{0} [label=\"output {0}\", shape=ellipse];\n{pad}{prefix}{1} -> {prefix}out_{0};",
            escape(&o.name),
            o.value.node.index()
        );
    }
}
