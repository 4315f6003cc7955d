"""Where does a decode step's time go? Profile the AR loop and list GPU kernels per step.

    python benchmarks/profile_decode.py [--model smollm-shape|8b] [--batch 1] [--steps 64] [--timeline N]

Uses jax.profiler's perfetto trace; prints kernels grouped by name with count and microseconds
per decode step, and writes the table to $OUT (or benchmarks/results) as profile_<model>.txt.
``--timeline N`` appends N consecutive kernels from the middle of the loop, in launch order, with each
one's duration and the idle gap before it (which kernels one layer runs, and what waits between them).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import bench_decode
from specjax import config, model
from specjax.generate import generate


def gpu_events(fn):
    """(fn(), the GPU kernel events of that call from a perfetto trace: dicts with name, ts, dur in us)."""
    tmp = tempfile.mkdtemp()
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
        r = fn()
    path = glob.glob(f"{tmp}/**/perfetto_trace.json.gz", recursive=True)[0]
    events = json.load(gzip.open(path))["traceEvents"]
    pids = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    return r, [e for e in events if e.get("ph") == "X" and "GPU" in pids.get(e.get("pid"), "")]


def us_by_kind(events, per: float) -> collections.Counter:
    """GPU microseconds of ``events`` (``gpu_events``) per ``per`` (e.g. per cycle or per call), by kernel kind: the
    name without its numeric suffix (``fusion_12`` and ``fusion.3`` count as ``fusion``)."""
    us = collections.Counter()
    for e in events:
        us[re.sub(r"[._]\d+$", "", e["name"])] += e["dur"] / per
    return us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm-shape")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--timeline", type=int, default=0)
    args = ap.parse_args()
    cfg = bench_decode.SMOLLM2_SHAPE if args.model == "smollm-shape" else config.llama3_8b_shape()
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    prompts = [np.random.default_rng(0).integers(10, 1000, 128).tolist()] * args.batch
    generate(params, cfg, prompts, max_new_tokens=args.steps, eos_token_ids=())  # compile + warm
    r, gpu = gpu_events(lambda: generate(params, cfg, prompts, max_new_tokens=args.steps, eos_token_ids=()))
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in gpu:
        agg[e["name"]][0] += 1
        agg[e["name"]][1] += e.get("dur", 0.0)
    steps = args.steps
    lines = [f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {time.strftime('%Y-%m-%d')}, "
             f"python benchmarks/profile_decode.py --model {args.model} --batch {args.batch} --steps {args.steps}"
             f" --timeline {args.timeline}",
             f"{args.model} B={args.batch}: {r.seconds * 1e3 / steps:.3f} ms/step wall (incl. prefill), "
             f"{len(gpu) / steps:.1f} GPU events/step, {sum(v[1] for v in agg.values()) / steps:.1f} us busy/step"]
    for name, (n, dur) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:40]:
        lines.append(f"{n / steps:7.1f}/step {dur / steps:9.1f} us/step  {name[:120]}")
    if args.timeline:
        seq = sorted(gpu, key=lambda e: e["ts"])
        mid = len(seq) // 2
        lines.append(f"timeline: {args.timeline} kernels from the middle (gap = idle us before the kernel)")
        for prev, e in zip(seq[mid - 1:], seq[mid:mid + args.timeline]):
            gap = e["ts"] - (prev["ts"] + prev.get("dur", 0.0))
            lines.append(f"  {e.get('dur', 0.0):6.2f} us  gap {gap:5.2f}  {e['name'][:100]}")
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("OUT", "benchmarks/results")
    with open(os.path.join(out, f"profile_{args.model}_B{args.batch}.txt"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
