//! f16 / bf16 loop kernels for code generators without half-precision arithmetic: the kernel
//! computes in f32 and rounds every half-precision result to its dtype, so it gives the
//! reference's bits (the reference computes each op in f64 and rounds; for `+ − × ÷ √` an f32
//! result rounded again is the same number, as f32 has more than 2p + 2 bits for p = 11 and 8;
//! `legalize`'s f32 expansions of transcendentals already round once through a cast).
//!
//! [`widen_half`] rewrites a program:
//! - every half buffer a loop kernel loads gets an f32 copy, made by a conversion kernel (an
//!   opaque `cast` the backend runs natively) before its first reader and shared by the later
//!   ones that follow closely (within [`SHARE_SPAN`] kernels of the one before), until a kernel
//!   writes the buffer again;
//! - a half output is written to a new f32 buffer and converted back just after;
//! - every half instruction becomes an f32 one: constants are rounded to the half dtype first,
//!   loads read the f32 copy, and arithmetic, casts to half and reduction results (`acc`) are
//!   followed by [`round_to`], a rounding to the half dtype in the core ALU set (bit operations,
//!   compares and selects; round-to-nearest-even, subnormals, overflow to ±inf, NaN kept).
//!
//! Contraction kernels (matmul, conv) take the same route: operands converted, the contraction
//! in f32, its result rounded to the half dtype where the epilogue reads it (the reference
//! accumulates in f64 and rounds once, so these agree to the half dtype's tolerance, not bit
//! for bit). Opaque kernels are left as they are.
//!
//! [`fold_operand_casts`] then lets a runtime that multiplies bf16 round a matmul's f32 operand
//! itself as it reads it (`Operand::round`), in place of a conversion kernel and its bf16 copy.

use super::build::B;
use oar_ir::kernel::{Buffer, BufferId, BufferKind, Inst, Kernel, KernelBody, KernelProgram, OpaqueKernel, ScalarOp};
use oar_ir::ops::Cast;
use oar_ir::{DType, Float, Op, TensorType};

/// Append instructions rounding the f32 value `x` to the nearest `half` value (still as f32);
/// returns the result's index.
fn round_to(b: &mut B, x: usize, half: DType) -> usize {
    let bits = b.bitcast(x, DType::I32);
    let nan = b.is_nan(x);
    let rounded = if half == DType::BF16 {
        // bf16 keeps f32's exponent: round the mantissa at bit 16 (to nearest, ties to even);
        // a carry into the exponent is right, up to ±inf.
        let t = b.shr(bits, 16);
        let lsb = b.and_c(t, 1.0);
        let r = b.add_c(bits, 32767.0);
        let r = b.add(r, lsb);
        let r = b.and_c(r, -65536.0);
        b.bitcast(r, DType::F32)
    } else {
        // f16: on |x|, round the mantissa at bit 13 for normal f16 values, to a multiple of
        // 2^-24 below 2^-14 (subnormals: adding and removing 0.5 rounds there), ±inf from
        // 65520 (the tie above 65504 goes to the even 65536); then the sign back.
        let sign = b.and_c(bits, -2147483648.0);
        let abits = b.and_c(bits, 2147483647.0);
        let a = b.bitcast(abits, DType::F32);
        let t = b.shr(abits, 13);
        let lsb = b.and_c(t, 1.0);
        let r = b.add_c(abits, 4095.0);
        let r = b.add(r, lsb);
        let r = b.and_c(r, -8192.0);
        let normal = b.bitcast(r, DType::F32);
        let half_c = b.c(DType::F32, 0.5);
        let up = b.add(a, half_c);
        let sub = b.sub(up, half_c);
        let tiny = b.lt_c(a, 2f64.powi(-14));
        let y = b.sel(tiny, sub, normal);
        let big_c = b.c(DType::F32, 65520.0);
        let big = b.ge(a, big_c);
        let y = b.sel_c(big, f64::INFINITY, y);
        let ybits = b.bitcast(y, DType::I32);
        let signed = b.or(ybits, sign);
        b.bitcast(signed, DType::F32)
    };
    // NaN stays NaN; as bf16 it is quieted (its top mantissa bit set), so that its high half
    // is the bf16 NaN that rounding gives (a payload in the low half only would otherwise
    // leave an infinity there).
    let nan_value = if half == DType::BF16 {
        let q = b.or_c(bits, 4194304.0);
        b.bitcast(q, DType::F32)
    } else {
        x
    };
    b.sel(nan, nan_value, rounded)
}

