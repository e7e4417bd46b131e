#!/usr/bin/env python3
"""Fixtures for `oar::metric` (tests/framework/metric.rs), computed by scikit-learn.

Writes tests/fixtures/metrics/metrics.json: seeded multi-class scores with top-1/top-3 accuracy
(`top_k_accuracy_score`), binary probabilities with precision and recall at 0.5
(`precision_score`, `recall_score` of `p >= 0.5`, Paddle's rounding) and ROC AUC
(`roc_auc_score`, plus Paddle's 4095-bin streaming estimate computed here), and segmentation
labels with the mean and per-class IoU (`jaccard_score`). Needs numpy and scikit-learn
(`pip install scikit-learn`); CI only reads the committed JSON.

    python3 tools/gen_metric_fixtures.py
"""
import json
import os

import numpy as np
from sklearn.metrics import jaccard_score, precision_score, recall_score, roc_auc_score, top_k_accuracy_score

rng = np.random.default_rng(20261206)

# Multi-class: 97 samples, 7 classes.
scores = rng.normal(size=(97, 7)).astype(np.float32)
labels = rng.integers(0, 7, size=97)
# Make the scores informative so the accuracies are not near chance.
scores[np.arange(97), labels] += rng.uniform(0.0, 1.5, size=97).astype(np.float32)
acc = {k: float(top_k_accuracy_score(labels, scores, k=k, labels=list(range(7)))) for k in (1, 3)}

# Binary: 150 probabilities.
y = rng.integers(0, 2, size=150)
p = np.clip(rng.uniform(size=150) * 0.7 + y * 0.3, 0.0, 1.0).astype(np.float32)
p[:3] = [0.5, 0.49999997, 1.0]  # the threshold itself, just below it, the top bin
hard = (p >= 0.5).astype(np.int64)
precision = float(precision_score(y, hard))
recall = float(recall_score(y, hard))
auc_exact = float(roc_auc_score(y, p))


def binned_auc(y, p, num_thresholds):
    """Paddle's `Auc.accumulate`: counts per bin `int(p * num_thresholds)`, trapezoids."""
    pos = np.zeros(num_thresholds + 1)
    neg = np.zeros(num_thresholds + 1)
    for yi, pi in zip(y, p.astype(np.float64)):
        b = int(pi * num_thresholds)
        (pos if yi == 1 else neg)[b] += 1
    tot_pos = tot_neg = auc = 0.0
    for b in range(num_thresholds, -1, -1):
        prev_pos, prev_neg = tot_pos, tot_neg
        tot_pos += pos[b]
        tot_neg += neg[b]
        auc += (tot_neg - prev_neg) * (tot_pos + prev_pos) / 2.0
    return auc / (tot_pos * tot_neg) if tot_pos > 0 and tot_neg > 0 else 0.0


auc_4095 = binned_auc(y, p, 4095)

# Segmentation: labels [2, 9, 11] over 5 classes (class 4 never predicted, class 3 rare).
truth = rng.integers(0, 4, size=(2, 9, 11))
truth[0, 0, :3] = 4
pred = np.where(rng.uniform(size=truth.shape) < 0.6, truth, rng.integers(0, 4, size=truth.shape))
pred[pred == 4] = 0
miou = float(jaccard_score(truth.ravel(), pred.ravel(), average="macro"))
per_class = [float(v) for v in jaccard_score(truth.ravel(), pred.ravel(), average=None, labels=list(range(5)))]

out = {
    "multiclass": {"scores": scores.tolist(), "labels": labels.tolist(), "top1": acc[1], "top3": acc[3]},
    "binary": {
        "probs": p.tolist(),
        "labels": y.tolist(),
        "precision": precision,
        "recall": recall,
        "auc_exact": auc_exact,
        "auc_4095": auc_4095,
    },
    "segmentation": {
        "shape": list(truth.shape),
        "truth": truth.ravel().tolist(),
        "pred": pred.ravel().tolist(),
        "classes": 5,
        "mean_iou": miou,
        "per_class_iou": per_class,
    },
}
path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "metrics", "metrics.json")
with open(path, "w") as f:
    json.dump(out, f)
print(f"wrote {os.path.normpath(path)}: top1 {acc[1]:.4f} top3 {acc[3]:.4f} precision {precision:.4f} "
      f"recall {recall:.4f} auc {auc_exact:.4f} (binned {auc_4095:.4f}) mIoU {miou:.4f}")
