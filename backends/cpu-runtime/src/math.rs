//! Scalar math functions generated kernels call (Cranelift has no `exp`, `log`, ...). Both
//! the JIT (through [`symbols`]) and AOT binaries (through this static library's exported
//! symbols) resolve the same names, so JIT and AOT code compute the same bits.

macro_rules! math_fns {
    ($($name32:ident, $name64:ident => |$x:ident| $body32:expr, $body64:expr;)*) => {
        $(
            /// f32 version (called by generated code).
            #[unsafe(no_mangle)]
            pub extern "C" fn $name32($x: f32) -> f32 { $body32 }
            /// f64 version (called by generated code).
            #[unsafe(no_mangle)]
            pub extern "C" fn $name64($x: f64) -> f64 { $body64 }
        )*
        /// `(symbol, address)` of every math function, for the JIT's symbol lookup.
        pub fn symbols() -> Vec<(&'static str, *const u8)> {
            let mut v: Vec<(&'static str, *const u8)> = vec![
                $((stringify!($name32), $name32 as *const u8), (stringify!($name64), $name64 as *const u8),)*
            ];
            v.push(("oar_rt_powf", oar_rt_powf as *const u8));
            v.push(("oar_rt_pow", oar_rt_pow as *const u8));
            v.push(("oar_rt_remf", oar_rt_remf as *const u8));
            v.push(("oar_rt_rem", oar_rt_rem as *const u8));
            v
        }
    };
}

// f32 results are computed in f64 and rounded once, like the reference backend.
math_fns! {
    oar_rt_expf, oar_rt_exp => |x| (x as f64).exp() as f32, x.exp();
    oar_rt_logf, oar_rt_log => |x| (x as f64).ln() as f32, x.ln();
    oar_rt_sinf, oar_rt_sin => |x| (x as f64).sin() as f32, x.sin();
    oar_rt_cosf, oar_rt_cos => |x| (x as f64).cos() as f32, x.cos();
    oar_rt_tanhf, oar_rt_tanh => |x| (x as f64).tanh() as f32, x.tanh();
    oar_rt_erff, oar_rt_erf => |x| libm::erf(x as f64) as f32, libm::erf(x);
}

/// `a ^ b` (f32).
#[unsafe(no_mangle)]
pub extern "C" fn oar_rt_powf(a: f32, b: f32) -> f32 {
    (a as f64).powf(b as f64) as f32
}

/// `a ^ b` (f64).
#[unsafe(no_mangle)]
pub extern "C" fn oar_rt_pow(a: f64, b: f64) -> f64 {
    a.powf(b)
}

/// numpy `mod` (sign of the divisor), f32.
#[unsafe(no_mangle)]
pub extern "C" fn oar_rt_remf(a: f32, b: f32) -> f32 {
    oar_rt_rem(a as f64, b as f64) as f32
}

/// numpy `mod` (sign of the divisor), f64.
#[unsafe(no_mangle)]
pub extern "C" fn oar_rt_rem(a: f64, b: f64) -> f64 {
    let r = a % b;
    if r != 0.0 && (r < 0.0) != (b < 0.0) {
        r + b
    } else if r == 0.0 {
        0.0f64.copysign(b)
    } else {
        r
    }
}
