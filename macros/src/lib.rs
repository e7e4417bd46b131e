//! `#[oar::to_static]`: makes tensor-dependent `if`/`while` in a function traceable.
//!
//! The rule. Every `if`/`while` in the function body (outside closures and nested items) whose
//! condition is not *syntactically* boolean (a comparison, `&&`, `||`, `!`, a `bool` literal or
//! an `if let`/`while let` pattern — these are left untouched) is rewritten so that the
//! condition's **type** picks the path: a `bool` runs the original Rust control flow, a `Tensor`
//! (or `&Tensor`) goes through `oar::jit::cond` / `oar::jit::while_loop`, which run eagerly on
//! concrete tensors and become `cond`/`while` ops while tracing. Any other condition type is a
//! compile error.
//!
//! Variables declared outside the `if`/`while` (function parameters or `let`s) and assigned
//! inside it (`x = …`, `x += …`) are carried: they become results of the branches / carried
//! values of the loop. Under a tensor condition they must be `Tensor`s, and the value of an `if`
//! expression must be `()` or a `Tensor`; otherwise a compile error points at the assignment
//! (or the branch). `return`, `break` or `continue` leaving a branch or loop body are a compile
//! error pointing at them when the condition is a `Tensor` (plain `bool` code keeps them).
//! `for` loops are left as they are (a `Tensor` is not an iterator). The function must return
//! an `oar::Result` (the rewritten code propagates errors with `?`).

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::visit_mut::VisitMut;
use syn::{BinOp, Expr, ExprIf, ExprWhile, Ident, ItemFn, Lit, UnOp};

/// Make `if`/`while` on `Tensor` conditions traceable (see the crate docs for the exact rule).
#[proc_macro_attribute]
pub fn to_static(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return syn::Error::new(Span::call_site(), "#[to_static] takes no arguments")
            .to_compile_error()
            .into();
    }
    let mut f = match syn::parse::<ItemFn>(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error().into(),
    };
    Rewriter.visit_block_mut(&mut f.block);
    quote!(#f).into()
}

/// True for conditions that are `bool` by their syntax alone.
fn plain_bool(e: &Expr) -> bool {
    match e {
        Expr::Binary(b) => matches!(
            b.op,
            BinOp::Eq(_)
                | BinOp::Ne(_)
                | BinOp::Lt(_)
                | BinOp::Le(_)
                | BinOp::Gt(_)
                | BinOp::Ge(_)
                | BinOp::And(_)
                | BinOp::Or(_)
        ),
        Expr::Unary(u) => matches!(u.op, UnOp::Not(_)),
        Expr::Lit(l) => matches!(l.lit, Lit::Bool(_)),
        Expr::Let(_) => true,
        Expr::Paren(p) => plain_bool(&p.expr),
        Expr::Group(g) => plain_bool(&g.expr),
        _ => false,
    }
}

/// What a branch or loop body does with outer variables and control flow.
#[derive(Default)]
struct Scan {
    /// Assigned identifiers with the first assignment's span.
    assigned: Vec<(Ident, Span)>,
    /// Identifiers `let`-bound inside.
    declared: Vec<Ident>,
    /// The first `return`/`break`/`continue` leaving the scanned code.
    exit: Option<Span>,
    /// Nesting of loops inside the scanned code (unlabelled break/continue stay inside).
    loops: usize,
    /// Loop labels defined inside.
    labels: Vec<String>,
}

impl Scan {
    fn of(items: &[&dyn Fn(&mut Scan)]) -> Scan {
        let mut s = Scan::default();
        for f in items {
            f(&mut s);
        }
        s
    }

    /// Assigned variables declared outside, in order of first assignment.
    fn carried(&self) -> Vec<(Ident, Span)> {
        let mut out: Vec<(Ident, Span)> = Vec::new();
        for (id, sp) in &self.assigned {
            if !self.declared.contains(id) && !out.iter().any(|(o, _)| o == id) {
                out.push((id.clone(), *sp));
            }
        }
        out
    }

    fn assign_target(&mut self, left: &Expr, span: Span) {
        if let Expr::Path(p) = left
            && let Some(id) = p.path.get_ident()
        {
            self.assigned.push((id.clone(), span));
        }
    }

    fn exit_at(&mut self, span: Span) {
        self.exit.get_or_insert(span);
    }

    fn in_loop(&mut self, label: Option<&syn::Label>, f: impl FnOnce(&mut Scan)) {
        if let Some(l) = label {
            self.labels.push(l.name.ident.to_string());
        }
        self.loops += 1;
        f(self);
        self.loops -= 1;
    }

    fn leaves(&self, label: Option<&syn::Lifetime>) -> bool {
        match label {
            Some(l) => !self.labels.contains(&l.ident.to_string()),
            None => self.loops == 0,
        }
    }
}

