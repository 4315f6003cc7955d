"""Probe (GPU): where ``split_tail``'s time goes (NOTES v25). Per FA3 table row (``hd:S:c|n``): the row's
pick, the pick with ``/t1`` (``merge``), the same kernel with the merge left out (``kernel``: O wrong, the
kernel's time alone), then both again (order bias). Each in microseconds (CUPTI, all kernels of one call)
and TFLOPS; then the ``/t1`` jit's ops in XLA's optimized HLO that cost launches or copies (copy, scatter,
fusion, custom-call), to see that the merge scatters into the kernel's O in place.

    PYTHONPATH=.:benchmarks python3 benchmarks/fa3_split_diag.py 256:512:n,128:1024:n [--iters 40]

Its first run (``results/fa3_split_diag_H100_2026-12-05_log.txt``) also timed a candidate merge, ``reduce``:
the sum over pieces as a reduction instead of v25's first einsum (``merge`` there). It ran 3-11 us faster,
with O bit for bit the einsum's in the interpreter and as far from the pick's on the H100; it is
now ``fa._merge_parts``.
"""
import argparse
import collections
import dataclasses
import re
import statistics
import sys

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

from fa3_configs_probe import row_inputs
from pallas_kernels import flash_attention as fa

_MERGE = fa._merge_parts
_FWD = fa.flash_attention_fwd.__wrapped__  # unjitted: each jit below traces it anew, reading fa._merge_parts
MERGES = {"merge": _MERGE, "kernel": lambda o, lse, *rest: (o, lse)}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("--iters", type=int, default=40)
    a = ap.parse_args(argv)
    print(jax.devices()[0].device_kind, jax.__version__, "command:", " ".join(["python3", *sys.argv]), flush=True)
    for row in a.rows.split(","):
        hd, S, causal, (q, k, v), _, flops = row_inputs(row, fa.key_end)
        mask = "top_left" if causal else "none"
        pick = fa.default_config(hd, S, causal)
        split = dataclasses.replace(pick, split_tail=True)
        fns = {}
        for name, cfg, merge in (("pick", pick, "merge"), ("t1 merge", split, "merge"), ("t1 kernel", split, "kernel"),
                                 ("pick'", pick, "merge"), ("t1 merge'", split, "merge")):
            fa._merge_parts = MERGES[merge]  # read when flash_attention_fwd is traced, just below
            f = jax.jit(lambda q, k, v, c=cfg: _FWD(q, k, v, causal=mask, config=c))
            try:
                out = jax.block_until_ready(f(q, k, v))
                _, t = profiler.measure(f, iterations=a.iters)(q, k, v)
                us = statistics.median(t) * 1e3
                fns[name] = (f, out)
                err = float(jnp.max(jnp.abs(out[0].astype(jnp.float32) - fns["pick"][1][0].astype(jnp.float32))))
                print(f"{row} {name}: {us:.1f} us, {flops / us / 1e6:.0f} TFLOPS, max|o - pick's| {err:.3g}",
                      flush=True)
            except Exception as e:  # noqa: BLE001 (a probe reports and goes on)
                print(f"{row} {name}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
        fa._merge_parts = _MERGE
        if "t1 merge" in fns:
            hlo = fns["t1 merge"][0].lower(q, k, v).compile().as_text()
            ops = collections.Counter(re.findall(r"= .*? (copy|scatter|fusion|custom-call)\(", hlo))
            calls = re.findall(r'custom_call_target="([^"]+)"', hlo)
            print(f"{row} t1 merge HLO: {dict(ops)} custom calls {calls}", flush=True)
            for line in hlo.splitlines():
                if re.search(r"= .*? (copy|scatter)\(", line):
                    print("   ", line.strip()[:220])


if __name__ == "__main__":
    main()
