//! The parser: recursive descent over tokens, building the graph through the `Graph` API so
//! every type rule runs; declared result types are checked against the inferred ones.
//!
//! Only regions recurse, and their depth is capped at [`MAX_REGION_DEPTH`]; constants are
//! parsed with an explicit bracket odometer, and their size is checked before any allocation.

use super::ParseError;
use super::attrs::{AttrItem, AttrVal, Attrs, Spanned};
use super::lexer::{Tok, Token, tokenize};
use super::literal::parse_int;
use super::print::{fmt_type, region_roles};
use crate::Op;
use crate::graph::{Graph, NodeId, ValueId};
use crate::ops::OpText;
use crate::verify::MAX_REGION_DEPTH;
use crate::{DType, Dim, IrError, Shape, TensorType};
use std::collections::HashMap;

/// Parse one `graph @name { ... }` block.
pub(crate) fn parse(text: &str) -> Result<Graph, ParseError> {
    let mut p = Parser {
        toks: tokenize(text)?,
        pos: 0,
        params: HashMap::new(),
    };
    p.keyword("graph")?;
    let name = p.graph_name()?;
    let g = p.block(&name, 0)?;
    if p.peek() != &Tok::Eof {
        return Err(p.err(format!(
            "expected end of input after the graph, found {}",
            p.peek().describe()
        )));
    }
    Ok(g)
}

pub(super) struct Parser {
    pub(super) toks: Vec<Token>,
    pub(super) pos: usize,
    /// Every param's type, across all regions: one name has one type in the whole model.
    params: HashMap<String, TensorType>,
}

/// A value name in one graph's scope: its node and how many results it has.
type Scope = HashMap<String, (NodeId, usize)>;

fn ir_msg(e: IrError) -> String {
    match e {
        IrError::Type { op, detail, .. } => format!("op '{op}': {detail}"),
        e => e.to_string(),
    }
}

impl Parser {
    /// A parser over `text` (the kernel format parses pieces of its lines with it).
    pub(super) fn new(text: &str) -> Result<Parser, ParseError> {
        Ok(Parser {
            toks: tokenize(text)?,
            pos: 0,
            params: HashMap::new(),
        })
    }

    /// Whether every token was consumed.
    pub(super) fn at_end(&self) -> bool {
        self.peek() == &Tok::Eof
    }

    /// `mnemonic {attrs}` of an op whose results have `types` (no operands: the kernel
    /// format names buffers itself).
    pub(super) fn op_with_attrs(&mut self, types: &[TensorType]) -> Result<Op, ParseError> {
        let op_tok = self.bump();
        let Tok::Ident(mnemonic) = &op_tok.tok else {
            return Err(Self::err_at(
                &op_tok,
                format!("expected an op name, found {}", op_tok.tok.describe()),
            ));
        };
        let items = if self.peek() == &Tok::Punct('{') {
            self.attr_dict()?
        } else {
            vec![]
        };
        let mut attrs = Attrs::new(mnemonic, op_tok.line, op_tok.col, items);
        let op = Op::parse(mnemonic, &mut attrs, types)?;
        attrs.finish()?;
        Ok(op)
    }

    pub(super) fn tok(&self) -> &Token {
        // The token list always ends with Eof, and `bump` never moves past it.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    pub(super) fn peek(&self) -> &Tok {
        &self.tok().tok
    }

    pub(super) fn bump(&mut self) -> Token {
        let t = self.tok().clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    pub(super) fn err(&self, msg: String) -> ParseError {
        let t = self.tok();
        ParseError {
            line: t.line,
            col: t.col,
            msg,
        }
    }

    pub(super) fn err_at(t: &Token, msg: String) -> ParseError {
        ParseError {
            line: t.line,
            col: t.col,
            msg,
        }
    }

    pub(super) fn punct(&mut self, c: char) -> Result<Token, ParseError> {
        if self.peek() == &Tok::Punct(c) {
            Ok(self.bump())
        } else {
            Err(self.err(format!("expected '{c}', found {}", self.peek().describe())))
        }
    }

    pub(super) fn eat(&mut self, c: char) -> bool {
        let hit = self.peek() == &Tok::Punct(c);
        if hit {
            self.bump();
        }
        hit
    }

    pub(super) fn keyword(&mut self, k: &str) -> Result<Token, ParseError> {
        match self.peek() {
            Tok::Ident(s) if s == k => Ok(self.bump()),
            t => Err(self.err(format!("expected '{k}', found {}", t.describe()))),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.bump();
                Ok(s)
            }
            t => Err(self.err(format!("expected {what} as a quoted string, found {}", t.describe()))),
        }
    }