impl<'a> Visit<'a> for Scan {
    fn visit_expr_assign(&mut self, e: &'a syn::ExprAssign) {
        self.assign_target(&e.left, e.span());
        syn::visit::visit_expr_assign(self, e);
    }

    fn visit_expr_binary(&mut self, e: &'a syn::ExprBinary) {
        use BinOp::*;
        if matches!(
            e.op,
            AddAssign(_)
                | SubAssign(_)
                | MulAssign(_)
                | DivAssign(_)
                | RemAssign(_)
                | BitXorAssign(_)
                | BitAndAssign(_)
                | BitOrAssign(_)
                | ShlAssign(_)
                | ShrAssign(_)
        ) {
            self.assign_target(&e.left, e.span());
        }
        syn::visit::visit_expr_binary(self, e);
    }

    fn visit_local(&mut self, l: &'a syn::Local) {
        struct Names<'s>(&'s mut Vec<Ident>);
        impl<'a> Visit<'a> for Names<'_> {
            fn visit_pat_ident(&mut self, p: &'a syn::PatIdent) {
                self.0.push(p.ident.clone());
                syn::visit::visit_pat_ident(self, p);
            }
        }
        Names(&mut self.declared).visit_pat(&l.pat);
        syn::visit::visit_local(self, l);
    }

    fn visit_expr_return(&mut self, e: &'a syn::ExprReturn) {
        self.exit_at(e.span());
        syn::visit::visit_expr_return(self, e);
    }

    fn visit_expr_break(&mut self, e: &'a syn::ExprBreak) {
        if self.leaves(e.label.as_ref()) {
            self.exit_at(e.span());
        }
        syn::visit::visit_expr_break(self, e);
    }

    fn visit_expr_continue(&mut self, e: &'a syn::ExprContinue) {
        if self.leaves(e.label.as_ref()) {
            self.exit_at(e.span());
        }
    }

    fn visit_expr_while(&mut self, e: &'a ExprWhile) {
        self.visit_expr(&e.cond);
        self.in_loop(e.label.as_ref(), |s| s.visit_block(&e.body));
    }

    fn visit_expr_for_loop(&mut self, e: &'a syn::ExprForLoop) {
        self.visit_expr(&e.expr);
        self.visit_pat(&e.pat);
        self.in_loop(e.label.as_ref(), |s| s.visit_block(&e.body));
    }

    fn visit_expr_loop(&mut self, e: &'a syn::ExprLoop) {
        self.in_loop(e.label.as_ref(), |s| s.visit_block(&e.body));
    }

    // Closures and items are separate code: their returns and assignments are their own.
    fn visit_expr_closure(&mut self, _: &'a syn::ExprClosure) {}
    fn visit_item(&mut self, _: &'a syn::Item) {}
}

/// Rewrites `if`/`while` bottom-up.
struct Rewriter;

impl VisitMut for Rewriter {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        match e {
            Expr::Closure(_) => {}
            Expr::If(ei) if !plain_bool(&ei.cond) => {
                let scan = Scan::of(&[&|s: &mut Scan| s.visit_block(&ei.then_branch), &|s: &mut Scan| {
                    if let Some((_, els)) = &ei.else_branch {
                        s.visit_expr(els);
                    }
                }]);
                syn::visit_mut::visit_expr_if_mut(self, ei);
                *e = Expr::Verbatim(expand_if(ei, &scan));
            }
            Expr::While(ew) if !plain_bool(&ew.cond) => {
                let scan = Scan::of(&[&|s: &mut Scan| s.visit_block(&ew.body)]);
                syn::visit_mut::visit_expr_while_mut(self, ew);
                *e = Expr::Verbatim(expand_while(ew, &scan));
            }
            _ => syn::visit_mut::visit_expr_mut(self, e),
        }
    }

    fn visit_item_mut(&mut self, _: &mut syn::Item) {}
}

