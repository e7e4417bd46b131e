//! Parsing hand-written text, and the errors bad text gets: each names the line, the column
//! and the offending token, op or value; hostile input is rejected without deep recursion or
//! large allocations.

use oar_ir::ops::{Pad, Reduce, Slice};
use oar_ir::ops::{ReduceOp, SliceRange};
use oar_ir::text::{ParseError, parse_graph, print_graph};
use oar_ir::{Composite, DType, Dim, Float, Op, TensorType};

const MLP: &str = r#"
// A two-layer MLP, written by hand.
graph @mlp {
  %x = input "x" : f32[N,784]   // the batch
  %w1 = param "fc1.weight" : f32[784,128]
  %b1 = param "fc1.bias" : f32[128]
  %h = linear(%x, %w1, %b1) : f32[N,128]
  %a = relu(%h) : f32[N,128]
  %s = reduce_sum(%a) {keepdim = false, axes = [1]} : f32[N]     // attributes in any order
  %sl = slice(%a) {ranges = [0:9223372036854775807, 0:64:2]} : f32[N,32]
  %c = constant dense<[[1.0, 2], [-3.5e0, inf]]> : f32[2,2]
  %e = exp(%s#0) : f32[N]
  output "y" = %e
  output "half" = %sl
  output "c" = %c
}
"#;

#[test]
fn hand_written_text_parses_to_the_expected_graph() {
    let g = parse_graph(MLP).unwrap();
    assert_eq!(g.name(), "mlp");
    assert_eq!(g.node_count(), 9);
    let specs = g.input_specs();
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].0, "x");
    assert_eq!(
        specs[0].1,
        TensorType::new(DType::F32, vec![Dim::sym("N"), Dim::Static(784)])
    );
    let params: Vec<_> = g.params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(params, ["fc1.weight", "fc1.bias"]);
    // Node ids follow the text.
    let ops: Vec<&str> = g.node_ids().map(|n| g.node(n).op.name()).collect();
    assert_eq!(
        ops,
        [
            "input",
            "param",
            "param",
            "linear",
            "relu",
            "reduce_sum",
            "slice",
            "constant",
            "exp"
        ]
    );
    let ids: Vec<_> = g.node_ids().collect();
    assert_eq!(g.topo_order(), ids);
    assert_eq!(g.node(ids[3]).op, Op::Composite(Composite::Linear));
    assert_eq!(g.node(ids[3]).inputs().len(), 3);
    assert_eq!(
        g.node(ids[5]).op,
        Op::Reduce(Reduce {
            op: ReduceOp::Sum,
            axes: vec![1],
            keepdim: false
        })
    );
    assert_eq!(
        g.node(ids[6]).op,
        Op::Slice(Slice {
            ranges: vec![
                SliceRange::FULL,
                SliceRange {
                    start: 0,
                    end: 64,
                    step: 2
                }
            ]
        })
    );
    let Op::Constant(c) = &g.node(ids[7]).op else {
        panic!("constant")
    };
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.0, 2.0, -3.5, f32::INFINITY]);
    let outs: Vec<_> = g.outputs().iter().map(|o| o.name.as_str()).collect();
    assert_eq!(outs, ["y", "half", "c"]);
    assert_eq!(g.output_types()[0].to_string(), "f32[N]");
    oar_ir::verify(&g).unwrap();

    // The printer writes the canonical form, which parses back to itself.
    let printed = print_graph(&g);
    assert!(
        printed.contains("  %2 = reduce_sum(%1) {axes = [1], keepdim = false} : f32[N]\n"),
        "{printed}"
    );
    assert!(printed.contains("{ranges = [:, :64:2]}"), "{printed}");
    assert!(printed.contains("dense<[[1.0, 2.0], [-3.5, inf]]>"), "{printed}");
    assert!(printed.contains("linear(%x, %fc1.weight, %fc1.bias)"), "{printed}");
    assert_eq!(print_graph(&parse_graph(&printed).unwrap()), printed);
}

#[test]
fn float_attributes_parse_bit_exactly() {
    let text = "graph @g {\n  %x = input \"x\" : f32[4]\n  %0 = pad(%x) {before = [1], after = [0], value = 0x7FF4000000000000} : f32[5]\n  %1 = pad(%x) {before = [0], after = [0], value = -nan} : f32[4]\n  %2 = pad(%x) {before = [0], after = [0], value = -0.0} : f32[4]\n}\n";
    let g = parse_graph(text).unwrap();
    let values: Vec<u64> = g
        .node_ids()
        .filter_map(|n| match g.node(n).op {
            Op::Pad(Pad { value: Float(v), .. }) => Some(v.to_bits()),
            _ => None,
        })
        .collect();
    assert_eq!(
        values,
        [0x7FF4_0000_0000_0000, (-f64::NAN).to_bits(), (-0.0f64).to_bits()]
    );
    assert_eq!(print_graph(&g), text);
}