/// The body with half instructions in f32 (see the module docs).
fn widen_body(body: &[Inst]) -> Vec<Inst> {
    super::rewrite_body(body, false, |b, inst, op| {
        if !inst.dtype.is_half() {
            return b.push(op, inst.dtype);
        }
        match op {
            ScalarOp::Const(Float(v)) => b.c(DType::F32, oar_ir::eval::round_float(inst.dtype, v)),
            // Loads read the f32 copy of a half buffer: exact half values already.
            ScalarOp::Load(_) | ScalarOp::Where(..) => b.push(op, DType::F32),
            op => {
                let v = b.push(op, DType::F32);
                round_to(b, v, inst.dtype)
            }
        }
    })
}

/// Whether a loop or contraction kernel touches a half dtype (a buffer it reads or writes, an
/// instruction, the contraction's accumulator).
fn touches_half(p: &KernelProgram, k: &Kernel) -> bool {
    let half_buf = |b: BufferId| p.buffer(b).ty.dtype.is_half();
    match &k.body {
        KernelBody::Loop(l) => {
            let bodies = std::iter::once(&l.body).chain(l.reduce.iter().map(|r| &r.body));
            half_buf(k.outputs[0])
                || l.loads.iter().any(|ld| half_buf(ld.buffer))
                || bodies.flatten().any(|i| i.dtype.is_half())
        }
        KernelBody::Contraction(c) => {
            half_buf(k.outputs[0])
                || half_buf(c.lhs.load.buffer)
                || half_buf(c.rhs.load.buffer)
                || c.acc_dtype.is_half()
                || c.loads.iter().any(|ld| half_buf(ld.buffer))
                || c.epilogue.iter().any(|i| i.dtype.is_half())
        }
        KernelBody::Opaque(_) => false,
    }
}

/// For a loop kernel that only converts a whole f32 buffer to a half one of the same shape, or
/// back: `(input buffer, output dtype)`.
fn pure_cast(p: &KernelProgram, k: &Kernel) -> Option<(BufferId, DType)> {
    let KernelBody::Loop(l) = &k.body else {
        return None;
    };
    let [ld] = l.loads.as_slice() else {
        return None;
    };
    let (from, to) = (p.buffer(ld.buffer), p.buffer(k.outputs[0]));
    let pair = matches!(
        (from.ty.dtype, to.ty.dtype),
        (DType::F32, DType::F16 | DType::BF16) | (DType::F16 | DType::BF16, DType::F32)
    );
    let plain = l.reduce.is_empty()
        && matches!(
            l.body.as_slice(),
            [Inst { op: ScalarOp::Load(0), dtype: a }, Inst { op: ScalarOp::Cast(0), dtype: b }]
                if *a == from.ty.dtype && *b == to.ty.dtype
        );
    let whole =
        ld.map.is_identity() && ld.map.view == l.shape && from.ty.shape.0 == l.shape && to.ty.shape.0 == l.shape;
    (pair && plain && whole).then_some((ld.buffer, to.ty.dtype))
}

fn f32_buffer(p: &mut KernelProgram, of: BufferId, what: &str) -> BufferId {
    let b = p.buffer(of).clone();
    p.buffers.push(Buffer {
        kind: BufferKind::Temp,
        ty: TensorType::new(DType::F32, b.ty.shape.0.clone()),
        value: format!("{}.{what}", b.value),
    });
    BufferId(p.buffers.len() as u32 - 1)
}

