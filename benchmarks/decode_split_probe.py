"""Probe (GPU): end-to-end AR decode (bench_decode.py, SmolLM2 shape) with the decode kernel's
`default_config` split_blocks overridden; argv[1] is an int or "default". Results:
results/decode_H200_2026-11-26_split*.md (the four runs default, 1, 8, default of one call; the
second default run overwrote the first one's file).

    PYTHONPATH=.:benchmarks python3 benchmarks/decode_split_probe.py 1
"""
import dataclasses, sys
import pallas_kernels.decode_attention as da
n = sys.argv[1]
if n != "default":
    orig = da.default_config
    da.default_config = lambda *a: dataclasses.replace(orig(*a), split_blocks=int(n))
sys.argv = ["bench_decode.py", "--models", "smollm-shape", "--tag", f"_split{n}"]
import runpy
runpy.run_path("benchmarks/bench_decode.py", run_name="__main__")