fn err(text: &str) -> ParseError {
    match parse_graph(text) {
        Ok(g) => panic!("expected an error, parsed:\n{}", print_graph(&g)),
        Err(e) => e,
    }
}

/// A graph with input `%x : f32[2,3]` and `line` as its third line.
fn with_line(line: &str) -> String {
    format!("graph @t {{\n  %x = input \"x\" : f32[2,3]\n  {line}\n}}\n")
}

#[track_caller]
fn check(text: &str, line: usize, col: usize, needles: &[&str]) {
    let e = err(text);
    assert_eq!((e.line, e.col), (line, col), "wrong position for: {e}");
    for n in needles {
        assert!(e.msg.contains(n), "{e:?} should mention {n:?}");
    }
    assert!(e.to_string().starts_with(&format!("{line}:{col}: ")), "{e}");
}

#[test]
fn errors_name_the_token_op_and_value() {
    check(
        &with_line("%0 = matmull(%x, %x) : f32[2,3]"),
        3,
        8,
        &["unknown op 'matmull'", "did you mean 'matmul'"],
    );
    check(
        &with_line("%0 = frobnicate(%x) : f32[2,3]"),
        3,
        8,
        &["unknown op 'frobnicate'"],
    );
    check(
        &with_line("%0 = neg(%7) : f32[2,3]"),
        3,
        12,
        &["use of undefined value %7"],
    );
    check(
        &with_line("%0 = neg(%x) : f32[2,3\n  %1 = neg(%0) : f32[2,3]"),
        4,
        3,
        &["expected ']'", "'%1'"],
    );
    check(
        &with_line("%c = constant dense<[1.0, 2.0> : f32[2]"),
        3,
        32,
        &["expected ']'"],
    );
    check(
        &with_line("%0 = reduce_sum(%x) {axes = [1], keepdim = false} : f32[2,3]"),
        3,
        55,
        &[
            "type mismatch for %0",
            "'reduce_sum' gives f32[2]",
            "f32[2,3] is declared",
        ],
    );
    check(
        &with_line("%0 = matmul(%x, %x) : f32[2,3]"),
        3,
        8,
        &["op 'matmul'", "f32[2,3] x f32[2,3]"],
    );
    check(&with_line("%0 = neg(%x) : f31[2,3]"), 3, 18, &["unknown dtype 'f31'"]);
    check(
        &with_line("%x = neg(%x) : f32[2,3]"),
        3,
        3,
        &["redefinition of value %x"],
    );
    check(
        &with_line("%0:2 = neg(%x) : f32[2,3]"),
        3,
        20,
        &["%0 declares 2 result(s), but 1 type(s) follow"],
    );
    check(&with_line("neg(%x) : f32[2,3]"), 3, 13, &["no value name"]);
    check(
        &with_line("%0 = neg(%x) : f32[2,3] {"),
        3,
        27,
        &["op 'neg' takes no regions"],
    );
    check(
        &with_line("output \"y\" = %x\n  output \"y\" = %x"),
        4,
        16,
        &["duplicate output name `y`"],
    );
    check(
        &with_line("%y = input \"x\" : f32[1]"),
        3,
        8,
        &["duplicate input name `x`"],
    );
    check(
        &with_line("%0 = neg(%x) : f32[2,3] $"),
        3,
        27,
        &["unexpected character '$'"],
    );
    check(&with_line("%0 = input \"abc : f32[2]"), 3, 14, &["unterminated string"]);
    check("graph @t {\n}\n}", 3, 1, &["expected end of input", "'}'"]);
    check("graph @t {\n", 2, 1, &["expected a statement", "end of input"]);
    check("grph @t {}", 1, 1, &["expected 'graph'", "'grph'"]);
}

