#!/usr/bin/env python3
"""Run an ONNX model with onnxruntime (CPU execution provider) on .npy inputs.

    python3 tools/ort_run.py MODEL.onnx OUT_DIR [--check] NAME=INPUT.npy ...

Writes OUT_DIR/output_<i>.npy for the model's i-th output and prints one line per output:
`<i> <name> <dtype> <shape>`. With --check, the model first goes through onnx.checker (full
check, with shape inference) so an exporter bug shows as a checker error, not an ORT one.

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
    model, out_dir, pairs = args[0], args[1], args[2:]
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as e:
        print(
            f"ort_run.py: {e}; install it with `pip install onnxruntime` (scripts/test.sh does)",
            file=sys.stderr,
        )
        return 2
    if check:
        try:
            import onnx
        except ImportError as e:
            print(f"ort_run.py: {e}; install it with `pip install -r tools/onnx_requirements.txt`", file=sys.stderr)
            return 2
        onnx.checker.check_model(onnx.load(model), full_check=True)
    feeds = {}
    for p in pairs:
        name, sep, path = p.partition("=")
        if not sep:
            print(f"ort_run.py: input `{p}` is not NAME=FILE.npy", file=sys.stderr)
            return 1
        feeds[name] = np.load(path)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, feeds)
    os.makedirs(out_dir, exist_ok=True)
    for i, (name, v) in enumerate(zip(names, outs)):
        v = np.asarray(v)
        np.save(os.path.join(out_dir, f"output_{i}.npy"), v)
        print(i, name, v.dtype, list(v.shape))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
