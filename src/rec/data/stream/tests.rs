use super::*;
use crate::rec::data::sample::{KEY_ROWS, RowSampler};
use crate::rec::data::{CriteoLikeConfig, Draws, derive_key, feature_id, generate, missing_id};
use std::io::Write;

/// Every row of `stream` as (label, dense bits, ids), in order.
fn rows_of(stream: CtrStream) -> Vec<(u32, Vec<u32>, Vec<i64>)> {
    let mut rows = Vec::new();
    for batch in stream {
        let batch = batch.unwrap();
        let (b, d, f) = (batch.rows(), batch.dense.shape()[1], batch.ids.shape()[1]);
        let dense = batch.dense.to_vec::<f32>().unwrap();
        let ids = batch.ids.to_vec::<i64>().unwrap();
        let label = batch.label.to_vec::<f32>().unwrap();
        for r in 0..b {
            rows.push((
                label[r].to_bits(),
                dense[r * d..(r + 1) * d].iter().map(|x| x.to_bits()).collect(),
                ids[r * f..(r + 1) * f].to_vec(),
            ));
        }
    }
    rows
}

fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A well-formed Criteo line with every kind of value, `label` first.
fn criteo_line(label: &str) -> String {
    let dense = ["1", "-1", "", "0", "1382", "4", "15", "2", "181", "1", "2", "", "2"];
    let mut cats = vec!["68fd1e64"; 26];
    cats[2] = "";
    cats[5] = "fe6b92e5";
    format!("{label}\t{}\t{}", dense.join("\t"), cats.join("\t"))
}

#[test]
fn reads_back_the_generated_values() {
    let dir = tempfile::tempdir().unwrap();
    let config = CriteoLikeConfig {
        seed: 4,
        ..CriteoLikeConfig::default()
    };
    generate(&config, dir.path(), 500, 2).unwrap();
    let read = rows_of(CtrStream::open(&[dir.path()], 64).unwrap());
    assert_eq!(read.len(), 500);
    let sampler = RowSampler::new(&config).unwrap();
    let rows_key = derive_key(config.seed, KEY_ROWS);
    let (mut row, mut dense, mut ids) = (RawRow::default(), Vec::new(), Vec::new());
    for (g, (_, read_dense, read_ids)) in read.iter().enumerate() {
        sampler.sample(&mut Draws::new(RowSampler::row_key(rows_key, g as u64)), &mut row);
        row.features(&mut dense, &mut ids);
        let want: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        assert_eq!(read_ids, &want, "row {g}");
        let want: Vec<u32> = dense.iter().map(|&x| (x as f32).to_bits()).collect();
        assert_eq!(read_dense, &want, "row {g}");
    }
}

#[test]
fn shards_cover_every_row_once() {
    let dir = tempfile::tempdir().unwrap();
    generate(&CriteoLikeConfig::default(), dir.path(), 700, 4).unwrap();
    let mut all = rows_of(CtrStream::open(&[dir.path()], 50).unwrap());
    all.sort();
    // 2 and 4 trainers shard by file (3 unevenly), 5 and 9 by line.
    for trainers in [1, 2, 3, 4, 5, 9] {
        let mut union = Vec::new();
        for t in 0..trainers {
            let stream = CtrStream::open(&[dir.path()], 32).unwrap().shard(t, trainers).unwrap();
            assert_eq!(stream.sharded_by_line(), trainers > 4);
            union.extend(rows_of(stream));
        }
        union.sort();
        assert!(
            union == all,
            "{trainers} trainers: {} rows, want {}",
            union.len(),
            all.len()
        );
    }
    assert!(CtrStream::open(&[dir.path()], 32).unwrap().shard(2, 2).is_err());
}

#[test]
fn batches_are_full_but_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (0..10)
        .map(|i| criteo_line(if i % 3 == 0 { "1" } else { "0" }))
        .collect();
    let path = write_file(dir.path(), "day_0", &(lines.join("\n") + "\n"));
    let batches: Vec<CtrBatch> = CtrStream::open(&[&path], 4).unwrap().map(Result::unwrap).collect();
    let sizes: Vec<usize> = batches.iter().map(CtrBatch::rows).collect();
    assert_eq!(sizes, [4, 4, 2]);
    assert_eq!(batches[0].dense.shape(), [4, 13]);
    assert_eq!(batches[0].ids.shape(), [4, 26]);
    assert_eq!(batches[0].label.to_vec::<f32>().unwrap(), [1.0, 0.0, 0.0, 1.0]);
    let dense = batches[0].dense.to_vec::<f32>().unwrap();
    // ln(1 + 1); the negative count and the missing value are 0; ln(1 + 1382).
    assert_eq!(&dense[..5], &[2f32.ln(), 0.0, 0.0, 0.0, 1383f32.ln()]);
    let ids = batches[0].ids.to_vec::<i64>().unwrap();
    assert_eq!(ids[0], feature_id(0, 0x68fd_1e64) as i64);
    assert_eq!(ids[2], missing_id(2) as i64);
    assert_eq!(ids[5], feature_id(5, 0xfe6b_92e5) as i64);
}

