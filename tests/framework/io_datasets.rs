//! Datasets: the shipped UCI digits (counts, range, known rows, fixed split), the MNIST /
//! Fashion-MNIST IDX and CIFAR-10 / CIFAR-100 binary readers, ImageFolder and the text
//! classification reader on files written here, including hostile and truncated files and
//! absent data sets.

use flate2::Compression;
use flate2::write::GzEncoder;
use oar::io::Dataset;
use oar::io::datasets::{
    Cifar10, Cifar100, Digits, FashionMnist, ImageFolder, Mnist, Split, TextClassification, Vocab, read_idx_u8,
    tokenize,
};
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

/// CIFAR-100 records carry a coarse and a fine label; samples use the fine one unless asked;
/// a fine label past 99 is an error naming the record.
#[test]
fn cifar100_reads_fine_and_coarse_labels() {
    let dir = tempfile::tempdir().unwrap();
    let rec = |coarse: u8, fine: u8, seed: usize| {
        let mut r = vec![coarse];
        r.extend(record(fine, seed));
        r
    };
    let train = write(dir.path(), "train.bin", &[rec(4, 57, 0), rec(19, 99, 9)].concat());
    let c = Cifar100::from_dir(dir.path(), Split::Train).unwrap();
    assert_eq!(c.len(), 2);
    let (x, y) = c.get(1).unwrap();
    assert_eq!(y.to_vec::<i64>().unwrap(), vec![99]);
    // Plane 2, offset 37: (9 + 6 + 37) % 256 = 52.
    assert_eq!(x.to_vec::<f32>().unwrap()[2 * 1024 + 37], 52.0 / 255.0);
    let coarse = Cifar100::from_binary(&[&train]).unwrap().coarse_labels(true);
    assert_eq!(coarse.get(0).unwrap().1.to_vec::<i64>().unwrap(), vec![4]);
    let bad = write(dir.path(), "bad.bin", &rec(3, 100, 0));
    let err = Cifar100::from_binary(&[&bad]).err().unwrap().to_string();
    assert!(
        err.contains("bad.bin") && err.contains("record 0 has fine label 100"),
        "{err}"
    );
    let err = Cifar100::from_binary(&[&write(dir.path(), "c10.bin", &record(1, 0))])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("3074-byte CIFAR-100 records"), "{err}");
}

/// Absent data sets say which files to put in which directory and where they come from.
#[test]
fn absent_data_sets_say_where_to_put_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let msg = |e: oar::Error| e.to_string();
    let e = msg(Mnist::from_dir(dir.path(), Split::Train).err().unwrap());
    assert!(
        e.contains("MNIST files not found")
            && e.contains("train-images-idx3-ubyte, train-labels-idx1-ubyte")
            && e.contains(&dir.path().display().to_string())
            && e.contains("downloads nothing"),
        "{e}"
    );
    let e = msg(FashionMnist::from_dir(dir.path(), Split::Test).err().unwrap());
    assert!(
        e.contains("Fashion-MNIST") && e.contains("t10k-images-idx3-ubyte"),
        "{e}"
    );
    let e = msg(Cifar10::from_dir(dir.path(), Split::Train).err().unwrap());
    assert!(
        e.contains("data_batch_1.bin") && e.contains("data_batch_5.bin") && e.contains("cifar"),
        "{e}"
    );
    let e = msg(Cifar100::from_dir(dir.path(), Split::Test).err().unwrap());
    assert!(e.contains("test.bin"), "{e}");
}

/// Fashion-MNIST reads MNIST's format and names (gzip here) and has its own class names.
#[test]
fn fashion_mnist_reads_idx_files() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "t10k-images-idx3-ubyte.gz",
        &gzip(&idx(&[3, 2, 3], &mnist_pixels())),
    );
    write(dir.path(), "t10k-labels-idx1-ubyte.gz", &gzip(&idx(&[3], &[9, 0, 4])));
    let f = FashionMnist::from_dir(dir.path(), Split::Test).unwrap();
    assert_eq!(f.len(), 3);
    assert_eq!(f.labels(), &[9, 0, 4]);
    let (x, y) = f.get(1).unwrap();
    assert_eq!((x.shape(), y.to_vec::<i64>().unwrap()), (vec![1, 2, 3], vec![0]));
    assert_eq!(x.to_vec::<f32>().unwrap()[5], 90.0 / 255.0);
    assert_eq!(FashionMnist::CLASSES[9], "Ankle boot");
}

