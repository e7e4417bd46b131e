"""oar, ONNX Runtime and PyTorch timed in one process, in alternating blocks.

The machines here are shared: their speed drifts by tens of percent within seconds, so two
programs timed one after the other disagree by more than the differences being measured. This
driver loads oar's compiled model (a shared library from `oar compile --emit so`, through its C
API) beside an ONNX Runtime session and the PyTorch module, and times them in rounds: in each
round a block of runs of each (every order in turn), a pause between blocks so the previous
engine's spinning threads park, the median of each block, and the ratio of the medians. The
ratios reported are the medians over rounds, with every round's ratio beside them. The pause
is 0.1 s (OAR_BENCH_PAUSE, seconds): after 20 ms ONNX Runtime's pool threads were still
spinning, and a two-thread oar block that followed one of its blocks ran up to 2x slower
(every round where oar came right after ORT; measured on MobileNetV2, 2026-12-07).

Usage: cpu_models_paired.py DIR NAME LIB [ROUNDS [BLOCK]]: DIR holds NAME.onnx, NAME.input_K.npy
and NAME.output_0.npy (tools/export_torch_models.py); LIB is the compiled library. Threads:
OAR_BENCH_THREADS (default 2) for all three. Prints one line:
`name oar_ms ort_ms torch_ms ort/oar torch/oar max_rel_err_vs_ort per-round-ort/oar...`.
OAR_BENCH_VERBOSE=1 also prints every round's block medians per engine (stderr);
OAR_BENCH_NO_TORCH=1 leaves PyTorch out (its column then reads 0).
"""
import ctypes
import itertools
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import export_torch_models as exp  # noqa: E402

DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.int32): 6, np.dtype(np.int64): 7}


class Tensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("data", ctypes.c_void_p),
        ("byte_size", ctypes.c_size_t),
    ]


class OarModel:
    """A model compiled by `oar compile --emit so`, run through its C API."""

    def __init__(self, lib, inputs, threads):
        self.lib = ctypes.CDLL(os.path.abspath(lib))
        self.lib.oar_model_create.restype = ctypes.c_void_p
        self.lib.oar_model_create.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
        self.lib.oar_model_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(Tensor), ctypes.c_size_t,
                                           ctypes.POINTER(Tensor), ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_char_p)]
        self.lib.oar_model_output_info.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(Tensor)]
        self.lib.oar_model_num_outputs.argtypes = [ctypes.c_void_p]
        self.lib.oar_model_set_threads.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        err = ctypes.c_char_p()
        self.m = self.lib.oar_model_create(None, ctypes.byref(err))
        if not self.m:
            raise RuntimeError(f"oar_model_create: {err.value}")
        self.lib.oar_model_set_threads(self.m, threads)
        self.keep = [np.ascontiguousarray(x) for x in inputs]
        self.shapes = [(ctypes.c_int64 * x.ndim)(*x.shape) for x in self.keep]
        self.ins = (Tensor * len(self.keep))()
        for i, x in enumerate(self.keep):
            self.ins[i] = Tensor(None, DTYPES[x.dtype], x.ndim, self.shapes[i], x.ctypes.data, x.nbytes)
        n = self.lib.oar_model_num_outputs(self.m)
        self.outs = (Tensor * n)()
        self.out_arrays = []
        for i in range(n):
            info = Tensor()
            self.lib.oar_model_output_info(self.m, i, ctypes.byref(info))
            shape = [info.shape[k] for k in range(info.rank)]
            a = np.empty(shape, dtype=np.float32 if info.dtype == 0 else np.float64)
            self.out_arrays.append(a)
            self.outs[i] = Tensor(None, 0, 0, None, a.ctypes.data, a.nbytes)

    def run(self):
        err = ctypes.c_char_p()
        if self.lib.oar_model_run(self.m, self.ins, len(self.keep), self.outs, len(self.out_arrays),
                                  ctypes.byref(err)) != 0:
            raise RuntimeError(f"oar_model_run: {err.value}")
        return self.out_arrays


def block_ms(f, runs):
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        f()
        t.append((time.perf_counter() - s) * 1e3)
    return statistics.median(t)


def main():
    d, name, lib = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 12
    block = int(sys.argv[5]) if len(sys.argv) > 5 else 5
    threads = int(os.environ.get("OAR_BENCH_THREADS", "2"))
    torch.set_num_threads(threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(os.path.join(d, f"{name}.onnx"), so, providers=["CPUExecutionProvider"])
    inputs = [np.load(os.path.join(d, f"{name}.input_{k}.npy")) for k in range(len(sess.get_inputs()))]
    feeds = {i.name: x for i, x in zip(sess.get_inputs(), inputs)}
    module, _ = exp.build(name, "full")
    module.eval()
    tin = [torch.from_numpy(x) for x in inputs]
    oar = OarModel(lib, inputs, threads)

    def run_torch():
        with torch.inference_mode():
            module(*tin)

    engines = [("oar", oar.run), ("ort", lambda: sess.run(None, feeds)), ("torch", run_torch)]
    if os.environ.get("OAR_BENCH_NO_TORCH"):
        engines = engines[:2] + [("torch", lambda: None)]
    for _, f in engines:  # warm-up
        for _ in range(3):
            f()
    got = oar.run()[0]
    want = sess.run(None, feeds)[0]
    err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-6))
    per = {e: [] for e, _ in engines}
    # Every order of the three in turn, so each engine follows each other one equally often (what
    # ran just before shows: an engine right after another's block runs up to 1.5x slower).
    orders = list(itertools.permutations(engines))
    for r in range(rounds):
        for e, f in orders[r % len(orders)]:
            time.sleep(float(os.environ.get("OAR_BENCH_PAUSE", "0.1")))
            per[e].append(block_ms(f, block))
    if os.environ.get("OAR_BENCH_VERBOSE"):
        for e in per:
            print(e, " ".join(f"{x:.2f}" for x in per[e]), file=sys.stderr)
    ratio = lambda a: [x / o for x, o in zip(per[a], per["oar"])]
    med = {e: statistics.median(v) for e, v in per.items()}
    print(f"{name} {med['oar']:.4f} {med['ort']:.4f} {med['torch']:.4f} {statistics.median(ratio('ort')):.4f} "
          f"{statistics.median(ratio('torch')):.4f} {err:.2e} " + " ".join(f"{x:.2f}" for x in ratio("ort")),
          flush=True)


if __name__ == "__main__":
    main()