#[test]
fn reads_gzip_and_crlf() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!("{}\r\n{}", criteo_line("1"), criteo_line("0"));
    let plain = write_file(dir.path(), "plain.txt", &text.replace("\r\n", "\n"));
    let gz = dir.path().join("day_1.gz");
    let mut enc = flate2::write::GzEncoder::new(File::create(&gz).unwrap(), flate2::Compression::fast());
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap();
    let a = rows_of(CtrStream::open(&[plain], 8).unwrap());
    assert_eq!(a.len(), 2);
    assert_eq!(a, rows_of(CtrStream::open(&[gz], 8).unwrap()));
}

/// The error of reading `text` as file `bad.txt`, after which the stream ends.
fn error_of(dir: &Path, text: &str) -> String {
    let path = write_file(dir, "bad.txt", text);
    let mut stream = CtrStream::open(&[path], 2).unwrap();
    let mut err = None;
    for batch in stream.by_ref() {
        if let Err(e) = batch {
            assert!(matches!(e, Error::Io { .. }), "{e:?}");
            err = Some(e.to_string());
            break;
        }
    }
    assert!(stream.next().is_none(), "the stream goes on after an error");
    err.expect("no error")
}

#[test]
fn malformed_lines_name_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let good = criteo_line("0");
    let cases = [
        (
            format!("{good}\n{good}\t\n"),
            "line 2: expected 40 tab-separated columns",
            "got 41",
        ),
        (format!("{good}\n\n"), "line 2: expected 40", "got 1"),
        (
            criteo_line("0").replacen("68fd1e64", "68fd1g64", 1),
            "line 1: column C1: bad hex",
            "68fd1g64",
        ),
        (
            criteo_line("0").replacen("fe6b92e5", "1fe6b92e5", 1),
            "line 1: column C6: bad hex",
            "1fe6b92e5",
        ),
        (
            criteo_line("0").replacen("\t1382\t", "\t13.5\t", 1),
            "line 1: column I5: bad integer",
            "13.5",
        ),
        (
            format!("{good}\n{good}\n{}", criteo_line("2")),
            "line 3: the label must be 0 or 1",
            "\"2\"",
        ),
        (
            format!("{good}\n{}\n", "9".repeat(MAX_LINE_BYTES + 1)),
            "line 2: longer than 65536 bytes",
            "",
        ),
    ];
    for (text, want, value) in cases {
        let err = error_of(dir.path(), &text);
        assert!(
            err.contains("bad.txt: ") && err.contains(want) && err.contains(value),
            "{err}"
        );
    }
    // A line of exactly the limit is read (and then fails only on its columns).
    let err = error_of(dir.path(), &"9".repeat(MAX_LINE_BYTES));
    assert!(err.contains("line 1: expected 40"), "{err}");
}

#[test]
fn open_checks_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let err = CtrStream::open(&[dir.path().join("nope")], 8)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("nope") && err.contains("cannot open"), "{err}");
    let err = CtrStream::open(&[dir.path()], 8).err().unwrap().to_string();
    assert!(err.contains("no part-* files"), "{err}");
    let path = write_file(dir.path(), "x.txt", &criteo_line("1"));
    assert!(CtrStream::open(&[&path], 0).is_err());
    assert!(CtrStream::open::<&Path>(&[], 8).is_err());
    // Another layout: 2 integer and 3 categorical columns.
    let small = write_file(dir.path(), "small.txt", "1\t5\t\tab\t\t0\n");
    let stream = CtrStream::open(&[&small], 8).unwrap().with_layout(2, 3).unwrap();
    let rows = rows_of(stream);
    assert_eq!(
        rows[0].2,
        [
            feature_id(0, 0xab) as i64,
            missing_id(1) as i64,
            feature_id(2, 0) as i64
        ]
    );
}