/// A 2 × 3 RGB PNG whose pixels are all `value`.
fn png(path: &Path, value: u8) {
    let img = image::RgbImage::from_pixel(3, 2, image::Rgb([value, value, value]));
    img.save(path).unwrap();
}

/// ImageFolder: classes are the sorted subdirectories, samples the images in each (nested ones
/// included, other files skipped) in path order, decoded to [0, 1] and transformed; an empty
/// root, a root without images and a broken image are errors naming the path.
#[test]
fn image_folder_labels_by_directory() {
    use oar::vision::transforms::CenterCrop;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for class in ["dog", "cat", "bird/nested"] {
        std::fs::create_dir_all(root.join(class)).unwrap();
    }
    png(&root.join("dog/b.png"), 10);
    png(&root.join("dog/a.PNG"), 20);
    png(&root.join("cat/x.png"), 30);
    png(&root.join("bird/nested/deep.png"), 40);
    std::fs::write(root.join("cat/notes.txt"), "not an image").unwrap();
    let f = ImageFolder::new(root).unwrap().transform(CenterCrop::new(2, 2));
    assert_eq!(f.classes(), ["bird", "cat", "dog"]);
    assert_eq!(f.len(), 4);
    let got: Vec<(f32, i64)> = (0..4)
        .map(|i| {
            let (x, y) = f.get(i).unwrap();
            assert_eq!(x.shape(), vec![3, 2, 2]);
            (x.to_vec::<f32>().unwrap()[0] * 255.0, y.to_vec::<i64>().unwrap()[0])
        })
        .collect();
    let want = [(40.0, 0), (30.0, 1), (20.0, 2), (10.0, 2)];
    for ((v, l), (wv, wl)) in got.iter().zip(want) {
        assert!((v - wv).abs() < 1e-3 && *l == wl, "{got:?}");
    }
    assert!(f.get(4).is_err());
    std::fs::write(root.join("cat/broken.png"), b"\x89PNG garbage").unwrap();
    let f = ImageFolder::new(root).unwrap();
    let broken = f
        .samples()
        .iter()
        .position(|(p, _)| p.ends_with("cat/broken.png"))
        .unwrap();
    let e = f.get(broken).unwrap_err().to_string();
    assert!(e.contains("broken.png"), "{e}");
    let empty = tempfile::tempdir().unwrap();
    let e = ImageFolder::new(empty.path()).err().unwrap().to_string();
    assert!(e.contains("no class directories"), "{e}");
    std::fs::create_dir(empty.path().join("a")).unwrap();
    let e = ImageFolder::new(empty.path()).err().unwrap().to_string();
    assert!(e.contains("no png/jpg/jpeg images"), "{e}");
    let e = ImageFolder::new(root.join("missing")).err().unwrap().to_string();
    assert!(e.contains("missing"), "{e}");
}

/// The tokenizer splits off punctuation and CJK characters and lower-cases; the vocabulary
/// orders by frequency (ties alphabetically) after `<pad>` and `<unk>`, honours min_freq and
/// max_size, round-trips through a file, and rejects a malformed one.
#[test]
fn tokenizer_and_vocabulary() {
    assert_eq!(
        tokenize("Hello, World!  It's 2026\tok 中文"),
        ["hello", ",", "world", "!", "it", "'", "s", "2026", "ok", "中", "文"]
    );
    let tokens = tokenize("b a b c b a d");
    let v = Vocab::build(&tokens, 1, None);
    let order: Vec<&str> = (0..v.len()).map(|i| v.token(i).unwrap()).collect();
    assert_eq!(order, ["<pad>", "<unk>", "b", "a", "c", "d"]);
    assert_eq!(v.encode(&tokenize("a z b"), 5), vec![3, 1, 2, 0, 0]);
    assert_eq!(v.encode(&tokens, 2), vec![2, 3]);
    assert_eq!(Vocab::build(&tokens, 2, None).len(), 4);
    assert_eq!(Vocab::build(&tokens, 1, Some(3)).len(), 3);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vocab.txt");
    v.save(&path).unwrap();
    assert_eq!(Vocab::load(&path).unwrap(), v);
    std::fs::write(&path, "<pad>\n<unk>\nx\nx\n").unwrap();
    let e = Vocab::load(&path).unwrap_err().to_string();
    assert!(e.contains("vocab.txt") && e.contains("\"x\" appears twice"), "{e}");
    std::fs::write(&path, "x\n").unwrap();
    assert!(Vocab::load(&path).is_err());
}

