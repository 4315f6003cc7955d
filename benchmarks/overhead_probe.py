"""Probe (GPU): the fixed time per request of speculative decoding against AR, SmolLM2 shape, random bf16 weights, B=1.

    PYTHONPATH=.:benchmarks python3 benchmarks/overhead_probe.py [--ns 16,64,256] [--repeats 5]

Why: in the spec benchmark (``bench_speculative.py``: prompts padded to 512, one request per prompt) a
straight-line fit of each prompt's seconds against its new tokens gives AR an intercept of ~6 ms and the EAGLE-3
chain ~16-20 ms (``results/spec_*_H200_2026-11-29_large13ktrees2.json``), i.e. ~10 ms more per request, ~12 % of a
256-token EAGLE-3 request. The fit mixes prompts of different acceptance, so this probe measures it directly.

For AR (``generate``) and the speculative loop (``speculative_generate`` with a random EAGLE-3 head, which accepts
~nothing) at the bench's settings (``pad_to=512``; capacity 768 for AR, 1024 for the speculative loop, as there), for each n new
tokens: the request's ``seconds`` (what the bench times) and, for the speculative loop, its phases timed the
same way with a sync after each: prefill (the TTFT), the decode ``while_loop``, the host reads (outputs, stats).
The intercept of seconds against steps (AR) or cycles (speculative) is the fixed cost of a request.
Two variants of the speculative request: ``one_read`` (the host's four reads in one ``device_get``) and
``one_program`` (prefill and loop in one jit, as AR's ``generate``: no TTFT, the state never a program argument).
When measured (``results/overhead_probe_H200_2026-11-29.txt``) the request path timed the first token and read the
host's values one by one, and ``one_program`` was a local copy of what became ``loop.generate`` (then the default
of ``speculative_generate``; the two-program path is ``ttft=True``), so today the plain rows time ``loop.generate``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import bench_decode
import common
from specjax.generate import bucket_shapes, generate, pad_prompts
from specjax import metrics, model
from specjax.heads import eagle3
from specjax.sampling import SamplingParams
from specjax.speculative import loop, speculative_generate
from specjax.speculative.drafters.eagle3 import Eagle3

PAD = 512
CAPACITY = 1024  # the bench's speculative capacity at 256 new tokens (AR's: 768 at every n <= 256)


def _compiled(params, cfg, prompt, drafter, dp, K: int, n: int):
    """(args, prompt lengths, sampling params, compiled prefill, compiled decode) of one request, as
    ``speculative_generate(ttft=True)`` builds them, at the bench's width and capacity."""
    toks, lens = pad_prompts([prompt], bucket_shapes([prompt], n, PAD, reserve=K + 1)[0])
    sp = SamplingParams.make(0.0, 0, 1.0)
    args = (params, dp, jnp.asarray(toks), jnp.asarray(lens), jnp.int32(n), sp, jax.random.key(0))
    return (args, lens, sp, *loop.compile_prefill_decode(args, sp, capacity=CAPACITY, num_draft=K, cfg=cfg,
                                                          drafter=drafter, eos_ids=()))


def spec_phases(params, cfg, prompt, drafter, dp, K: int, n: int) -> dict:
    """The two-program request with a sync after each phase (seconds), the host's reads one by one."""
    args, lens, sp, pre, dec = _compiled(params, cfg, prompt, drafter, dp, K, n)
    t0 = time.perf_counter()
    state = pre(*args)
    jax.block_until_ready(state.last_B)
    t1 = time.perf_counter()
    state = dec(params, dp, state, sp)
    jax.block_until_ready(state)
    t2 = time.perf_counter()
    loop.outputs(state, lens)
    stats = metrics.SpecStats(K, np.asarray(state.cycles_B), np.asarray(state.accepted_BK), np.asarray(state.n_out_B))
    t3 = time.perf_counter()
    return {"prefill": t1 - t0, "decode": t2 - t1, "host": t3 - t2, "cycles": int(stats.cycles_B.sum())}