#[test]
fn attribute_errors() {
    check(
        &with_line("%0 = reduce_sum(%x) {axes = [1]} : f32[2]"),
        3,
        8,
        &["op 'reduce_sum' needs attribute 'keepdim'"],
    );
    check(
        &with_line("%0 = reduce_sum(%x) {axes = [1], keepdim = false, fast = true} : f32[2]"),
        3,
        53,
        &["unknown attribute 'fast' for op 'reduce_sum'"],
    );
    check(
        &with_line("%0 = softmax(%x) {axis = 1, axis = 1} : f32[2,3]"),
        3,
        31,
        &["duplicate attribute 'axis'"],
    );
    check(
        &with_line("%0 = softmax(%x) {axis = -1} : f32[2,3]"),
        3,
        28,
        &["integer -1 is out of range for usize"],
    );
    check(
        &with_line("%0 = softmax(%x) {axis = 99999999999999999999999} : f32[2,3]"),
        3,
        28,
        &["out of range for usize"],
    );
    check(
        &with_line("%0 = softmax(%x) {axis = yes} : f32[2,3]"),
        3,
        28,
        &["attribute 'axis' of 'softmax'", "'yes'"],
    );
    check(
        &with_line("%0 = gelu(%x) {approximate = 1} : f32[2,3]"),
        3,
        32,
        &["expected true or false"],
    );
    check(
        &with_line(
            "%0 = max_pool2d(%x) {kernel = [2], stride = [1, 1], padding = [0, 0, 0, 0], ceil_mode = false} : f32[2,3]",
        ),
        3,
        33,
        &["attribute 'kernel' of 'max_pool2d' needs 2 entries, got 1"],
    );
    check(
        &with_line("%0 = slice(%x) {ranges = [0:1, 5]} : f32[1,3]"),
        3,
        34,
        &["expected a slice range"],
    );
    check(
        &with_line("%0 = scatter(%x, %x, %x) {axis = 0, reduce = mul} : f32[2,3]"),
        3,
        48,
        &["replace, add", "'mul'"],
    );
    check(
        &with_line("%0 = pad(%x) {before = [0, 0], after = [0, 0], value = infinity} : f32[2,3]"),
        3,
        58,
        &["float literal"],
    );
}

#[test]
fn constant_errors() {
    check(
        &with_line("%c = constant dense<[300]> : u8[1]"),
        3,
        24,
        &["integer 300 is out of range for u8"],
    );
    check(
        &with_line("%c = constant dense<[128]> : i8[1]"),
        3,
        24,
        &["out of range for i8"],
    );
    check(
        &with_line("%c = constant dense<[1.0]> : f32[1000000000000]"),
        3,
        32,
        &["too large"],
    );
    check(
        &with_line("%c = constant dense<[1.0]> : f32[N]"),
        3,
        32,
        &["static shape", "f32[N]"],
    );
    check(
        &with_line("%c = constant dense<[1.0, 2.0]> : f32[3]"),
        3,
        32,
        &["expected ','", "axis 0 of the constant has 3 elements"],
    );
    check(
        &with_line("%c = constant dense<[1, 2, 3]> : i32[2]"),
        3,
        28,
        &["expected ']'", "has 2 elements"],
    );
    check(
        &with_line("%c = constant dense<\"0x0000\"> : f32[1]"),
        3,
        23,
        &["4 digits", "needs 4 bytes"],
    );
    check(
        &with_line("%c = constant dense<\"0xZZ\"> : u8[1]"),
        3,
        23,
        &["non-hex digit"],
    );
    check(
        &with_line("%c = constant dense<2> : bool[]"),
        3,
        23,
        &["expected true or false"],
    );
    check(
        &with_line("%c = constant dense<0x1FFFF> : f16[]"),
        3,
        23,
        &["do not fit in 16 bits"],
    );
    check(
        &with_line("%c = constant dense<1.5> : i32[]"),
        3,
        23,
        &["expected an integer (i32), found '1.5'"],
    );
}

#[test]
fn value_and_region_errors() {
    let bn = "%s = input \"s\" : f32[3]\n  %bn:3 = batch_norm(%x, %s, %s, %s, %s) {epsilon = 1e-5, momentum = 0.9, training = true} : f32[2,3], f32[3], f32[3]";
    check(
        &with_line(&format!("{bn}\n  output \"y\" = %bn")),
        5,
        16,
        &["%bn has 3 results", "%bn#0 .. %bn#2"],
    );
    check(
        &with_line(&format!("{bn}\n  output \"y\" = %bn#3")),
        5,
        16,
        &["%bn#3 does not exist"],
    );
    let cond = "%p = input \"p\" : bool[]\n  cond(%p) : () {\n    else @e {\n    }\n    then @t {\n    }\n  }";
    check(&with_line(cond), 5, 5, &["expected 'then'", "'else'"]);
    let body_uses_outer = "%p = input \"p\" : bool[]\n  cond(%p) : () {\n    then @t {\n      %0 = neg(%x) : f32[2,3]\n    }\n    else @e {\n    }\n  }";
    check(&with_line(body_uses_outer), 6, 16, &["use of undefined value %x"]);
    let conflict = "%w = param \"w\" : f32[3]\n  %p = input \"p\" : bool[]\n  cond(%p) : () {\n    then @t {\n      %w = param \"w\" : f32[4]\n    }\n    else @e {\n    }\n  }";
    check(
        &with_line(conflict),
        7,
        12,
        &["param \"w\" is declared as f32[4] here but as f32[3] elsewhere"],
    );
    check(
        &with_line("%w = param \"w\" : f32[3]\n  %v = param \"w\" : f32[3]"),
        4,
        8,
        &["param \"w\" is defined twice"],
    );
}

