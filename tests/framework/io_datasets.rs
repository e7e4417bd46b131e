//! Datasets: the shipped UCI digits (counts, range, known rows, fixed split) and the MNIST IDX /
//! CIFAR-10 binary readers on files written here, including hostile and truncated files.

use flate2::Compression;
use flate2::write::GzEncoder;
use oar::io::Dataset;
use oar::io::datasets::{Cifar10, Digits, Mnist, Split, read_idx_u8};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Line 1 of data/digits/digits.csv.gz, by value (checked with `zcat | head -1`).
const FIRST_ROW: [u8; 64] = [
    0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0, 0, 5, 8, 0,
    0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0,
];
/// Class counts of the UCI test set (scikit-learn's documentation and the data README).
const CLASS_COUNTS: [usize; 10] = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180];

fn both_splits() -> (Digits, Digits) {
    (Digits::new(Split::Train).unwrap(), Digits::new(Split::Test).unwrap())
}

/// The sample of `d` that is line `row` of the CSV, if this split has it.
fn find_row(d: &Digits, row: usize) -> Option<(Vec<f32>, i64)> {
    let i = d.rows().iter().position(|&r| r == row)?;
    let (x, y) = d.get(i).unwrap();
    assert_eq!(x.shape(), vec![1, 8, 8]);
    assert_eq!(y.shape(), Vec::<usize>::new());
    Some((x.to_vec::<f32>().unwrap(), y.to_vec::<i64>().unwrap()[0]))
}

#[test]
fn digits_split_is_fixed_disjoint_and_complete() {
    let (train, test) = both_splits();
    assert_eq!((train.len(), test.len()), (1437, 360));
    let mut rows: Vec<usize> = train.rows().iter().chain(test.rows()).copied().collect();
    rows.sort();
    assert_eq!(rows, (0..1797).collect::<Vec<_>>());
    let mut counts = [0usize; 10];
    for &y in train.labels().iter().chain(test.labels()) {
        counts[y as usize] += 1;
    }
    assert_eq!(counts, CLASS_COUNTS);
    assert_eq!(counts.iter().sum::<usize>(), 1797);
    // Every class lands in the test split (a stratification sanity check on the seeded split).
    assert!((0..10).all(|c| test.labels().contains(&c)));
    // Reloading gives the same split.
    assert_eq!(Digits::new(Split::Test).unwrap().rows(), test.rows());
}

