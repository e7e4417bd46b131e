#!/usr/bin/env python3
"""Run an ONNX model with onnxruntime (CPU execution provider) on .npy inputs.

    python3 tools/ort_run.py MODEL.onnx OUT_DIR [--check] NAME=INPUT.npy ...
    python3 tools/ort_run.py --batch CASES.jsonl [--check]

Writes OUT_DIR/output_<i>.npy for the model's i-th output and prints one line per output:
`<i> <name> <dtype> <shape>`. With --check, the model first goes through onnx.checker (full
check, with shape inference) so an exporter bug shows as a checker error, not an ORT one.

--batch runs many models in one process (the export tests run hundreds; starting Python and
onnxruntime once per model cost most of their time): each line of CASES.jsonl is
`{"model": M, "out": DIR, "inputs": {NAME: NPY, ...}}`; a case that fails writes its error to
DIR/error.txt instead of outputs, and the others still run.

Exit status: 0 on success, 2 when onnxruntime (or onnx, for --check) is not installed (the
message says how to install it), 1 on any other error.
"""

import os
import sys


def main(argv):
    args = [a for a in argv if a != "--check"]
    check = len(args) != len(argv)
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 1
    if args[0] == "--batch":
        return batch(args[1], check)
    model, out_dir, pairs = args[0], args[1], args[2:]
    feeds = {}
    for p in pairs:
        name, sep, path = p.partition("=")
        if not sep:
            print(f"ort_run.py: input `{p}` is not NAME=FILE.npy", file=sys.stderr)
            return 1
        feeds[name] = path
    missing = imports(check)
    if missing:
        return missing
    for i, name, dtype, shape in run(model, out_dir, feeds, check):
        print(i, name, dtype, shape)
    return 0


def imports(check):
    """0 when onnxruntime (and onnx, for --check) import; else 2, with a message."""
    try:
        import numpy  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        print(
            f"ort_run.py: {e}; install it with `pip install onnxruntime` (scripts/test.sh does)",
            file=sys.stderr,
        )
        return 2
    if check:
        try:
            import onnx  # noqa: F401
        except ImportError as e:
            print(f"ort_run.py: {e}; install it with `pip install -r tools/onnx_requirements.txt`", file=sys.stderr)
            return 2
    return 0


def run(model, out_dir, feeds, check):
    """Run `model` on the .npy files `feeds` (name -> path); write and describe its outputs."""
    import numpy as np
    import onnxruntime as ort

    if check:
        import onnx

        onnx.checker.check_model(onnx.load(model), full_check=True)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, {k: np.load(v) for k, v in feeds.items()})
    os.makedirs(out_dir, exist_ok=True)
    described = []
    for i, (name, v) in enumerate(zip(names, outs)):
        v = np.asarray(v)
        np.save(os.path.join(out_dir, f"output_{i}.npy"), v)
        described.append((i, name, v.dtype, list(v.shape)))
    return described


def batch(cases, check):
    import json

    missing = imports(check)
    if missing:
        return missing
    with open(cases) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    for c in lines:
        try:
            described = run(c["model"], c["out"], c["inputs"], check)
            with open(os.path.join(c["out"], "outputs.txt"), "w") as f:
                f.write(f"{len(described)}\n")
        except Exception as e:  # reported per case; the others still run
            os.makedirs(c["out"], exist_ok=True)
            with open(os.path.join(c["out"], "error.txt"), "w") as f:
                f.write(f"{type(e).__name__}: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
