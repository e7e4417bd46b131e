//! `oar::vision::transforms` against onnxruntime's `Resize` and numpy's `pad`
//! (`tests/fixtures/transforms/transforms.json`, written by `tools/gen_transform_fixtures.py`),
//! and hand-computed values for the rest; bad input is a typed error naming the transform.

use oar::Tensor;
use oar::vision::transforms::{
    CenterCrop, Compose, Normalize, Pad, PadMode, RandomCrop, RandomHorizontalFlip, Resize, ToTensor, Transform,
};
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/transforms/transforms.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A nested JSON array as (shape, values).
fn array(v: &Value) -> (Vec<usize>, Vec<f32>) {
    fn walk(v: &Value, depth: usize, shape: &mut Vec<usize>, out: &mut Vec<f32>) {
        match v {
            Value::Array(a) => {
                if shape.len() == depth {
                    shape.push(a.len());
                }
                a.iter().for_each(|x| walk(x, depth + 1, shape, out));
            }
            x => out.push(x.as_f64().unwrap() as f32),
        }
    }
    let (mut shape, mut out) = (Vec::new(), Vec::new());
    walk(v, 0, &mut shape, &mut out);
    (shape, out)
}

fn tensor(v: &Value) -> Tensor {
    let (shape, data) = array(v);
    Tensor::from_vec(data, &shape).unwrap()
}

fn assert_close(got: &Tensor, want: &Value, tol: f32, what: &str) {
    let (shape, want) = array(want);
    assert_eq!(got.shape(), shape, "{what}");
    for (i, (a, b)) in got.to_vec::<f32>().unwrap().iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= tol, "{what}[{i}]: {a} vs {b}");
    }
}

#[test]
fn resize_matches_onnxruntime_up_and_down() {
    let f = fixture();
    let img = tensor(&f["image"]);
    for case in ["resize_up", "resize_down"] {
        let size: Vec<usize> = f[case]["size"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let out = Resize::new(size[0], size[1]).unwrap().apply(&img).unwrap();
        assert_close(&out, &f[case]["out"], 1e-6, case);
    }
}

#[test]
fn padding_matches_numpy_in_every_mode() {
    let f = fixture();
    let img = tensor(&f["image"]);
    let p: Vec<usize> = f["pad"]["padding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    for (mode, key) in [
        (PadMode::Constant(0.5), "constant"),
        (PadMode::Edge, "edge"),
        (PadMode::Reflect, "reflect"),
    ] {
        let out = Pad::new(p[0], p[1], p[2], p[3], mode).apply(&img).unwrap();
        assert_close(&out, &f["pad"][key], 0.0, key);
    }
    let e = Pad::new(5, 0, 0, 0, PadMode::Reflect)
        .apply(&img)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Pad") && e.contains("reflect"), "{e}");
}

/// ToTensor, Normalize, CenterCrop (its offset rounded half to even) and flips, by hand; a
/// composed pipeline; random crops are windows of the padded image; typed errors.
#[test]
fn the_other_transforms_by_hand() {
    // A 2 × 3 RGB u8 image, HWC.
    let hwc: Vec<u8> = (0..18).map(|i| (i * 14) as u8).collect();
    let x = ToTensor
        .apply(&Tensor::from_vec(hwc.clone(), &[2, 3, 3]).unwrap())
        .unwrap();
    assert_eq!(x.shape(), vec![3, 2, 3]);
    let v = x.to_vec::<f32>().unwrap();
    for (i, &b) in hwc.iter().enumerate() {
        let (y, xx, c) = (i / 9, (i / 3) % 3, i % 3);
        assert_eq!(v[(c * 2 + y) * 3 + xx], b as f32 / 255.0);
    }
    let n = Normalize::new(&[0.5, 0.25, 0.0], &[0.5, 2.0, 1.0])
        .unwrap()
        .apply(&x)
        .unwrap();
    let nv = n.to_vec::<f32>().unwrap();
    assert_eq!(nv[0], (v[0] - 0.5) / 0.5);
    assert_eq!(nv[6], (v[6] - 0.25) / 2.0);
    // CenterCrop 2 × 2 of a 5 × 5 image: (5 - 2) / 2 = 1.5 rounds to 2.
    let grid = Tensor::from_vec((0..25).map(|i| i as f32).collect(), &[1, 5, 5]).unwrap();
    let c = CenterCrop::new(2, 2).apply(&grid).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![12.0, 13.0, 17.0, 18.0]);
    let flipped = RandomHorizontalFlip::new(1.0)
        .unwrap()
        .apply(&grid)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(flipped[..5], [4.0, 3.0, 2.0, 1.0, 0.0]);
    let kept = RandomHorizontalFlip::new(0.0).unwrap().apply(&grid).unwrap();
    assert_eq!(kept.to_vec::<f32>().unwrap(), grid.to_vec::<f32>().unwrap());
    // Random crops of the zero-padded grid: each a window of it.
    oar::seed(7);
    let crop = RandomCrop::new(5, 5).padding(Pad::new(2, 2, 2, 2, PadMode::Constant(0.0)));
    let padded = Pad::new(2, 2, 2, 2, PadMode::Constant(0.0))
        .apply(&grid)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mut offsets = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let w = crop.apply(&grid).unwrap().to_vec::<f32>().unwrap();
        let found = (0..=4)
            .flat_map(|t| (0..=4).map(move |l| (t, l)))
            .find(|&(t, l)| (0..5).all(|y| (0..5).all(|x| w[y * 5 + x] == padded[(t + y) * 9 + l + x])));
        offsets.insert(found.expect("a window of the padded image"));
    }
    assert!(offsets.len() > 5, "crops at several offsets: {offsets:?}");
    // Compose: resize then center-crop then normalize.
    let pipeline = Compose(vec![
        Box::new(Resize::new(4, 4).unwrap()),
        Box::new(CenterCrop::new(2, 2)),
        Box::new(Normalize::new(&[1.0], &[2.0]).unwrap()),
    ]);
    let direct = Normalize::new(&[1.0], &[2.0])
        .unwrap()
        .apply(
            &CenterCrop::new(2, 2)
                .apply(&Resize::new(4, 4).unwrap().apply(&grid).unwrap())
                .unwrap(),
        )
        .unwrap();
    assert_eq!(
        pipeline.apply(&grid).unwrap().to_vec::<f32>().unwrap(),
        direct.to_vec::<f32>().unwrap()
    );
    // Typed errors naming the transform.
    let e = |r: oar::Result<Tensor>| r.unwrap_err().to_string();
    assert!(e(CenterCrop::new(6, 2).apply(&grid)).contains("CenterCrop"));
    assert!(e(ToTensor.apply(&grid)).contains("u8"));
    assert!(
        e(Resize::new(2, 2)
            .unwrap()
            .apply(&Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap()))
        .contains("[C, H, W]")
    );
    assert!(e(Normalize::new(&[0.0, 0.0], &[1.0, 1.0]).unwrap().apply(&grid)).contains("channels"));
    assert!(
        Normalize::new(&[0.0], &[0.0]).is_err()
            && Resize::new(0, 3).is_err()
            && RandomHorizontalFlip::new(1.5).is_err()
    );
}

