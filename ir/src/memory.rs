//! The memory budget: the largest tensor (or arena) oar allocates, so a few hundred bytes of
//! hostile model cannot make the process abort with "memory allocation failed" — sizes past
//! the budget are a typed error naming the tensor, before anything is allocated.
//!
//! The limit is, in order: [`set_limit`] (the CLI's `--max-memory`), the `OAR_MAX_MEMORY`
//! environment variable (bytes, or with a `K`/`M`/`G`/`T` suffix, powers of 1024), else three
//! quarters of the memory the process may use (the smaller of physical memory and the address
//! space limit `ulimit -v`), capped at [`crate::tensor_data::MAX_TENSOR_BYTES`]. Every size check
//! (`tensor_data::checked_byte_len`, the reference interpreter's, the memory planner's, the cpu
//! runtime's) reads it.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Set by [`set_limit`]; 0 = not set.
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// The limit in bytes (see the module docs).
pub fn limit() -> u64 {
    match LIMIT.load(Ordering::Relaxed) {
        0 => default_limit(),
        n => n,
    }
}

/// Set the limit for this process (at least 1 byte).
pub fn set_limit(bytes: u64) {
    LIMIT.store(bytes.max(1), Ordering::Relaxed);
}

/// Where the limit comes from, for error messages.
pub fn limit_source() -> &'static str {
    if LIMIT.load(Ordering::Relaxed) != 0 {
        "--max-memory"
    } else if std::env::var_os("OAR_MAX_MEMORY").is_some() {
        "OAR_MAX_MEMORY"
    } else {
        "default: 3/4 of the available memory; raise it with --max-memory or OAR_MAX_MEMORY"
    }
}

fn default_limit() -> u64 {
    static DEFAULT: OnceLock<u64> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        if let Some(v) = std::env::var_os("OAR_MAX_MEMORY")
            && let Some(n) = v.to_str().and_then(|s| parse_size(s).ok())
        {
            return n.max(1);
        }
        let cap = crate::tensor_data::MAX_TENSOR_BYTES as u64;
        let usable = [physical_memory(), address_space_limit()].into_iter().flatten().min();
        usable.map_or(cap, |m| (m / 4 * 3).min(cap))
    })
}

/// `4096`, `512M`, `4G`, `1.5G`, `2T` (powers of 1024; a trailing `B`/`iB` is allowed).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("size `{s}`: unknown unit `{c}` (K, M, G, T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("size `{s}` is not a number of bytes (e.g. 4096, 512M, 4G)"))?;
    let bytes = v * mul as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("size `{s}` is out of range"));
    }
    Ok(bytes as u64)
}

/// Physical memory (`MemTotal` of /proc/meminfo), where known.
fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The address-space limit (`ulimit -v`), where one is set.
fn address_space_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0 && r.rlim_cur != libc::RLIM_INFINITY {
            #[allow(clippy::unnecessary_cast)] // rlim_t is u32 on some targets
            return Some(r.rlim_cur as u64);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        for bad in ["", "x", "-1", "4Q", "0", "1e30T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(limit() >= 1);
    }
}
