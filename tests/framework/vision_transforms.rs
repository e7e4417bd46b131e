//! `oar::vision::transforms` against onnxruntime's `Resize` and numpy's `pad`
//! (`tests/fixtures/transforms/transforms.json`, written by `tools/gen_transform_fixtures.py`),
//! and hand-computed values for the rest; bad input is a typed error naming the transform.

use oar::Tensor;
use oar::vision::transforms::{
    CenterCrop, ColorAdjust, ColorJitter, Compose, Normalize, Pad, PadMode, RandomCrop, RandomHorizontalFlip,
    RandomResizedCrop, Resize, ToTensor, Transform,
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

/// Brightness, contrast, saturation and hue adjustments match torchvision's tensor functions
/// (`tests/fixtures/transforms/color.json`, `tools/gen_color_fixtures.py`) within 1e-5, on an
/// RGB image with gray and primary pixels and on a gray one.
#[test]
fn color_adjustments_match_torchvision() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/transforms/color.json");
    let f: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = f["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 10);
    for case in cases {
        let factor = case["factor"].as_f64().unwrap() as f32;
        let adjust = match case["adjust"].as_str().unwrap() {
            "brightness" => ColorAdjust::Brightness(factor),
            "contrast" => ColorAdjust::Contrast(factor),
            "saturation" => ColorAdjust::Saturation(factor),
            "hue" => ColorAdjust::Hue(factor),
            other => panic!("unknown adjustment {other}"),
        };
        let img = tensor(&f[case["image"].as_str().unwrap()]);
        let out = adjust.apply(&img).unwrap();
        assert_close(&out, &case["out"], 1e-5, &format!("{adjust:?} on {}", case["image"]));
    }
}

/// ColorJitter: each adjustment alone stays within its factor range (brightness 0.5 scales
/// every value by one factor in [0.5, 1.5]), the draws follow `oar::seed`, gray images pass
/// saturation and hue unchanged, and bad amounts are errors.
#[test]
fn color_jitter_draws_factors_in_range() {
    let img = Tensor::from_vec((1..=12).map(|i| i as f32 / 20.0).collect(), &[3, 2, 2]).unwrap();
    let v = img.to_vec::<f32>().unwrap();
    let jitter = ColorJitter::new(0.5, 0.0, 0.0, 0.0).unwrap();
    let mut seen = Vec::new();
    for _ in 0..20 {
        let out = jitter.apply(&img).unwrap().to_vec::<f32>().unwrap();
        let k = out[0] / v[0];
        assert!((0.5..=1.5).contains(&k), "factor {k}");
        for (a, b) in out.iter().zip(&v) {
            assert!((a - (b * k).min(1.0)).abs() < 1e-6, "one factor for every value");
        }
        seen.push(k);
    }
    assert!(
        seen.iter().any(|&k| k < 0.9) && seen.iter().any(|&k| k > 1.1),
        "{seen:?}"
    );
    let all = ColorJitter::new(0.4, 0.4, 0.4, 0.1).unwrap();
    oar::seed(3);
    let a = all.apply(&img).unwrap().to_vec::<f32>().unwrap();
    oar::seed(3);
    assert_eq!(all.apply(&img).unwrap().to_vec::<f32>().unwrap(), a);
    let gray = Tensor::from_vec(vec![0.2f32, 0.4, 0.6, 0.8], &[1, 2, 2]).unwrap();
    let same = ColorJitter::new(0.0, 0.0, 0.9, 0.4).unwrap().apply(&gray).unwrap();
    assert_eq!(same.to_vec::<f32>().unwrap(), gray.to_vec::<f32>().unwrap());
    assert!(ColorJitter::new(-0.1, 0.0, 0.0, 0.0).is_err() && ColorJitter::new(0.0, 0.0, 0.0, 0.6).is_err());
    let two = Tensor::from_vec(vec![0.5f32; 8], &[2, 2, 2]).unwrap();
    let e = ColorJitter::new(0.0, 0.0, 0.5, 0.0)
        .unwrap()
        .apply(&two)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ColorJitter") && e.contains("2 channels"), "{e}");
}

/// RandomResizedCrop: with scale and ratio pinned to 1 it is a plain Resize; otherwise every
/// output is a bilinear resize of some window of the image (found by search) whose area and
/// ratio are in range; windows vary; the fallback for an extreme ratio range is the central
/// window; bad arguments are errors.
#[test]
fn random_resized_crop_takes_windows_in_range() {
    let grid = Tensor::from_vec((0..48).map(|i| i as f32).collect(), &[1, 6, 8]).unwrap();
    let whole = RandomResizedCrop::new(3, 4)
        .unwrap()
        .scale(1.0, 1.0)
        .unwrap()
        .ratio(8.0 / 6.0, 8.0 / 6.0)
        .unwrap();
    let resized = Resize::new(3, 4)
        .unwrap()
        .apply(&grid)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(whole.apply(&grid).unwrap().to_vec::<f32>().unwrap(), resized);
    oar::seed(11);
    let rrc = RandomResizedCrop::new(4, 4).unwrap().scale(0.2, 0.8).unwrap();
    let mut windows = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let out = rrc.apply(&grid).unwrap().to_vec::<f32>().unwrap();
        let found = (1..=6)
            .flat_map(|h| (1..=8).map(move |w| (h, w)))
            .flat_map(|(h, w)| (0..=6 - h).flat_map(move |t| (0..=8 - w).map(move |l| (t, l, h, w))))
            .find(|&(t, l, h, w)| {
                let rows = grid.slice(1, t as i64, (t + h) as i64, 1).unwrap();
                let win = rows.slice(2, l as i64, (l + w) as i64, 1).unwrap();
                let r = Resize::new(4, 4).unwrap().apply(&win).unwrap().to_vec::<f32>().unwrap();
                r.iter().zip(&out).all(|(a, b)| (a - b).abs() < 1e-5)
            });
        let (t, l, h, w) = found.expect("a resized window of the image");
        let area = (h * w) as f64 / 48.0;
        let ratio = w as f64 / h as f64;
        // Rounding a side to whole pixels moves area and ratio a little past the drawn values.
        assert!(
            (0.1..=0.95).contains(&area) && (0.5..=2.0).contains(&ratio),
            "{h} x {w}"
        );
        windows.insert((t, l, h, w));
    }
    assert!(windows.len() > 5, "{windows:?}");
    // No window of ratio 20 or more fits a 6 × 8 image (at 8% of its area it would be 8.8
    // wide, 0.4 high): the central full-width row, top (6 - 1) / 2 = 2.
    let fallback = RandomResizedCrop::new(1, 8).unwrap().ratio(20.0, 30.0).unwrap();
    let out = fallback.apply(&grid).unwrap().to_vec::<f32>().unwrap();
    let central = Resize::new(1, 8)
        .unwrap()
        .apply(&grid.slice(1, 2, 3, 1).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(out, central);
    assert!(RandomResizedCrop::new(0, 4).is_err());
    assert!(RandomResizedCrop::new(4, 4).unwrap().scale(0.9, 0.1).is_err());
    assert!(RandomResizedCrop::new(4, 4).unwrap().ratio(0.0, 1.0).is_err());
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
