//! Hostile `.oar` bytes: hundreds of deterministic mutations of a valid model must each load
//! as an error or as a valid model — never a panic, a stack overflow, a hang or a huge
//! allocation. (A stack overflow or an abort would kill the test process, which fails it.)

use crate::file_common::{assemble_v1, sample_model, sections};
use oar_ir::file::Model;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// xorshift64: a tiny deterministic RNG (no dependency needed for test input generation).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Load `bytes`; fail the test on a panic or a slow load, and check any Ok is a valid model.
/// Returns whether it loaded.
fn check(label: &str, bytes: &[u8]) -> bool {
    let start = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| Model::from_bytes(bytes)));
    let took = start.elapsed();
    assert!(took < Duration::from_secs(2), "{label}: load took {took:?}");
    match result {
        Err(_) => panic!("{label}: Model::from_bytes panicked"),
        Ok(Err(e)) => {
            assert!(!e.to_string().is_empty(), "{label}");
            false
        }
        Ok(Ok(m)) => {
            oar_ir::verify(&m.graph).unwrap_or_else(|e| panic!("{label}: loaded an invalid graph: {e}"));
            m.check_weights()
                .unwrap_or_else(|e| panic!("{label}: loaded bad weights: {e}"));
            true
        }
    }
}

/// Byte offsets where the file's sections start and end.
fn boundaries(bytes: &[u8]) -> Vec<usize> {
    let (graph, weights) = sections(bytes);
    let g_end = 20 + graph.len();
    vec![0, 8, 12, 20, g_end, g_end + 8, g_end + 8 + 8, g_end + 8 + weights.len()]
}

#[test]
fn bit_flips_overwrites_and_splices() {
    let base = sample_model().to_bytes().unwrap();
    assert!(check("original", &base));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut cases = 0;
    for i in 0..250 {
        let mut b = base.clone();
        let pos = rng.below(b.len());
        b[pos] ^= 1 << rng.below(8);
        check(&format!("bit flip {i} at {pos}"), &b);
        cases += 1;
    }
    for i in 0..150 {
        let mut b = base.clone();
        let pos = rng.below(b.len());
        b[pos] = match i % 3 {
            0 => 0x00,
            1 => 0xff,
            _ => rng.next() as u8,
        };
        check(&format!("overwrite {i} at {pos}"), &b);
        cases += 1;
    }
    for i in 0..60 {
        let mut b = base.clone();
        let pos = rng.below(b.len() + 1);
        if i % 2 == 0 {
            b.insert(pos, rng.next() as u8);
        } else if pos < b.len() {
            b.remove(pos);
        }
        check(&format!("insert/delete {i} at {pos}"), &b);
        cases += 1;
    }
    assert!(cases >= 460);
}

#[test]
fn truncations_at_boundaries_and_random_points() {
    let base = sample_model().to_bytes().unwrap();
    let mut rng = Rng(7);
    let mut points: Vec<usize> = boundaries(&base)
        .into_iter()
        .flat_map(|b| [b.saturating_sub(1), b, b + 1])
        .filter(|&p| p < base.len())
        .collect();
    points.extend((0..60).map(|_| rng.below(base.len())));
    for p in points {
        assert!(
            !check(&format!("truncate at {p}"), &base[..p]),
            "truncated at {p} but loaded"
        );
    }
}

#[test]
fn huge_and_off_by_one_lengths() {
    let base = sample_model().to_bytes().unwrap();
    let (graph, weights) = sections(&base);
    let g_len_at = 12;
    let w_len_at = 20 + graph.len();
    let values = [
        u64::MAX,
        u64::MAX / 2,
        1 << 63,
        1 << 40,
        u32::MAX as u64,
        0,
        graph.len() as u64 + 1,
        graph.len() as u64 - 1,
        weights.len() as u64 + 1,
        weights.len() as u64 - 1,
    ];
    for at in [g_len_at, w_len_at] {
        for v in values {
            let mut b = base.clone();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            check(&format!("length at {at} = {v}"), &b);
        }
    }
    // The safetensors header length inside the weights blob.
    for v in values {
        let mut w = weights.clone();
        w[..8].copy_from_slice(&v.to_le_bytes());
        check(&format!("safetensors header length {v}"), &assemble_v1(&graph, &w));
    }
}