    fn graph_name(&mut self) -> Result<String, ParseError> {
        match self.peek().clone() {
            Tok::At(s) => {
                self.bump();
                Ok(s)
            }
            t => Err(self.err(format!("expected a graph name '@name', found {}", t.describe()))),
        }
    }

    /// One dim: `3`, `N`, `"batch size"`, or a size expression `N*C`, `(N+1)/2`.
    fn dim(&mut self) -> Result<Dim, ParseError> {
        if let Tok::Str(s) = self.peek().clone() {
            self.bump();
            return Ok(Dim::Sym(s));
        }
        let (mut text, mut depth) = (String::new(), 0usize);
        let err_at = self.err(String::new());
        loop {
            match self.peek().clone() {
                Tok::Punct(',' | ']') if depth == 0 => break,
                Tok::Punct('(') => {
                    depth += 1;
                    text.push('(');
                }
                Tok::Punct(')') if depth > 0 => {
                    depth -= 1;
                    text.push(')');
                }
                Tok::Punct(c @ ('*' | '+' | '/' | '-')) => text.push(c),
                // `N-1` lexes as `N` and `-1`: the text reads as a subtraction again.
                Tok::Number(s) | Tok::Ident(s) => text.push_str(&s),
                t if text.is_empty() => return Err(self.err(format!("expected a dimension, found {}", t.describe()))),
                t => return Err(self.err(format!("expected ']' or ',' in a shape, found {}", t.describe()))),
            }
            self.bump();
        }
        if text.is_empty() {
            return Err(self.err(format!("expected a dimension, found {}", self.peek().describe())));
        }
        if text.bytes().all(|c| c.is_ascii_digit()) {
            return Ok(Dim::Static(parse_int(&text, "a dimension").map_err(|m| self.err(m))?));
        }
        text.parse::<Dim>().map_err(|m| ParseError {
            msg: format!("bad dimension `{text}`: {m}"),
            ..err_at
        })
    }

    /// `f32[N,784]`.
    pub(super) fn ty(&mut self) -> Result<TensorType, ParseError> {
        let dtype = match self.peek().clone() {
            Tok::Ident(s) => s
                .parse::<DType>()
                .map_err(|_| self.err(format!("unknown dtype '{s}'")))?,
            t => return Err(self.err(format!("expected a type such as f32[N,3], found {}", t.describe()))),
        };
        self.bump();
        self.punct('[')?;
        let mut dims = Vec::new();
        if !self.eat(']') {
            loop {
                let d = self.dim()?;
                dims.push(d);
                if self.eat(']') {
                    break;
                }
                if !self.eat(',') {
                    return Err(self.err(format!(
                        "expected ']' or ',' in a shape, found {}",
                        self.peek().describe()
                    )));
                }
            }
        }
        Ok(TensorType::new(dtype, Shape(dims)))
    }

    /// `T`, `T, T, ...`, or `()`.
    fn types(&mut self) -> Result<Vec<TensorType>, ParseError> {
        if self.eat('(') {
            self.punct(')')?;
            return Ok(vec![]);
        }
        let mut v = vec![self.ty()?];
        while self.eat(',') {
            v.push(self.ty()?);
        }
        Ok(v)
    }

    /// `%name` or `%name#k` as an operand.
    fn operand(&mut self, scope: &Scope) -> Result<ValueId, ParseError> {
        let t = self.bump();
        let Tok::Value { name, result } = &t.tok else {
            return Err(Self::err_at(
                &t,
                format!("expected a value such as %0, found {}", t.tok.describe()),
            ));
        };
        let &(node, n) = scope
            .get(name)
            .ok_or_else(|| Self::err_at(&t, format!("use of undefined value %{name}")))?;
        let output = match result {
            Some(r) => {
                let k: u32 = parse_int(r, "a result number").map_err(|m| Self::err_at(&t, m))?;
                if k as usize >= n {
                    return Err(Self::err_at(
                        &t,
                        format!("%{name} has {n} result(s); %{name}#{r} does not exist"),
                    ));
                }
                k
            }
            None if n == 1 => 0,
            None => {
                return Err(Self::err_at(
                    &t,
                    format!(
                        "%{name} has {n} results; refer to one as %{name}#0 .. %{name}#{}",
                        n.max(1) - 1
                    ),
                ));
            }
        };
        Ok(ValueId { node, output })
    }