fn carry_checks(carried: &[(Ident, Span)]) -> TokenStream2 {
    carried
        .iter()
        .map(|(x, sp)| quote_spanned!(*sp=> ::oar::jit::__macro::carry_check(&__oar_c, &#x);))
        .collect()
}

fn expand_if(ei: &ExprIf, scan: &Scan) -> TokenStream2 {
    let cond = &ei.cond;
    let then_b = &ei.then_branch;
    let else_e = match &ei.else_branch {
        Some((_, e)) => quote!(#e),
        None => quote!({}),
    };
    if let Some(sp) = scan.exit {
        let check = quote_spanned!(sp=> ::oar::jit::__macro::early_exit_allowed(&__oar_c););
        let truth = quote_spanned!(cond.span()=> ::oar::jit::__macro::truth(&__oar_c));
        return quote!({
            let __oar_c = #cond;
            #check
            if #truth #then_b else #else_e
        });
    }
    let carried = scan.carried();
    let xs: Vec<&Ident> = carried.iter().map(|(x, _)| x).collect();
    let checks = carry_checks(&carried);
    let kind = quote_spanned!(cond.span()=> ::oar::jit::__macro::kind(&__oar_c));
    let branch = |body: TokenStream2, span: Span| {
        let value_check = quote_spanned!(span=> ::oar::jit::__macro::carry_check(&__oar_c, &__oar_v););
        quote!(|| -> ::oar::Result<::std::vec::Vec<::oar::Tensor>> {
            #( #[allow(unused_mut)] let mut #xs = (&::oar::jit::__macro::Slot(&#xs)).__oar_dup()?; )*
            #[allow(clippy::let_unit_value)]
            let __oar_v = #body;
            #value_check
            let mut __oar_o = ::std::vec::Vec::new();
            ::oar::jit::__macro::Outs::into_outs(__oar_v, &mut __oar_o)?;
            #( __oar_o.push((&::oar::jit::__macro::Slot(&#xs)).__oar_out()?); )*
            Ok(__oar_o)
        })
    };
    let then_c = branch(quote!(#then_b), then_b.span());
    let else_c = branch(
        quote!({ #else_e }),
        ei.else_branch.as_ref().map_or(then_b.span(), |(_, e)| e.span()),
    );
    quote!({
        #[allow(unused_imports)]
        use ::oar::jit::__macro::{CarryOther as _, CarryTensor as _};
        let __oar_c = #cond;
        match #kind {
            ::oar::jit::__macro::Kind::Bool(__oar_b) => if __oar_b #then_b else #else_e,
            ::oar::jit::__macro::Kind::Tensor(__oar_p) => {
                #checks
                let __oar_p = __oar_p.clone();
                let mut __oar_r = ::oar::jit::cond(&__oar_p, #then_c, #else_c)?.into_iter();
                let __oar_v = ::oar::jit::__macro::Outs::from_outs(&mut __oar_r)?;
                #( #xs = (&::oar::jit::__macro::Slot(&#xs)).__oar_from(&::oar::jit::__macro::next(&mut __oar_r)?)?; )*
                __oar_v
            }
        }
    })
}

fn expand_while(ew: &ExprWhile, scan: &Scan) -> TokenStream2 {
    let cond = &ew.cond;
    let body = &ew.body;
    let label = &ew.label;
    if let Some(sp) = scan.exit {
        let check = quote_spanned!(sp=> ::oar::jit::__macro::early_exit_allowed(&__oar_c););
        let truth = quote_spanned!(cond.span()=> ::oar::jit::__macro::truth(&__oar_c));
        return quote!(#label while {
            let __oar_c = #cond;
            #check
            #truth
        } #body);
    }
    let carried = scan.carried();
    let xs: Vec<&Ident> = carried.iter().map(|(x, _)| x).collect();
    let idx: Vec<usize> = (0..xs.len()).collect();
    let checks = carry_checks(&carried);
    let kind = quote_spanned!(cond.span()=> ::oar::jit::__macro::kind(&__oar_c));
    quote!(#label loop {
        #[allow(unused_imports)]
        use ::oar::jit::__macro::{CarryOther as _, CarryTensor as _};
        let __oar_c = #cond;
        match #kind {
            ::oar::jit::__macro::Kind::Bool(__oar_b) => {
                if !__oar_b {
                    break;
                }
            }
            ::oar::jit::__macro::Kind::Tensor(_) => {
                #checks
                let __oar_r = ::oar::jit::while_loop(
                    |__oar_cv: &[::oar::Tensor]| -> ::oar::Result<::oar::Tensor> {
                        #( #[allow(unused_variables)] let #xs = (&::oar::jit::__macro::Slot(&#xs)).__oar_from(&__oar_cv[#idx])?; )*
                        ::oar::jit::__macro::pred(&(#cond))
                    },
                    |__oar_cv: &[::oar::Tensor]| -> ::oar::Result<::std::vec::Vec<::oar::Tensor>> {
                        #( #[allow(unused_mut)] let mut #xs = (&::oar::jit::__macro::Slot(&#xs)).__oar_from(&__oar_cv[#idx])?; )*
                        #body
                        Ok(::std::vec![#( (&::oar::jit::__macro::Slot(&#xs)).__oar_out()? ),*])
                    },
                    ::std::vec![#( (&::oar::jit::__macro::Slot(&#xs)).__oar_out()? ),*],
                )?;
                #( #xs = (&::oar::jit::__macro::Slot(&#xs)).__oar_from(&__oar_r[#idx])?; )*
                break;
            }
        }
        #body
    })
}
