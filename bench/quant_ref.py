"""onnxruntime's side of bench/quant.sh.

`quant_ref.py DIR quantize`: onnxruntime.quantization's `quantize_static` on the float models
bench_quant exported (after `quant_pre_process`, which folds batch norms): QDQ format, u8
activations, per-channel i8 weights, min-max calibration on the same 16 images oar calibrates
on. Writes DIR/<model>.qdq.onnx.
`quant_ref.py DIR time [RUNS]`: median latency of onnxruntime on the float and the QDQ model,
batch 1; prints `model ort_f32 ms` and `model ort_int8 ms`. Threads: OAR_BENCH_THREADS.
"""
import os
import sys
import time

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

MODELS = ["resnet18", "mobilenet_v2"]


class Reader(CalibrationDataReader):
    def __init__(self, data, name):
        self.batches = iter([{name: data[i : i + 1]} for i in range(len(data))])

    def get_next(self):
        return next(self.batches, None)


def median_ms(f, runs):
    for _ in range(2):
        f()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        f()
        t.append((time.perf_counter() - s) * 1e3)
    t.sort()
    return t[runs // 2]


def main():
    d, mode = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    threads = int(os.environ.get("OAR_BENCH_THREADS", "2"))
    for name in MODELS:
        f32, pre, qdq = (os.path.join(d, f"{name}{s}.onnx") for s in ("", ".pre", ".qdq"))
        if mode == "quantize":
            quant_pre_process(f32, pre)
            calib = np.load(os.path.join(d, f"{name}.calib.npy"))
            inp = ort.InferenceSession(pre, providers=["CPUExecutionProvider"]).get_inputs()[0].name
            quantize_static(
                pre,
                qdq,
                Reader(calib, inp),
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                per_channel=True,
                calibrate_method=CalibrationMethod.MinMax,
            )
            continue
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
        for variant, path in (("ort_f32", f32), ("ort_int8", qdq)):
            s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            feed = {s.get_inputs()[0].name: x}
            print(name, variant, f"{median_ms(lambda: s.run(None, feed), runs):.3f}")


if __name__ == "__main__":
    main()