    /// `graph-name { statements }` body; `depth` counts enclosing regions.
    fn block(&mut self, name: &str, depth: usize) -> Result<Graph, ParseError> {
        if depth > MAX_REGION_DEPTH {
            return Err(self.err(format!("regions nest deeper than {MAX_REGION_DEPTH}")));
        }
        self.punct('{')?;
        let mut g = Graph::new(name);
        let mut scope = Scope::new();
        loop {
            match self.peek().clone() {
                Tok::Punct('}') => {
                    self.bump();
                    return Ok(g);
                }
                Tok::Value { name, result } => {
                    let def = self.bump();
                    if result.is_some() {
                        return Err(Self::err_at(
                            &def,
                            format!("a definition cannot name a result: %{name}#.."),
                        ));
                    }
                    if scope.contains_key(&name) {
                        return Err(Self::err_at(&def, format!("redefinition of value %{name}")));
                    }
                    let count = if self.eat(':') {
                        match self.peek().clone() {
                            Tok::Number(n) => {
                                self.bump();
                                parse_int::<usize>(&n, "a result count").map_err(|m| Self::err_at(&def, m))?
                            }
                            t => return Err(self.err(format!("expected a result count, found {}", t.describe()))),
                        }
                    } else {
                        1
                    };
                    self.punct('=')?;
                    let node = self.op_line(&mut g, &scope, Some((&name, count, &def)), depth)?;
                    scope.insert(name, (node, count));
                }
                Tok::Ident(k) if k == "output" => {
                    self.bump();
                    let out_name = self.string("an output name")?;
                    self.punct('=')?;
                    let at = self.tok().clone();
                    let v = self.operand(&scope)?;
                    g.add_output(&out_name, v).map_err(|e| Self::err_at(&at, ir_msg(e)))?;
                }
                Tok::Ident(_) => {
                    self.op_line(&mut g, &scope, None, depth)?;
                }
                t => {
                    return Err(self.err(format!(
                        "expected a statement ('%name = ...', 'output', or '}}'), found {}",
                        t.describe()
                    )));
                }
            }
        }
    }