def spec_variants(params, cfg, prompt, drafter, dp, K: int, n: int) -> dict:
    """Request seconds of two variants: ``one_read`` = two programs with the host's reads in one ``device_get``
    (``speculative_generate(ttft=True)`` today); ``one_program`` = ``loop.generate`` (prefill and loop in one jit,
    only the outcome returned: ``speculative_generate``'s default today) and one ``device_get``."""
    args, _, sp, pre, dec = _compiled(params, cfg, prompt, drafter, dp, K, n)
    one = loop.generate.lower(*args, capacity=CAPACITY, num_draft=K, cfg=cfg, drafter=drafter, eos_ids=()).compile()
    t0 = time.perf_counter()
    state = pre(*args)
    jax.block_until_ready(state.last_B)
    jax.device_get(loop.outcome(dec(params, dp, state, sp)))
    t1 = time.perf_counter()
    jax.device_get(one(*args))
    t2 = time.perf_counter()
    return {"one_read": t1 - t0, "one_program": t2 - t1}


def fit(xs, ys) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line."""
    a, b = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="16,64,256")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--k", type=int, default=7)
    args = ap.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    cfg = bench_decode.SMOLLM2_SHAPE
    params = model.init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    prompt = np.random.default_rng(0).integers(10, 1000, 100).tolist()
    ecfg = eagle3.Eagle3Config(target=cfg, draft_vocab_size=12288)
    dp = {"params": eagle3.init_params(ecfg, jax.random.key(1), dtype=jnp.bfloat16),
          "draft_ids": jnp.arange(12288, dtype=jnp.int32)}
    drafters = {"eagle3": (Eagle3(ecfg), dp)}
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"SmolLM2 shape, random bf16 weights, B=1, prompt 100 tokens padded to {PAD}, K={args.k}, "
          f"median of {args.repeats}", flush=True)
    print("| method | n | steps or cycles | request s (as timed by the library) | prefill ms | decode ms | host ms |")
    print("|---|---|---|---|---|---|---|")
    for rnd in range(2):  # two rounds, AR and the drafters alternating
        rows = {}
        ar = {}
        for n in ns:
            r = [generate(params, cfg, [prompt], max_new_tokens=n, eos_token_ids=(), pad_to=PAD)
                 for _ in range(args.repeats + 1)][1:]
            ar[n] = statistics.median(x.seconds for x in r)
            print(f"| ar | {n} | {n - 1} | {ar[n] * 1e3:.2f} ms | | | |", flush=True)
        rows["ar"] = ([n - 1 for n in ns], [ar[n] for n in ns])
        for name, (drafter, d_params) in drafters.items():
            cyc, secs, extra = [], [], {}
            for n in ns:
                r = [speculative_generate(params, cfg, [prompt], drafter, d_params, num_draft=args.k,
                                          max_new_tokens=n, eos_token_ids=(), pad_to=PAD, capacity=CAPACITY)
                     for _ in range(args.repeats + 1)][1:]
                ph = [spec_phases(params, cfg, prompt, drafter, d_params, args.k, n) for _ in range(args.repeats)]
                med = {k: statistics.median(p[k] for p in ph) for k in ("prefill", "decode", "host")}
                va = [spec_variants(params, cfg, prompt, drafter, d_params, args.k, n) for _ in range(args.repeats + 1)][1:]
                for v in ("one_read", "one_program"):
                    extra.setdefault(v, ([], []))
                    extra[v][1].append(statistics.median(x[v] for x in va))
                    print(f"| {name} {v} | {n} | | {extra[v][1][-1] * 1e3:.2f} ms | | | |", flush=True)
                c = int(r[0].stats.cycles_B.sum())
                cyc.append(c)
                secs.append(statistics.median(x.seconds for x in r))
                print(f"| {name} | {n} | {c} | {secs[-1] * 1e3:.2f} ms | {med['prefill'] * 1e3:.2f} | "
                      f"{med['decode'] * 1e3:.2f} | {med['host'] * 1e3:.2f} |", flush=True)
            rows[name] = (cyc, secs)
            rows.update({f"{name} {v}": (cyc, ys) for v, (_, ys) in extra.items()})
        for name, (x, y) in rows.items():
            a, b = fit(x, y)
            print(f"round {rnd}: {name}: {a * 1e3:.4f} ms per {'step' if name == 'ar' else 'cycle'}, "
                  f"intercept {b * 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