/// Replace the first occurrence of `from` in the graph JSON and fix up the section length.
fn edit_graph(base: &[u8], from: &str, to: &str) -> Vec<u8> {
    let (graph, weights) = sections(base);
    let text = String::from_utf8(graph).unwrap();
    assert!(text.contains(from), "fixture lacks `{from}`");
    assert!(Model::from_bytes(&assemble_v1(text.as_bytes(), &weights)).is_ok());
    assemble_v1(text.replacen(from, to, 1).as_bytes(), &weights)
}

#[test]
fn hostile_graph_json() {
    let base = sample_model().to_bytes().unwrap();
    let deep = |open: &str, close: &str, n: usize| format!("{}{}", open.repeat(n), close.repeat(n));
    let edits: Vec<(&str, String)> = vec![
        // 100k-deep nesting: serde_json's recursion limit must stop it, not the stack.
        ("\"inputs\":[0,1]", format!("\"inputs\":{}", deep("[", "]", 100_000))),
        (
            "\"inputs\":[0,1]",
            format!("\"inputs\":[0,1],\"x\":{}", deep("{\"a\":", "}", 100_000)),
        ),
        ("\"name\":\"sample\"", format!("\"name\":{}", deep("[", "]", 100_000))),
        // Huge shapes: in an input type, a param type, a constant, and ops' shape attributes.
        ("{\"Static\":4}", "{\"Static\":1000000000000000}".into()),
        ("{\"Static\":4}", "{\"Static\":18446744073709551615}".into()),
        ("{\"Static\":4}", "{\"Static\":18446744073709551616}".into()),
        ("{\"Static\":4}", "{\"Static\":-1}".into()),
        ("{\"Static\":4}", "{\"Static\":1e15}".into()),
        ("\"shape\":[3]", "\"shape\":[1000000000000000]".into()),
        ("\"shape\":[3]", "\"shape\":[1000000000000000,1000000000000000]".into()),
        (
            "\"Cast\":{\"to\":\"f16\"}",
            "\"Iota\":{\"shape\":[{\"Static\":1000000000000000}],\"axis\":0,\"dtype\":\"f32\"}".into(),
        ),
        (
            "\"Cast\":{\"to\":\"f16\"}",
            "\"Reshape\":{\"shape\":[{\"Static\":1000000000000000},{\"Static\":1000000000000000}]}".into(),
        ),
        (
            "\"Cast\":{\"to\":\"f16\"}",
            "\"Permute\":{\"perm\":[18446744073709551615]}".into(),
        ),
        (
            "\"Cast\":{\"to\":\"f16\"}",
            "\"Concat\":{\"axis\":18446744073709551615}".into(),
        ),
        ("\"Cast\":{\"to\":\"f16\"}", "\"Slice\":{\"ranges\":[]}".into()),
        ("\"before\":[0,1]", "\"before\":[0,18446744073709551615]".into()),
        ("\"after\":[0,2]", "\"after\":[18446744073709551615,2]".into()),
        (
            "\"normalized_ndim\":1",
            "\"normalized_ndim\":18446744073709551615".into(),
        ),
        // References: forward, to itself, far past the end, to a missing output.
        ("\"inputs\":[0,1]", "\"inputs\":[0,0]".into()),
        ("\"inputs\":[0,1]", "\"inputs\":[18446744073709551615]".into()),
        (
            "\"outputs\":[[\"out\",[",
            "\"outputs\":[[\"out\",[999999,0]],[\"x\",[".into(),
        ),
        (
            "\"outputs\":[[\"out\",[",
            "\"outputs\":[[\"out\",[0,4294967295]],[\"x\",[".into(),
        ),
        // Wrong JSON kinds and unknown fields.
        ("\"name\":\"sample\"", "\"name\":null".into()),
        ("\"name\":\"sample\"", "\"name\":\"sample\",\"extra\":1".into()),
        ("\"value\":\"-inf\"", "\"value\":\"nan:0000000000000001\"".into()),
        ("\"value\":\"-inf\"", "\"value\":\"nan:zz\"".into()),
        ("\"value\":\"-inf\"", "\"value\":1e400".into()),
        ("\"dtype\":\"f32\"", "\"dtype\":\"f8\"".into()),
        ("\"Cond\"", "\"While\"".into()),
        ("\"Cond\"", "\"MatMul\"".into()),
    ];
    for (i, (from, to)) in edits.iter().enumerate() {
        let b = edit_graph(&base, from, to);
        assert!(!check(
            &format!("json edit {i}: {from} -> {}", &to[..to.len().min(60)]),
            &b
        ));
    }
}