/// TextClassification: labels become class positions (numeric labels in numeric order), texts
/// ids padded or truncated to max_len; the test split reuses the training vocabulary and
/// classes; malformed lines and unknown labels are errors naming the file and line.
#[test]
fn text_classification_reads_label_tab_text() {
    let dir = tempfile::tempdir().unwrap();
    let train = write(
        dir.path(),
        "train.tsv",
        b"10\tgood movie , good fun\n2\tbad movie\n\n10\tgood\n",
    );
    let t = TextClassification::from_tsv(&train, 4, 1).unwrap();
    assert_eq!(t.classes(), ["2", "10"]);
    assert_eq!(t.len(), 3);
    let v = t.vocab();
    let (x, y) = t.get(0).unwrap();
    let want: Vec<i64> = ["good", "movie", ",", "good"].iter().map(|w| v.id(w) as i64).collect();
    assert_eq!(
        (x.to_vec::<i64>().unwrap(), y.to_vec::<i64>().unwrap()),
        (want, vec![1])
    );
    assert_eq!(v.token(2), Some("good"));
    let (x, y) = t.get(1).unwrap();
    assert_eq!(x.to_vec::<i64>().unwrap()[2..], [0, 0]);
    assert_eq!(y.to_vec::<i64>().unwrap(), vec![0]);
    let test = write(dir.path(), "test.tsv", b"2\tunseen words\n");
    let t2 = TextClassification::from_tsv_with(&test, 4, v.clone(), t.classes().to_vec()).unwrap();
    assert_eq!(t2.get(0).unwrap().0.to_vec::<i64>().unwrap(), vec![1, 1, 0, 0]);
    let bad = write(dir.path(), "bad.tsv", b"7\tfine\nno tab here\n");
    let e = TextClassification::from_tsv(&bad, 4, 1).err().unwrap().to_string();
    assert!(e.contains("bad.tsv") && e.contains("line 2"), "{e}");
    let unknown = write(dir.path(), "unknown.tsv", b"7\tfine\n");
    let e = TextClassification::from_tsv_with(&unknown, 4, v.clone(), t.classes().to_vec())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("line 1") && e.contains("\"7\""), "{e}");
    let empty = write(dir.path(), "empty.tsv", b"\n");
    assert!(TextClassification::from_tsv(&empty, 4, 1).is_err());
    assert!(TextClassification::from_tsv(&train, 0, 1).is_err());
}

/// `Transformed` applies a transform to each image when fetched; a failing transform is an
/// error naming the sample.
#[test]
fn transformed_datasets_apply_the_transform() {
    use oar::io::datasets::Transformed;
    use oar::vision::transforms::{CenterCrop, Normalize};
    let plain = Digits::new(Split::Test).unwrap();
    let (x, y) = plain.get(3).unwrap();
    let t = Transformed::new(
        Digits::new(Split::Test).unwrap(),
        Normalize::new(&[0.5], &[0.25]).unwrap(),
    );
    assert_eq!(t.len(), plain.len());
    let (tx, ty) = t.get(3).unwrap();
    let want: Vec<f32> = x.to_vec::<f32>().unwrap().iter().map(|v| (v - 0.5) / 0.25).collect();
    assert_eq!(
        (tx.to_vec::<f32>().unwrap(), ty.to_vec::<i64>().unwrap()),
        (want, y.to_vec::<i64>().unwrap())
    );
    let bad = Transformed::new(Digits::new(Split::Test).unwrap(), CenterCrop::new(9, 9));
    let e = bad.get(5).unwrap_err().to_string();
    assert!(e.contains("sample 5") && e.contains("CenterCrop"), "{e}");
}
