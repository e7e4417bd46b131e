//! `oar::metric` against scikit-learn (`tests/fixtures/metrics/metrics.json`, written by
//! `tools/gen_metric_fixtures.py`), fed in uneven batches: accumulated values equal the
//! whole-set values (counting metrics exactly up to f64 division, AUC within the stated
//! tolerances), each batch's own value is that batch's, reset forgets, bad input is a typed
//! error naming the metric.

use oar::Tensor;
use oar::metric::{Accuracy, Auc, MeanIou, Metric, Precision, Recall};
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/metrics/metrics.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Numbers of a (nested) JSON array, flattened in row-major order.
fn floats(v: &Value) -> Vec<f32> {
    match v {
        Value::Array(a) => a.iter().flat_map(floats).collect(),
        x => vec![x.as_f64().unwrap() as f32],
    }
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

/// Rows `lo..hi` of a row-major `[n, cols]` tensor's data.
fn rows<T: Copy>(v: &[T], cols: usize, lo: usize, hi: usize) -> Vec<T> {
    v[lo * cols..hi * cols].to_vec()
}

/// Uneven batch boundaries over `n` samples.
fn batches(n: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut lo = 0;
    for size in [40, 1, 23].iter().cycle() {
        if lo >= n {
            break;
        }
        let hi = (lo + size).min(n);
        out.push((lo, hi));
        lo = hi;
    }
    out
}

fn assert_close(got: f64, want: f64, tol: f64, what: &str) {
    assert!((got - want).abs() <= tol, "{what}: {got} vs scikit-learn {want}");
}

#[test]
fn accuracy_top_k_matches_scikit_learn() {
    let f = &fixture()["multiclass"];
    let (scores, labels) = (floats(&f["scores"]), ints(&f["labels"]));
    let (n, c) = (labels.len(), scores.len() / labels.len());
    let mut acc = Accuracy::topk(&[1, 3]).unwrap();
    assert_eq!(acc.names(), vec!["acc_top1", "acc_top3"]);
    for (lo, hi) in batches(n) {
        let p = Tensor::from_vec(rows(&scores, c, lo, hi), &[hi - lo, c]).unwrap();
        // Labels as [b, 1] i64 in one batch in three, [b] i32 otherwise.
        let l = if lo % 3 == 0 {
            Tensor::from_vec(labels[lo..hi].to_vec(), &[hi - lo, 1]).unwrap()
        } else {
            Tensor::from_vec(labels[lo..hi].iter().map(|&v| v as i32).collect::<Vec<_>>(), &[hi - lo]).unwrap()
        };
        let batch = acc.update(&p, &l).unwrap();
        let mut alone = Accuracy::topk(&[1, 3]).unwrap();
        assert_eq!(batch, alone.update(&p, &l).unwrap());
    }
    let got = acc.accumulate();
    assert_close(got[0], f["top1"].as_f64().unwrap(), 1e-12, "top-1");
    assert_close(got[1], f["top3"].as_f64().unwrap(), 1e-12, "top-3");
    acc.reset();
    assert_eq!(acc.accumulate(), vec![0.0, 0.0]);
    // Ties rank the lower class first.
    let mut one = Accuracy::new();
    let p = Tensor::from_vec(vec![0.5f32, 0.5, 0.5, 0.5], &[2, 2]).unwrap();
    assert_eq!(
        one.update(&p, &Tensor::from_vec(vec![0i64, 1], &[2]).unwrap()).unwrap(),
        vec![0.5]
    );
}

#[test]
fn precision_recall_and_auc_match_scikit_learn() {
    let f = &fixture()["binary"];
    let (probs, labels) = (floats(&f["probs"]), ints(&f["labels"]));
    let n = labels.len();
    let mut precision = Precision::new();
    let mut recall = Recall::new();
    let mut auc = Auc::new();
    let mut fine = Auc::with_thresholds(1 << 24).unwrap();
    for (lo, hi) in batches(n) {
        let p = Tensor::from_vec(probs[lo..hi].to_vec(), &[hi - lo]).unwrap();
        // [b, 2] class probabilities for the AUCs (column 1 is the positive class).
        let two: Vec<f32> = probs[lo..hi].iter().flat_map(|&q| [1.0 - q, q]).collect();
        let p2 = Tensor::from_vec(two, &[hi - lo, 2]).unwrap();
        let l = Tensor::from_vec(labels[lo..hi].to_vec(), &[hi - lo, 1]).unwrap();
        precision.update(&p, &l).unwrap();
        recall.update(&p, &l).unwrap();
        auc.update(&p2, &l).unwrap();
        fine.update(&p, &l).unwrap();
    }
    assert_close(
        precision.accumulate()[0],
        f["precision"].as_f64().unwrap(),
        1e-12,
        "precision",
    );
    assert_close(recall.accumulate()[0], f["recall"].as_f64().unwrap(), 1e-12, "recall");
    // Paddle's 4095-bin estimate, as the fixture script computes it, and scikit-learn's exact
    // AUC: 2^24 bins separate every pair of these probabilities.
    assert_close(
        auc.accumulate()[0],
        f["auc_4095"].as_f64().unwrap(),
        1e-12,
        "4095-bin AUC",
    );
    assert_close(
        auc.accumulate()[0],
        f["auc_exact"].as_f64().unwrap(),
        2e-3,
        "4095-bin AUC vs exact",
    );
    assert_close(fine.accumulate()[0], f["auc_exact"].as_f64().unwrap(), 1e-9, "fine AUC");
}

#[test]
fn mean_iou_matches_scikit_learn_from_labels_and_from_scores() {
    let f = &fixture()["segmentation"];
    let shape: Vec<usize> = ints(&f["shape"]).iter().map(|&v| v as usize).collect();
    let (truth, pred) = (ints(&f["truth"]), ints(&f["pred"]));
    let classes = f["classes"].as_u64().unwrap() as usize;
    let want = f["mean_iou"].as_f64().unwrap();
    let per_class: Vec<f64> = f["per_class_iou"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let plane: usize = shape[1..].iter().product();
    // Labels, one image per batch.
    let mut m = MeanIou::new(classes).unwrap();
    for img in 0..shape[0] {
        let t = Tensor::from_vec(rows(&truth, plane, img, img + 1), &[1, shape[1], shape[2]]).unwrap();
        let p = Tensor::from_vec(rows(&pred, plane, img, img + 1), &[1, shape[1], shape[2]]).unwrap();
        m.update(&p, &t).unwrap();
    }
    assert_close(m.accumulate()[0], want, 1e-12, "mean IoU");
    for (k, (got, want)) in m.per_class().iter().zip(&per_class).enumerate() {
        assert_close(got.unwrap(), *want, 1e-12, &format!("IoU of class {k}"));
    }
    // Scores [N, C, H, W] whose argmax is the predicted label.
    let mut scores = vec![0f32; shape[0] * classes * plane];
    for (i, &p) in pred.iter().enumerate() {
        let (img, at) = (i / plane, i % plane);
        for k in 0..classes {
            scores[(img * classes + k) * plane + at] = if k as i64 == p { 2.0 } else { -(k as f32) };
        }
    }
    let mut m = MeanIou::new(classes).unwrap();
    let s = Tensor::from_vec(scores, &[shape[0], classes, shape[1], shape[2]]).unwrap();
    let t = Tensor::from_vec(truth.clone(), &shape).unwrap();
    m.update(&s, &t).unwrap();
    assert_close(m.accumulate()[0], want, 1e-12, "mean IoU from scores");
}

#[test]
fn bad_metric_input_is_a_typed_error_naming_the_metric() {
    let msg = |r: oar::Result<Vec<f64>>| r.unwrap_err().to_string();
    let p = Tensor::from_vec(vec![0.2f32, 0.8, 0.6, 0.4], &[2, 2]).unwrap();
    let e = msg(Accuracy::topk(&[3])
        .unwrap()
        .update(&p, &Tensor::from_vec(vec![0i64, 1], &[2]).unwrap()));
    assert!(e.contains("Accuracy") && e.contains("top-3 of 2"), "{e}");
    let e = msg(Accuracy::new().update(&p, &Tensor::from_vec(vec![0i64, 2], &[2]).unwrap()));
    assert!(e.contains("label 2"), "{e}");
    let e = msg(Accuracy::new().update(&p, &Tensor::from_vec(vec![0i64, 1, 1], &[3]).unwrap()));
    assert!(e.contains("labels of shape [3]"), "{e}");
    let e = msg(Precision::new().update(&p, &Tensor::from_vec(vec![0i64, 3], &[2]).unwrap()));
    assert!(e.contains("Precision") && e.contains("label 3"), "{e}");
    let e = msg(Auc::new().update(
        &Tensor::from_vec(vec![1.5f32], &[1]).unwrap(),
        &Tensor::from_vec(vec![1i64], &[1]).unwrap(),
    ));
    assert!(e.contains("Auc") && e.contains("1.5"), "{e}");
    let e = msg(MeanIou::new(2).unwrap().update(
        &Tensor::from_vec(vec![0i64, 1, 2], &[3]).unwrap(),
        &Tensor::from_vec(vec![0i64, 1, 1], &[3]).unwrap(),
    ));
    assert!(e.contains("MeanIou") && e.contains("prediction 2"), "{e}");
    assert!(Accuracy::topk(&[0]).is_err() && Auc::with_thresholds(0).is_err() && MeanIou::new(0).is_err());
}
