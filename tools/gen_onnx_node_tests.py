#!/usr/bin/env python3
"""Write ONNX's backend node tests (model.onnx + test_data_set_*/{input,output}_*.pb) to a cache dir.

Usage: tools/gen_onnx_node_tests.py [OUT_DIR]   (default target/onnx-node-tests)

Each case is copied to OUT_DIR/cases/<name>/ and listed in OUT_DIR/manifest.txt, one name a line.
Needs the `onnx` pip package (tools/onnx_requirements.txt). Idempotent: existing cases are kept.
"""
import os
import shutil
import sys
import warnings

import numpy as np
from onnx import numpy_helper

from onnx.backend.test.loader import load_model_tests


def main() -> None:
    warnings.simplefilter("ignore")
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join("target", "onnx-node-tests")
    cases_dir = os.path.join(out, "cases")
    os.makedirs(cases_dir, exist_ok=True)
    names = []
    skipped = 0
    for case in load_model_tests(kind="node"):
        dst = os.path.join(cases_dir, case.name)
        if os.path.isfile(os.path.join(dst, "model.onnx")):
            names.append(case.name)
            continue
        if case.model_dir is not None and os.path.isfile(os.path.join(case.model_dir, "model.onnx")):
            shutil.copytree(case.model_dir, dst)
            names.append(case.name)
            continue
        # This onnx wheel builds the node tests in memory: serialize them like the source tree does.
        # numpy scalars (a CumSum axis, a OneHot depth) are 0-d tensors too.
        arrays = [np.asarray(a) if isinstance(a, np.generic) else a for ds in case.data_sets for part in ds for a in part]
        if case.model is None or not all(isinstance(a, np.ndarray) and a.dtype != object for a in arrays):
            skipped += 1  # sequences, optionals, strings: not tensors oar can read
            continue
        os.makedirs(dst, exist_ok=True)
        with open(os.path.join(dst, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        graph = case.model.graph
        inits = {i.name for i in graph.initializer}
        in_names = [i.name for i in graph.input if i.name not in inits]
        out_names = [o.name for o in graph.output]
        for k, (ins, outs) in enumerate(case.data_sets):
            d = os.path.join(dst, f"test_data_set_{k}")
            os.makedirs(d, exist_ok=True)
            for kind, vals, nm in (("input", ins, in_names), ("output", outs, out_names)):
                for i, a in enumerate(vals):
                    t = numpy_helper.from_array(np.asarray(a), nm[i] if i < len(nm) else f"{kind}_{i}")
                    with open(os.path.join(d, f"{kind}_{i}.pb"), "wb") as f:
                        f.write(t.SerializeToString())
        with open(os.path.join(dst, "tolerance.txt"), "w") as f:
            f.write(f"{case.rtol} {case.atol}\n")
        names.append(case.name)
    import onnx

    with open(os.path.join(out, "manifest.txt"), "w") as f:
        f.write(f"# onnx {onnx.__version__}, {len(names)} node tests\n")
        for n in sorted(names):
            f.write(n + "\n")
    print(f"wrote {len(names)} ONNX node tests to {out} ({skipped} skipped: not plain tensors)")


if __name__ == "__main__":
    main()