/// `n` nested `cond`s, each region declaring its own predicate.
fn nested_conds(n: usize) -> String {
    let open = "%p = constant dense<true> : bool[]\ncond(%p) : () {\nthen @t {\n";
    let close = "}\nelse @e {\n}\n}\n";
    format!("graph @deep {{\n{}{}}}\n", open.repeat(n), close.repeat(n))
}

#[test]
fn region_nesting_is_capped() {
    let max = oar_ir::verify::MAX_REGION_DEPTH;
    let g = parse_graph(&nested_conds(max)).unwrap();
    oar_ir::verify(&g).unwrap();
    let e = err(&nested_conds(max + 1));
    assert!(e.msg.contains(&format!("regions nest deeper than {max}")), "{e}");
    assert_eq!(e.line, 1 + 3 * (max + 1)); // at the `then @t {` one level too deep
    // Far deeper input is rejected at the cap, without exhausting the stack.
    assert!(err(&nested_conds(100_000)).msg.contains("nest deeper"));
}

#[test]
fn hostile_constants_are_rejected_cheaply() {
    // Deeply nested brackets: walked without recursion.
    let deep = with_line(&format!(
        "%c = constant dense<{}1.0{}> : f32[]",
        "[".repeat(200_000),
        "]".repeat(200_000)
    ));
    assert!(err(&deep).msg.contains("expected a f32 element"));
    // A huge shape whose byte size overflows, and one that would need 2^40 elements.
    check(
        &with_line("%c = constant dense<[]> : f64[4611686018427387904,4]"),
        3,
        29,
        &["too large"],
    );
    check(
        &with_line("%c = constant dense<\"0x\"> : u8[1099511627776]"),
        3,
        31,
        &["too large"],
    );
    // A zero-element shape with a huge leading dim: the literal runs out long before the shape.
    check(
        &with_line("%c = constant dense<[[], []]> : f32[1000000000000,0]"),
        3,
        30,
        &["expected ','"],
    );
}

#[test]
fn bool_constant_bytes_must_be_zero_or_one() {
    let text = "graph @g {\n  %0 = constant dense<\"0x0102\"> : bool[2]\n  output \"y\" = %0\n}\n";
    let e = oar_ir::text::parse_graph(text).unwrap_err();
    assert_eq!(e.line, 2, "{e}");
    assert!(e.msg.contains("not 0 or 1"), "{e}");
}

/// Size expressions in types parse, print canonically and round-trip; a malformed one is an
/// error at its position.
#[test]
fn size_expressions_in_types_round_trip() {
    let text = "graph @g {\n  %x = input \"x\" : f32[N,C,4]\n  %r = reshape(%x) : f32[N*C,4]\n  %p = pad(%r) {before = [1, 0], after = [0, 0], value = 0.0} : f32[C*N+1,4]\n  output \"y\" = %p\n}\n";
    let g = parse_graph(text).unwrap_or_else(|e| panic!("{e}"));
    let out = &g.output_types()[0];
    assert_eq!(out.to_string(), "f32[C*N+1,4]");
    assert!(matches!(&out.shape.0[0], Dim::Expr(_)));
    let printed = print_graph(&g);
    assert_eq!(print_graph(&parse_graph(&printed).unwrap()), printed);
    let e = err("graph @g {\n  %x = input \"x\" : f32[N/M]\n  output \"y\" = %x\n}\n");
    assert!(e.msg.contains("N/M") && e.line == 2, "{e:?}");
}

/// A shape whose size expression starts with a negated quotient prints as `-(N/3)` and parses
/// back to the same graph (`-N/3` would read as `(-N)/3`, another floor; found by fuzzing).
#[test]
fn negated_quotients_in_shapes_round_trip() {
    let text = "graph @g {\n  %x = input \"x\" : f32[-(N/3)+5]\n  output \"y\" = %x\n}\n";
    let g = parse_graph(text).unwrap();
    let printed = print_graph(&g);
    assert!(printed.contains("-(N/3)"), "{printed}");
    let again = parse_graph(&printed).unwrap();
    assert_eq!(print_graph(&again), printed);
    let seed = include_str!("../../../fuzz/seeds/parse_text/negated_quotient.txt");
    let g = parse_graph(seed).unwrap();
    let printed = print_graph(&g);
    assert_eq!(print_graph(&parse_graph(&printed).unwrap()), printed);
}