#[test]
fn digits_known_rows_and_pixel_range() {
    let (train, test) = both_splits();
    let (pixels, label) = find_row(&train, 0).or_else(|| find_row(&test, 0)).unwrap();
    assert_eq!(label, 0);
    let want: Vec<f32> = FIRST_ROW.iter().map(|&p| p as f32 / 16.0).collect();
    assert_eq!(pixels, want);
    // The last line ends in label 8.
    let (_, last) = find_row(&train, 1796).or_else(|| find_row(&test, 1796)).unwrap();
    assert_eq!(last, 8);

    let (mut lo, mut hi) = (f32::MAX, f32::MIN);
    for d in [&train, &test] {
        for i in 0..d.len() {
            for v in d.get(i).unwrap().0.to_vec::<f32>().unwrap() {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
    }
    assert_eq!((lo, hi), (0.0, 1.0));
    assert!(train.get(1437).is_err());
}

#[test]
fn digits_bad_files_are_errors_naming_the_file() {
    let missing = Path::new("/nonexistent/oar/digits.csv.gz");
    let err = Digits::from_path(missing, Split::Train).err().unwrap().to_string();
    assert!(err.contains("/nonexistent/oar/digits.csv.gz"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "0,1,2\n").unwrap();
    let err = Digits::from_path(&bad, Split::Test).err().unwrap().to_string();
    assert!(err.contains("bad.csv") && err.contains("line 1"), "{err}");
    let mut row: Vec<String> = (0..65).map(|_| "0".to_string()).collect();
    row[3] = "17".into();
    std::fs::write(&bad, row.join(",")).unwrap();
    let err = Digits::from_path(&bad, Split::Test).err().unwrap().to_string();
    assert!(err.contains("field 4 is 17"), "{err}");
    row[3] = "0".into();
    std::fs::write(&bad, row.join(",")).unwrap();
    let err = Digits::from_path(&bad, Split::Test).err().unwrap().to_string();
    assert!(err.contains("1 samples, expected 1797"), "{err}");
}

/// An IDX file: magic `[0, 0, 8, ndim]`, big-endian dims, data.
fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// 3 images of 2×3 pixels: pixel `k` of image `n` is `40n + 10k`, except one 255.
fn mnist_pixels() -> Vec<u8> {
    let mut px: Vec<u8> = (0..3u8).flat_map(|n| (0..6u8).map(move |k| 40 * n + 10 * k)).collect();
    px[17] = 255;
    px
}

#[test]
fn mnist_reads_plain_and_gzip_idx() {
    let dir = tempfile::tempdir().unwrap();
    let images = idx(&[3, 2, 3], &mnist_pixels());
    let labels = idx(&[3], &[7, 0, 9]);
    for (img, lab) in [
        (write(dir.path(), "i", &images), write(dir.path(), "l", &labels)),
        (
            write(dir.path(), "i.gz", &gzip(&images)),
            write(dir.path(), "l.gz", &gzip(&labels)),
        ),
    ] {
        let m = Mnist::from_idx(&img, &lab).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m.image_size(), (2, 3));
        assert_eq!(m.labels(), &[7, 0, 9]);
        let (x, y) = m.get(1).unwrap();
        assert_eq!(x.shape(), vec![1, 2, 3]);
        let want: Vec<f32> = [40u8, 50, 60, 70, 80, 90].iter().map(|&p| p as f32 / 255.0).collect();
        assert_eq!(x.to_vec::<f32>().unwrap(), want);
        assert_eq!(y.to_vec::<i64>().unwrap(), vec![0]);
        assert_eq!(m.get(2).unwrap().0.to_vec::<f32>().unwrap()[5], 1.0);
        assert!(m.get(3).is_err());
    }
    let (dims, data) = read_idx_u8(dir.path().join("i.gz")).unwrap();
    assert_eq!((dims, data), (vec![3, 2, 3], mnist_pixels()));

    // The standard names, gzipped.
    write(dir.path(), "t10k-images-idx3-ubyte.gz", &gzip(&images));
    write(dir.path(), "t10k-labels-idx1-ubyte", &labels);
    assert_eq!(Mnist::from_dir(dir.path(), Split::Test).unwrap().len(), 3);
}

/// Build an images file from `bytes` and expect an error mentioning the file and `needle`.
fn mnist_error(name: &str, images: &[u8], labels: &[u8], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let img = write(dir.path(), name, images);
    let lab = write(dir.path(), "labels", labels);
    let err = Mnist::from_idx(&img, &lab).err().expect("must fail").to_string();
    assert!(err.contains(needle), "{err}");
    assert!(err.contains(name) || err.contains("labels"), "{err}");
}

#[test]
fn mnist_hostile_files_are_errors() {
    let good_images = idx(&[3, 2, 3], &mnist_pixels());
    let good_labels = idx(&[3], &[7, 0, 9]);
    let mut bad_magic = good_images.clone();
    bad_magic[2] = 0x0D; // float data
    mnist_error("magic", &bad_magic, &good_labels, "bad IDX magic number 0x00000d03");
    mnist_error("rank", &good_labels, &good_labels, "need magic 0x00000803");
    mnist_error(
        "short",
        &good_images[..good_images.len() - 1],
        &good_labels,
        "truncated",
    );
    mnist_error("header", &good_images[..10], &good_labels, "truncated");
    mnist_error("empty", &[], &good_labels, "truncated");
    let mut long = good_images.clone();
    long.push(0);
    mnist_error("long", &long, &good_labels, "too long");
    // An absurd header on a tiny file: refused before any allocation of its claimed size.
    mnist_error(
        "absurd",
        &idx(&[u32::MAX, u32::MAX, u32::MAX], &[1, 2, 3]),
        &good_labels,
        "overflow",
    );
    mnist_error(
        "absurd2",
        &idx(&[60000, 28, 28], &[1, 2, 3]),
        &good_labels,
        "the file holds 3",
    );
    mnist_error(
        "absurd.gz",
        &gzip(&idx(&[60000, 28, 28], &[1, 2, 3])),
        &good_labels,
        "truncated",
    );
    mnist_error(
        "huge.gz",
        &gzip(&idx(&[1 << 20, 1 << 10, 1 << 10], &[])),
        &good_labels,
        "limit",
    );
    let mut cut_gz = gzip(&good_images);
    cut_gz.truncate(cut_gz.len() / 2);
    mnist_error("cut.gz", &cut_gz, &good_labels, "cannot read IDX data");
    mnist_error("count", &good_images, &idx(&[2], &[1, 2]), "2 labels");
    let dir = tempfile::tempdir().unwrap();
    let err = Mnist::from_idx(dir.path().join("nope"), dir.path().join("nope2"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("nope") && err.contains("cannot open"), "{err}");
}

/// A CIFAR record: label, then pixel `c*1024 + k` = `(seed + 3c + k) % 256`.
fn record(label: u8, seed: usize) -> Vec<u8> {
    let mut r = vec![label];
    r.extend((0..3072).map(|i| ((seed + 3 * (i / 1024) + i % 1024) % 256) as u8));
    r
}

#[test]
fn cifar10_reads_records_across_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), "data_batch_1.bin", &[record(3, 0), record(9, 100)].concat());
    let b = write(dir.path(), "data_batch_2.bin", &gzip(&record(0, 7)));
    let c = Cifar10::from_binary(&[&a, &b]).unwrap();
    assert_eq!(c.len(), 3);
    let labels: Vec<i64> = (0..3)
        .map(|i| c.get(i).unwrap().1.to_vec::<i64>().unwrap()[0])
        .collect();
    assert_eq!(labels, vec![3, 9, 0]);
    let (x, _) = c.get(1).unwrap();
    assert_eq!(x.shape(), vec![3, 32, 32]);
    let x = x.to_vec::<f32>().unwrap();
    // [c, h, w] = [2, 1, 5]: plane 2, offset 1*32 + 5 = 37 → (100 + 6 + 37) % 256 = 143.
    assert_eq!(x[2 * 1024 + 37], 143.0 / 255.0);
    assert_eq!(x[0], 100.0 / 255.0);
    let last = c.get(2).unwrap().0.to_vec::<f32>().unwrap();
    assert_eq!(last[3071], ((7 + 6 + 1023) % 256) as f32 / 255.0);
    assert!(c.get(3).is_err());
    assert_eq!(Cifar10::CLASSES[3], "cat");
}

#[test]
fn cifar10_bad_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.bin", &record(1, 0));
    let mut short = record(1, 0);
    short.pop();
    let cases = [
        ("short.bin", short.clone(), "not a whole number"),
        ("empty.bin", vec![], "not a whole number"),
        ("short.gz", gzip(&short), "not a whole number"),
        (
            "label.bin",
            [record(2, 0), record(10, 0)].concat(),
            "record 1 has label 10",
        ),
    ];
    for (name, bytes, needle) in cases {
        let bad = write(dir.path(), name, &bytes);
        let err = Cifar10::from_binary(&[&good, &bad]).err().unwrap().to_string();
        assert!(err.contains(name) && err.contains(needle), "{err}");
    }
    let err = Cifar10::from_dir(dir.path(), Split::Test).err().unwrap().to_string();
    assert!(err.contains("test_batch.bin"), "{err}");
}