fn convert(name: String, from: BufferId, to: BufferId, dtype: DType) -> Kernel {
    Kernel {
        name,
        body: KernelBody::Opaque(OpaqueKernel {
            op: Op::Cast(Cast { to: dtype }),
            inputs: vec![from],
            regions: vec![],
        }),
        outputs: vec![to],
    }
}

/// What a code generator does with bf16 itself, beyond f32 arithmetic (see [`widen_half`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HalfSupport {
    /// Its loop kernels load bf16 elements as f32 values and store f32 values that are bf16
    /// values (rounded by the body) as bf16: loop kernels then read and write bf16 buffers
    /// directly, with no f32 copies.
    pub bf16_memory: bool,
    /// Its runtime multiplies bf16 matmul and convolution operands itself (accumulating in
    /// f32): they keep their bf16 operands, and their results are f32 as the others'.
    pub bf16_products: bool,
}

/// How many kernels after its last reader an f32 copy of a half buffer is still shared
/// ([`widen_half`]); a reader further away gets a copy of its own. Nearby readers (a max pool's
/// window taps, the sibling consumers of a value, a residual block's shortcut) share one
/// conversion; a reader far away, typically the backward pass reading what the forward pass
/// saved, converts again: a copy shared from the forward to the backward would keep the f32
/// copy alive in between, twice the half buffer's bytes (more than an f32 program keeps),
/// where a fresh copy lives for one kernel and the saved value stays half. (PyTorch converts
/// per use as well: its autocast caches casts of weights only.)
pub const SHARE_SPAN: usize = 4;