#[test]
fn deeply_nested_regions_hit_the_json_recursion_limit() {
    let (_, weights) = sections(&sample_model().to_bytes().unwrap());
    let open = r#"{"name":"g","inputs":[],"nodes":[{"op":"While","inputs":[],"regions":["#;
    let leaf = r#"{"name":"g","inputs":[],"nodes":[],"outputs":[]}"#;
    let close = r#"]}],"outputs":[]}"#;
    for depth in [40, 100_000] {
        let json = format!("{}{leaf}{}", open.repeat(depth), close.repeat(depth));
        let b = assemble_v1(json.as_bytes(), &weights);
        assert!(!check(&format!("regions {depth} deep"), &b));
        let e = Model::from_bytes(&b).unwrap_err().to_string();
        assert!(e.contains("recursion limit exceeded"), "{e}");
    }
}

#[test]
fn every_number_in_the_json_replaced() {
    let base = sample_model().to_bytes().unwrap();
    let (graph, weights) = sections(&base);
    let text = String::from_utf8(graph).unwrap();
    // Start offsets of number tokens.
    let bytes = text.as_bytes();
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| {
            bytes[i].is_ascii_digit()
                && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'.' || bytes[i - 1] == b'-'))
        })
        .collect();
    assert!(starts.len() > 50);
    let mut rng = Rng(99);
    let mut cases = 0;
    for _ in 0..120 {
        let s = starts[rng.below(starts.len())];
        let end = s + bytes[s..]
            .iter()
            .take_while(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'-'))
            .count();
        let repl = [
            "18446744073709551615",
            "4294967296",
            "0",
            "1000000000000000",
            "2",
            "-1",
            "1e300",
        ][rng.below(7)];
        let edited = format!("{}{}{}", &text[..s], repl, &text[end..]);
        check(
            &format!("number at {s} -> {repl}"),
            &assemble_v1(edited.as_bytes(), &weights),
        );
        cases += 1;
    }
    assert_eq!(cases, 120);
}

#[test]
fn hostile_safetensors_headers() {
    let base = sample_model().to_bytes().unwrap();
    let (graph, weights) = sections(&base);
    let n = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(weights[8..8 + n].to_vec()).unwrap();
    let data = &weights[8 + n..];
    let rebuilt = |h: &str| {
        let mut w = (h.len() as u64).to_le_bytes().to_vec();
        w.extend_from_slice(h.as_bytes());
        w.extend_from_slice(data);
        assemble_v1(&graph, &w)
    };
    assert!(check("rebuilt safetensors", &rebuilt(&header)));
    let edits = [
        ("\"dtype\":\"BF16\"", "\"dtype\":\"F8_E4M3\""),
        ("\"dtype\":\"BF16\"", "\"dtype\":\"U64\""),
        ("\"dtype\":\"BOOL\"", "\"dtype\":\"U8\""),
        ("\"shape\":[3]", "\"shape\":[1000000000000000]"),
        ("\"shape\":[3]", "\"shape\":[18446744073709551615,18446744073709551615]"),
        ("\"data_offsets\":[", "\"data_offsets\":[18446744073709551615,"),
        ("{", "{\"__metadata__\":{\"a\":\"b\"},"),
        (
            "{",
            "{\"__metadata__\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],",
        ),
    ];
    for (i, (from, to)) in edits.iter().enumerate() {
        assert!(header.contains(from), "{from}");
        check(
            &format!("safetensors edit {i}"),
            &rebuilt(&header.replacen(from, to, 1)),
        );
    }
    let deep = format!("{{\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    check("safetensors deep nesting", &rebuilt(&deep));
    // A bool weight holding 2.
    let bool_info = header.find("\"extra.bool\"").unwrap();
    let off: usize = header[bool_info..]
        .split("data_offsets\":[")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut w = weights.clone();
    w[8 + n + off] = 2;
    let e = Model::from_bytes(&assemble_v1(&graph, &w)).unwrap_err().to_string();
    assert!(e.contains("extra.bool") && e.contains("other than 0 and 1"), "{e}");
}