    /// The right-hand side of a statement; adds the node and returns its id.
    fn op_line(
        &mut self,
        g: &mut Graph,
        scope: &Scope,
        def: Option<(&str, usize, &Token)>,
        depth: usize,
    ) -> Result<NodeId, ParseError> {
        let op_tok = self.bump();
        let Tok::Ident(mnemonic) = &op_tok.tok else {
            return Err(Self::err_at(
                &op_tok,
                format!("expected an op name, found {}", op_tok.tok.describe()),
            ));
        };
        let want = def.map_or(0, |d| d.1);
        let need_one = |what: &str| -> Result<(), ParseError> {
            match def {
                Some((_, 1, _)) => Ok(()),
                Some((n, k, t)) => Err(Self::err_at(
                    t,
                    format!("%{n} declares {k} results, but {what} has one"),
                )),
                None => Err(Self::err_at(
                    &op_tok,
                    format!("{what} needs a value name: %name = {what} ..."),
                )),
            }
        };
        match mnemonic.as_str() {
            "input" => {
                need_one("input")?;
                let name = self.string("an input name")?;
                self.punct(':')?;
                let ty = self.ty()?;
                let v = g.add_input(&name, ty).map_err(|e| Self::err_at(&op_tok, ir_msg(e)))?;
                return Ok(v.node);
            }
            "param" => {
                need_one("param")?;
                let name = self.string("a param name")?;
                self.punct(':')?;
                let ty = self.ty()?;
                if g.params().iter().any(|(n, _)| *n == name) {
                    return Err(Self::err_at(
                        &op_tok,
                        format!("param \"{name}\" is defined twice in this graph"),
                    ));
                }
                if let Some(first) = self.params.get(&name).filter(|t| **t != ty) {
                    return Err(Self::err_at(
                        &op_tok,
                        format!(
                            "param \"{name}\" is declared as {} here but as {} elsewhere",
                            fmt_type(&ty),
                            fmt_type(first)
                        ),
                    ));
                }
                self.params.insert(name.clone(), ty.clone());
                let v = g.add_param(&name, ty).map_err(|e| Self::err_at(&op_tok, ir_msg(e)))?;
                return Ok(v.node);
            }
            "constant" => {
                need_one("constant")?;
                let t = self.constant()?;
                return Ok(g.add_constant(t).node);
            }
            _ => {}
        }
        // mnemonic(operands) {attrs} : types {regions}
        self.punct('(')?;
        let mut operands = Vec::new();
        if !self.eat(')') {
            loop {
                operands.push(self.operand(scope)?);
                if self.eat(')') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let items = if self.peek() == &Tok::Punct('{') {
            self.attr_dict()?
        } else {
            vec![]
        };
        self.punct(':')?;
        let types_tok = self.tok().clone();
        let types = self.types()?;
        if types.len() != want {
            let msg = match def {
                Some((n, k, _)) => format!("%{n} declares {k} result(s), but {} type(s) follow", types.len()),
                None => format!(
                    "{} result type(s) given, but no value name: %name = {mnemonic}(...)",
                    types.len()
                ),
            };
            return Err(Self::err_at(&types_tok, msg));
        }
        let mut attrs = Attrs::new(mnemonic, op_tok.line, op_tok.col, items);
        let op = Op::parse(mnemonic, &mut attrs, &types)?;
        attrs.finish()?;
        let mut regions = Vec::new();
        if op.num_regions() > 0 {
            let roles = region_roles(&op);
            if self.peek() != &Tok::Punct('{') {
                return Err(self.err(format!(
                    "op '{mnemonic}' needs its regions: {{ {} @name {{ ... }} {} @name {{ ... }} }}, found {}",
                    roles[0],
                    roles[1],
                    self.peek().describe()
                )));
            }
            self.bump();
            for role in roles {
                self.keyword(role)?;
                let name = self.graph_name()?;
                regions.push(self.block(&name, depth + 1)?);
            }
            self.punct('}')?;
        } else if self.peek() == &Tok::Punct('{') {
            return Err(self.err(format!("op '{mnemonic}' takes no regions")));
        }
        let outs = g
            .add_region_op(op, &operands, regions)
            .map_err(|e| Self::err_at(&op_tok, ir_msg(e)))?;
        let Some(first) = outs.first() else {
            // Zero results: the node is the last one added.
            return g
                .node_ids()
                .max()
                .ok_or_else(|| Self::err_at(&op_tok, "internal: node was not added".into()));
        };
        let got: Vec<TensorType> = outs.iter().map(|v| g.value_type(*v).clone()).collect();
        if got != types {
            let show = |ts: &[TensorType]| ts.iter().map(fmt_type).collect::<Vec<_>>().join(", ");
            let what = def.map_or(String::new(), |d| format!(" for %{}", d.0));
            return Err(Self::err_at(
                &types_tok,
                format!(
                    "type mismatch{what}: '{mnemonic}' gives {} but {} is declared",
                    show(&got),
                    show(&types)
                ),
            ));
        }
        Ok(first.node)
    }

    /// `{key = value, ...}`; values are numbers, words, or flat lists of those or of slice ranges.
    fn attr_dict(&mut self) -> Result<Vec<AttrItem>, ParseError> {
        self.punct('{')?;
        let mut items: Vec<AttrItem> = Vec::new();
        if self.eat('}') {
            return Ok(items);
        }
        loop {
            let key_tok = self.bump();
            let Tok::Ident(key) = key_tok.tok.clone() else {
                return Err(Self::err_at(
                    &key_tok,
                    format!("expected an attribute name, found {}", key_tok.tok.describe()),
                ));
            };
            if items.iter().any(|(k, _, _)| *k == key) {
                return Err(Self::err_at(&key_tok, format!("duplicate attribute '{key}'")));
            }
            self.punct('=')?;
            let start = self.tok().clone();
            let val = if self.eat('[') {
                let mut list = Vec::new();
                if !self.eat(']') {
                    loop {
                        list.push(self.attr_item(true)?);
                        if self.eat(']') {
                            break;
                        }
                        self.punct(',')?;
                    }
                }
                Spanned {
                    val: AttrVal::List(list),
                    line: start.line,
                    col: start.col,
                }
            } else {
                self.attr_item(false)?
            };
            items.push((key, (key_tok.line, key_tok.col), val));
            if self.eat('}') {
                return Ok(items);
            }
            self.punct(',')?;
        }
    }

    fn attr_item(&mut self, ranges_ok: bool) -> Result<Spanned, ParseError> {
        let t = self.tok().clone();
        let at = |val| Spanned {
            val,
            line: t.line,
            col: t.col,
        };
        let starts_range = matches!(t.tok, Tok::Punct(':'))
            || (matches!(t.tok, Tok::Number(_))
                && self.toks.get(self.pos + 1).is_some_and(|n| n.tok == Tok::Punct(':')));
        if ranges_ok && starts_range {
            let mut parts: [Option<String>; 3] = [None, None, None];
            for (i, part) in parts.iter_mut().enumerate() {
                if let Tok::Number(n) = self.peek().clone() {
                    self.bump();
                    *part = Some(n);
                }
                if i < 2 && !self.eat(':') {
                    if i == 0 {
                        return Err(self.err(format!(
                            "expected ':' in a slice range, found {}",
                            self.peek().describe()
                        )));
                    }
                    break;
                }
            }
            return Ok(at(AttrVal::Range(parts)));
        }
        match t.tok.clone() {
            Tok::Number(n) => {
                self.bump();
                Ok(at(AttrVal::Num(n)))
            }
            Tok::Ident(w) => {
                self.bump();
                Ok(at(AttrVal::Word(w)))
            }
            Tok::Str(w) => {
                self.bump();
                Ok(at(AttrVal::Str(w)))
            }
            tok => Err(self.err(format!("expected an attribute value, found {}", tok.describe()))),
        }
    }
}