/// Rewrite every f16/bf16 loop kernel of `program` to compute in f32 (see the module docs),
/// leaving to the code generator what `support` says it does. Returns how many kernels it
/// rewrote.
pub fn widen_half(program: &mut KernelProgram, support: HalfSupport) -> usize {
    let HalfSupport {
        bf16_memory,
        bf16_products,
    } = support;
    let kernels = std::mem::take(&mut program.kernels);
    let mut out = Vec::with_capacity(kernels.len());
    let mut rewritten = 0;
    // The f32 copy of each half buffer made so far and the last kernel that read it, shared by
    // later readers within `SHARE_SPAN` kernels of that one until a kernel writes the buffer
    // again.
    type ByBuffer = std::collections::HashMap<BufferId, (BufferId, usize)>;
    let mut copies = ByBuffer::new();
    // Half buffers that are casts of an f32 leaf (an input or a weight): (the leaf, the cast's
    // kernel). A reader far from the cast and its other readers converts the leaf again (to the
    // half dtype and back: the same values) rather than keep the half buffer alive until then.
    let mut casts = ByBuffer::new();
    let written = |o: BufferId, copies: &mut ByBuffer, casts: &mut ByBuffer| {
        copies.remove(&o);
        casts.remove(&o);
        casts.retain(|_, (src, _)| *src != o);
    };
    for (ki, mut k) in kernels.into_iter().enumerate() {
        if !touches_half(program, &k) {
            for &o in &k.outputs {
                written(o, &mut copies, &mut casts);
            }
            out.push(k);
            continue;
        }
        rewritten += 1;
        if let Some((from, dtype)) = pure_cast(program, &k) {
            // A cast from or to a half dtype over whole buffers: the runtime's conversion, one
            // pass (not an f32 loop and a conversion of its result).
            let o = k.outputs[0];
            written(o, &mut copies, &mut casts);
            if dtype.is_half() && !matches!(program.buffer(from).kind, BufferKind::Temp | BufferKind::Output) {
                casts.insert(o, (from, ki));
            }
            out.push(convert(k.name, from, o, dtype));
            continue;
        }
        let bf16 = |b: BufferId| program.buffer(b).ty.dtype == DType::BF16;
        let keep_operands = bf16_products
            && matches!(&k.body, KernelBody::Contraction(c) if bf16(c.lhs.load.buffer) && bf16(c.rhs.load.buffer));
        let is_loop = matches!(&k.body, KernelBody::Loop(_));
        // Every half buffer the kernel reads gets an f32 copy before it (but bf16 ones where
        // the code generator loads bf16; a contraction's epilogue is a loop kernel too).
        let mut to_f32 = |ld: &mut oar_ir::kernel::Load, tag: String, loop_load: bool, out: &mut Vec<Kernel>| {
            let dt = program.buffer(ld.buffer).ty.dtype;
            if !dt.is_half() || (loop_load && bf16_memory && dt == DType::BF16) {
                return;
            }
            // The copy made so far and its last reader (never before the cast that wrote the
            // half buffer: a write drops its copy).
            let copy = copies.get(&ld.buffer).copied();
            if let Some((f, last)) = copy
                && ki - last <= SHARE_SPAN
            {
                copies.insert(ld.buffer, (f, ki));
                ld.buffer = f;
                return;
            }
            let f = f32_buffer(program, ld.buffer, &format!("{tag}_f32"));
            match casts.get(&ld.buffer) {
                Some(&(leaf, cast_at)) if ki - copy.map_or(cast_at, |(_, last)| last) > SHARE_SPAN => {
                    // Far from the cast and its readers: from the leaf again, through a half
                    // temporary that lives for this kernel only.
                    let h = program.buffers.len() as u32;
                    let mut half = program.buffer(ld.buffer).clone();
                    half.kind = BufferKind::Temp;
                    half.value = format!("{}.{tag}_again", half.value);
                    program.buffers.push(half);
                    out.push(convert(format!("{tag}_again"), leaf, BufferId(h), dt));
                    out.push(convert(format!("{tag}_to_f32"), BufferId(h), f, DType::F32));
                }
                _ => out.push(convert(format!("{tag}_to_f32"), ld.buffer, f, DType::F32)),
            }
            copies.insert(ld.buffer, (f, ki));
            ld.buffer = f;
        };
        match &mut k.body {
            KernelBody::Loop(l) => {
                for (i, ld) in l.loads.iter_mut().enumerate() {
                    to_f32(ld, format!("{}_l{i}", k.name), true, &mut out);
                }
                for r in &mut l.reduce {
                    r.body = widen_body(&r.body);
                }
                l.body = widen_body(&l.body);
            }
            KernelBody::Contraction(c) => {
                // The contraction runs in f32 (its result rounded where the epilogue reads it),
                // on bf16 operands as they are where the runtime multiplies bf16.
                if !keep_operands {
                    to_f32(&mut c.lhs.load, format!("{}_lhs", k.name), false, &mut out);
                    to_f32(&mut c.rhs.load, format!("{}_rhs", k.name), false, &mut out);
                }
                for (i, ld) in c.loads.iter_mut().enumerate() {
                    // (The epilogue is a loop kernel.)
                    to_f32(ld, format!("{}_l{i}", k.name), true, &mut out);
                }
                if c.acc_dtype.is_half() {
                    c.acc_dtype = DType::F32;
                }
                c.epilogue = widen_body(&c.epilogue);
            }
            KernelBody::Opaque(_) => unreachable!("touches_half is false for opaque kernels"),
        }
        let o = k.outputs[0];
        written(o, &mut copies, &mut casts);
        let odt = program.buffer(o).ty.dtype;
        if odt.is_half() && !(is_loop && bf16_memory && odt == DType::BF16) {
            let f = f32_buffer(program, o, &format!("{}_f32", k.name));
            k.outputs[0] = f;
            let back = convert(format!("{}_to_{odt}", k.name), f, o, odt);
            out.push(k);
            out.push(back);
        } else {
            out.push(k);
        }
    }
    program.kernels = out;
    drop_unread_conversions(program);
    rewritten
}

