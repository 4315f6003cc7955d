"""Data-parallel training throughput: the EAGLE-3 recipe (7-step training-time test, 12288-token draft
vocabulary, bf16 compute) on a random-weight target of SmolLM2-135M's shape and random tokens, on 1
and on n devices (``TrainConfig.devices``), one process. Steps/s are timed between two host reads
after the compiled warm-up steps. Writes ``benchmarks/results/train_scaling_<device>_<date><tag>.
{json,md}`` (or under ``--out``). Needs GPUs to mean anything (CPU runs work, slowly).

    PYTHONPATH=. python3 benchmarks/train_scaling_probe.py [--steps 40] [--warmup 10] [--batch 32] [--tag _x]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench_decode import SMOLLM2_SHAPE
from common import device_name, header
from specjax import model
from specjax.files import atomic_write_text
from specjax.heads import eagle3
from training import data, losses
from training.loop import TrainConfig, train


def _dataset(rows: int, seq: int, vocab: int) -> data.TokenDataset:
    rng = np.random.default_rng(0)
    return data.pack_examples([(rng.integers(0, vocab, 32).tolist(), rng.integers(0, vocab, seq).tolist())
                               for _ in range(rows)], seq)


def run(n: int, tp, ds, a) -> dict:
    marks = []
    tc = TrainConfig(steps=a.steps, batch_size=a.batch, lr=8e-4, warmup_steps=5, compute_dtype="bfloat16",
                     log_every=a.warmup, progress=False, devices=n)
    ecfg = eagle3.Eagle3Config(SMOLLM2_SHAPE, 12288)   # as training.recipes.train_eagle3, with a callback
    loss = functools.partial(losses.eagle3_loss, cfg=ecfg, num_steps=7, decay=0.8)
    train(loss, eagle3.init_params(ecfg, jax.random.key(0)), {"target": tp, "draft_ids": jnp.arange(12288)}, ds, tc,
          callback=lambda rec: marks.append((rec["step"], time.perf_counter())))
    (s0, t0), (s1, t1) = next(m for m in marks if m[0] == a.warmup), marks[-1]
    sps = (s1 - s0) / (t1 - t0)
    row = {"devices": n, "steps_per_s": round(sps, 3), "token_positions_per_s": round(sps * a.batch * a.seq)}
    print(row, flush=True)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10, help="steps before timing starts (compilation); also log_every")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    if a.steps % a.warmup or a.steps <= a.warmup:
        ap.error("--steps must be a multiple of --warmup and larger than it (the host reads the metrics every --warmup steps)")
    tp = model.init_params(SMOLLM2_SHAPE, jax.random.key(0), dtype=jnp.bfloat16)
    ds = _dataset(4 * a.batch, a.seq, SMOLLM2_SHAPE.vocab_size)
    counts = sorted({1, jax.device_count()})
    rows = [run(n, tp, ds, a) for n in counts]
    for r in rows:
        r["speedup_vs_1"] = round(r["steps_per_s"] / rows[0]["steps_per_s"], 3)
    doc = {**header(), "batch": a.batch, "seq": a.seq,
           "recipe": "eagle3, 7 TTT steps, draft vocab 12288, bf16 compute, random SmolLM2-shape target", "rows": rows}
    base = os.path.join(a.out, f"train_scaling_{device_name().lower()}_{doc['date']}{a.tag}")
    os.makedirs(a.out, exist_ok=True)
    md = [f"{doc['device']}, jax {doc['jax']}, {doc['date']}: {doc['recipe']}, batch {a.batch} x {a.seq}", "",
          "| devices | steps/s | token positions/s | vs 1 device |", "|---|---|---|---|"]
    md += [f"| {r['devices']} | {r['steps_per_s']} | {r['token_positions_per_s']} | {r['speedup_vs_1']}x |" for r in rows]
    atomic_write_text(base + ".json", json.dumps(doc, indent=1))
    atomic_write_text(base + ".md", "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
