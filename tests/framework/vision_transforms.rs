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