/// Fold the f32 → bf16 conversions feeding bf16 matmuls into the matmuls: an operand read from
/// a conversion's bf16 result reads its f32 source instead, rounded to bf16 as it is read
/// ([`oar_ir::kernel::Operand::round`]: the same values), and a conversion left with no reader
/// is dropped. For runtimes whose bf16 products round f32 operands themselves (where
/// [`HalfSupport::bf16_products`] holds), after [`widen_half`]: a traced AMP step then keeps no
/// bf16 copy of its input or of a weight between the forward and the backward, and runs no
/// conversion kernel for them.
///
/// A source is read later than before only where it is a leaf (an input or a weight, live for
/// the whole run anyway): a temporary f32 source is folded only into matmuls that run before
/// its last reader, so no f32 buffer lives longer than it did. Returns how many operands were
/// folded.
pub fn fold_operand_casts(program: &mut KernelProgram) -> usize {
    let n = program.kernels.len();
    // The last kernel reading each buffer (`n` for program outputs).
    let mut last_read = vec![None; program.buffers.len()];
    for (ki, k) in program.kernels.iter().enumerate() {
        for b in k.reads() {
            last_read[b.index()] = Some(ki);
        }
    }
    for (_, b) in &program.outputs {
        last_read[b.index()] = Some(n);
    }
    // The conversion that wrote each bf16 buffer, if its last writer so far is one:
    // (its f32 source, the conversion's index).
    let mut converted: std::collections::HashMap<BufferId, (BufferId, usize)> = Default::default();
    // The last kernel that wrote each buffer.
    let mut written: std::collections::HashMap<BufferId, usize> = Default::default();
    let mut folded = 0;
    for ki in 0..n {
        let k = &mut program.kernels[ki];
        if let KernelBody::Contraction(c) = &mut k.body
            && matches!(c.op, oar_ir::kernel::Contraction::MatMul)
            && c.acc_dtype == DType::F32
        {
            for o in [&mut c.lhs, &mut c.rhs] {
                let Some(&(src, at)) = converted.get(&o.load.buffer) else {
                    continue;
                };
                let leaf = !matches!(program.buffers[src.index()].kind, BufferKind::Temp | BufferKind::Output);
                let unchanged = written.get(&src).is_none_or(|&w| w < at);
                let within = leaf || last_read[src.index()].is_some_and(|r| r >= ki);
                if o.round.is_none() && unchanged && within {
                    o.load.buffer = src;
                    o.round = Some(DType::BF16);
                    folded += 1;
                }
            }
        }
        let k = &program.kernels[ki];
        for &o in &k.outputs {
            converted.remove(&o);
            written.insert(o, ki);
        }
        if let (
            KernelBody::Opaque(OpaqueKernel {
                op: Op::Cast(Cast { to: DType::BF16 }),
                inputs,
                ..
            }),
            [out],
        ) = (&k.body, k.outputs.as_slice())
            && let [src] = inputs.as_slice()
            && program.buffers[src.index()].ty.dtype == DType::F32
        {
            converted.insert(*out, (*src, ki));
        }
    }
    if folded > 0 {
        drop_unread_conversions(program);
    }
    folded
}

/// Remove the conversion kernels whose results are temporaries that nothing reads (a cast that
/// a product now reads rounded, or that its far readers make again from its source), and their
/// buffers.
fn drop_unread_conversions(program: &mut KernelProgram) {
    let mut read = vec![false; program.buffers.len()];
    for k in &program.kernels {
        for b in k.reads() {
            read[b.index()] = true;
        }
    }
    for (_, b) in &program.outputs {
        read[b.index()] = true;
    }
    let buffers = &program.buffers;
    program.kernels.retain(|k| {
        let conversion = matches!(&k.body, KernelBody::Opaque(OpaqueKernel { op: Op::Cast(_), .. }));
        let unread = |o: &BufferId| buffers[o.index()].kind == BufferKind::Temp && !read[o.index()];
        !(conversion && k.outputs.iter().all(unread))
    });
    program.drop_unused_temps();
}
