"""Probe (GPU, under Nsight Compute): one launch of this kernel's ``default_config`` pick and one of cuDNN per
chosen row of the FA3 table, so ``ncu`` reads the hardware counters of exactly those kernels.

Everything is compiled and run once first; the profiled launches are bracketed by ``cuProfilerStart`` /
``cuProfilerStop``, so ``ncu --profile-from-start off`` skips compilation, autotuning and warm-up::

    ncu --profile-from-start off --clock-control none --set full -o OUT/fa3 \\
        python3 benchmarks/fa3_ncu_probe.py 256:4096:n,64:512:c

ROWS as in ``fa3_configs_probe.py`` (``hd:S:c|n``, bf16, B*S = 16k, H*hd = 2048). The launch order is printed,
so the report's kernels can be matched to (row, implementation).
"""
import argparse
import ctypes
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(__file__))
from fa3_configs_probe import row_inputs, set_registers  # noqa: E402
from pallas_kernels import flash_attention as fa  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("--regs", default=None, help="setmaxnreg of (consumer, producer) with 2 consumers, e.g. 232,40")
    a = ap.parse_args(argv)
    set_registers(fa, a.regs)
    if jax.devices()[0].platform != "gpu":
        sys.exit("fa3_ncu_probe.py profiles CUDA kernels and needs a GPU: nothing run")
    cuda = ctypes.CDLL("libcuda.so.1")
    print(jax.devices()[0].device_kind, jax.__version__, "command:", " ".join(["python3", *sys.argv]), flush=True)
    for row in a.rows.split(","):
        hd, S, causal, (q, k, v), kend, _ = row_inputs(row, fa.key_end)
        cfg = fa.default_config(hd, S, causal)
        runs = {
            "specjax": jax.jit(lambda q, k, v: fa.flash_attention_fwd(q, k, v, kend, config=cfg)[0]),
            "cudnn": jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                          implementation="cudnn")),
        }
        for name, f in runs.items():
            for _ in range(3):  # compiled, warm
                f(q, k, v).block_until_ready()
            cuda.cuProfilerStart()
            f(q, k, v).block_until_ready()
            cuda.cuProfilerStop()
            print(f"profiled: hd{hd} S{S} causal={causal} {name}" + (f" {cfg}" if name == "specjax" else ""),
                  flush=True)


if __name__ == "__main__":
    main()