fn image_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/images")).join(name)
}

/// PNG and JPEG files written by Pillow (`tools/gen_image_fixtures.py`) decode to the pixels
/// Pillow has: PNG exactly (gray, RGB, RGBA), JPEG within 2 levels (decoders round their
/// inverse transforms differently); then `ToTensor` takes them. Truncated, foreign and
/// oversized files are errors naming the file (the oversized one before any pixel memory).
#[test]
fn images_decode_as_pillow_reads_them() {
    use oar::vision::image::{decode_image, read_image};
    let px: Value = serde_json::from_str(&std::fs::read_to_string(image_fixture("pixels.json")).unwrap()).unwrap();
    let ints = |k: &str| -> Vec<u8> {
        px[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u8)
            .collect()
    };
    for (file, key, c) in [("rgb.png", "rgb", 3), ("gray.png", "gray", 1), ("rgba.png", "rgba", 4)] {
        let t = read_image(image_fixture(file)).unwrap();
        assert_eq!(t.shape(), vec![7, 9, c], "{file}");
        assert_eq!(t.to_vec::<u8>().unwrap(), ints(key), "{file}");
    }
    let jpeg = read_image(image_fixture("rgb.jpg")).unwrap();
    assert_eq!(jpeg.shape(), vec![7, 9, 3]);
    let worst = jpeg
        .to_vec::<u8>()
        .unwrap()
        .iter()
        .zip(ints("jpeg_rgb"))
        .map(|(a, b)| (*a as i32 - b as i32).abs())
        .max()
        .unwrap();
    assert!(worst <= 2, "JPEG pixels differ from Pillow's by {worst}");
    assert_eq!(ToTensor.apply(&jpeg).unwrap().shape(), vec![3, 7, 9]);

    let png = std::fs::read(image_fixture("rgb.png")).unwrap();
    let e = decode_image(&png[..png.len() / 2], "half.png").unwrap_err().to_string();
    assert!(e.contains("half.png"), "{e}");
    let e = decode_image(b"plain text, not an image", "notes.txt")
        .unwrap_err()
        .to_string();
    assert!(e.contains("notes.txt") && e.contains("PNG or JPEG"), "{e}");
    // A PNG whose header claims 100000 × 100000 pixels (40 GB of RGBA).
    let mut big = png[..8].to_vec();
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend(100_000u32.to_be_bytes());
    ihdr.extend(100_000u32.to_be_bytes());
    ihdr.extend([8, 6, 0, 0, 0]);
    big.extend(13u32.to_be_bytes());
    big.extend(&ihdr);
    big.extend(crc32(&ihdr).to_be_bytes());
    let e = decode_image(&big, "huge.png").unwrap_err().to_string();
    assert!(e.contains("huge.png"), "{e}");
    let e = read_image(image_fixture("missing.png")).unwrap_err().to_string();
    assert!(e.contains("missing.png"), "{e}");
}

/// CRC-32 (IEEE), as PNG chunks carry.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}
