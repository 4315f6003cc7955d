"""FA3-paper attention backward benchmark: specjax's dK/dV + dQ kernels vs cuDNN's backward vs the
blocked pure-JAX backward (and JAX's ``attention_mgpu`` backward on its fp16 non-causal rows).

Shapes as in the FlashAttention-3 paper: B*S = 16k tokens, H*hd = 2048, S in 512..16k, hd 64, 128 and 256
(``--head-dims``), causal and not, bf16 and fp16. TFLOPS = 10*B*S*S*H*hd / t (the backward's
five matmuls against the forward's two, the FA2/FA3 papers' count; halved when causal); t = the
backward alone: each implementation's residuals come from its own forward, run once outside the
timed call (``jax.vjp``'s function is a pytree, passed to the timed jit as an argument). Timing as
``bench_fa3.py`` (CUPTI GPU time, median over ``--iters`` calls, then over ``--rounds`` rounds of
alternating order). ``--variant NAME:FIELD=V[,FIELD=V]`` adds a column ``specjax_NAME``: the same
forward with the backward kernels under the row's ``default_bwd_config`` with those fields replaced, timed in
the same rounds (rows whose head dim the config refuses, or whose default it is, get none); ``specjax`` itself
runs the custom_vjp's ``default_bwd_config``. Writes ``benchmarks/results/fa3_bwd_<device>_<date><tag>.{json,md}``
(and into ``$OUT`` where that is set, as on the device machine). Needs a GPU.

    PYTHONPATH=.:benchmarks python3 benchmarks/bench_fa3_bwd.py [--quick] [--blocked-max S] [--fp16 ...]
        [--variant q128:block_q_dkv=128 ...] [--tag _x]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import statistics
import sys

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

from bench_fa3 import measure_row
from common import device_name, write_results
from pallas_kernels.flash_attention import default_config, key_end
from pallas_kernels.flash_attention_bwd import BwdConfig, default_bwd_config, flash_attention_bwd
from pallas_kernels.flash_attention_vjp import _fwd as vjp_fwd, attention_bwd_blocked, flash_attention

IMPLS = ("specjax", "cudnn", "blocked", "jax_mgpu")
_vjp_apply = jax.jit(lambda fn, do: fn(do))


def _backward(forward, q, k, v):
    """``(vjp function, cotangent)``: the arguments of the timed call ``_vjp_apply``. The forward
    runs once here: its residuals are arguments of the timed call, not part of it."""
    out, fn = jax.vjp(forward, q, k, v)
    return fn, jax.random.normal(jax.random.key(1), out.shape, out.dtype)


def _measure_backward(vjp_args, _, iters: int) -> float | None:
    """Median CUPTI time of ``_vjp_apply(*vjp_args)``, all three gradients returned: ``profiler.measure``
    jits what it times, so returning dq alone would let XLA drop a kernel that computes only dk and dv."""
    try:
        jax.block_until_ready(_vjp_apply(*vjp_args))
        _, times = profiler.measure(_vjp_apply, iterations=iters)(*vjp_args)
        return statistics.median(times)
    except Exception as e:  # report, keep the table going
        print(f"    failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return None


def parse_variant(text: str) -> tuple[str, dict]:
    """``"q128:block_q_dkv=128,block_kv_dq=128"`` -> ``("q128", {"block_q_dkv": 128, "block_kv_dq": 128})``: the
    fields a row's ``default_bwd_config`` is replaced with. A bool field takes 0 or 1 (``fused:fused_dq=1``)."""
    name, sep, fields = text.partition(":")
    if not sep or not name.isidentifier() or not fields:
        raise ValueError(f"a variant is NAME:FIELD=VALUE[,FIELD=VALUE...] with BwdConfig's int (or 0 / 1) fields, "
                         f"got {text!r}")
    kw = {}
    for item in fields.split(","):
        field, _, value = item.partition("=")
        if field not in BwdConfig.__dataclass_fields__ or not value.lstrip("-").isdigit():
            raise ValueError(f"variant {name!r}: {item!r} is not FIELD=INT for a BwdConfig field "
                             f"({', '.join(BwdConfig.__dataclass_fields__)})")
        kw[field] = bool(int(value)) if BwdConfig.__dataclass_fields__[field].type == "bool" else int(value)
    BwdConfig(**kw)   # the fields' own checks
    return name, kw


def _impls(S: int, hd: int, causal: bool, dtype, blocked: bool, variants=()):
    B, H = 16384 // S, 2048 // hd
    kend = key_end(B, S, S, causal="top_left" if causal else "none")
    cfg = default_config(hd, S, causal)
    impls = {
        "specjax": lambda q, k, v: flash_attention(q, k, v, kend, None, cfg),
        "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn"),
    }

    def forward(q, k, v):   # the custom_vjp's own forward; its residuals less k_end
        o, res = vjp_fwd(q, k, v, kend, None, cfg)
        return o, res[:5]

    def with_backward(bwd):
        attn = jax.custom_vjp(impls["specjax"])
        attn.defvjp(forward, bwd)
        return attn

    for name, fields in variants:   # the kernels under another BwdConfig, same forward
        bcfg = dataclasses.replace(default_bwd_config(hd), **fields)
        if bcfg == default_bwd_config(hd):
            continue   # that is the specjax column
        try:
            bcfg.check_head_dim(hd, jnp.dtype(dtype).itemsize)
        except ValueError:
            continue
        impls[f"specjax_{name}"] = with_backward(
            lambda res, do, bcfg=bcfg: flash_attention_bwd(*res, do, kend, scale=hd ** -0.5, config=bcfg))
    if blocked:  # the blocked pure-JAX backward on specjax's forward (the custom_vjp's at hd 256)
        impls["blocked"] = with_backward(lambda res, do: attention_bwd_blocked(*res, do, kend, scale=hd ** -0.5))
    if dtype == jnp.float16 and not causal and hd in (64, 128):  # its backward has no causal mask
        from jax.experimental.pallas.ops.gpu import attention_mgpu as am
        mcfg = am.TuningConfig(block_q=64, block_kv={64: 256, 128: 128}[hd], max_concurrent_steps=2,
                               block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
        impls["jax_mgpu"] = functools.partial(am.attention, config=mcfg)
    return (B, S, H, hd), impls


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="bf16 and S in {1k, 4k, 16k} only")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--blocked-max", type=int, default=2048,
                    help="time the blocked pure-JAX backward (slow) only up to this S (0: never)")
    ap.add_argument("--fp16", default="noncausal", choices=("all", "noncausal", "none"),
                    help="fp16 rows (S in {1k, 4k, 16k}): all, only non-causal (where attention_mgpu has a "
                         "backward), or none")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:FIELD=V[,FIELD=V]",
                    help="also time the backward kernels under BwdConfig(FIELD=V, ...), as column specjax_NAME")
    ap.add_argument("--head-dims", default="64,128,256", help="comma-separated head dims of the table")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    head_dims = tuple(int(x) for x in args.head_dims.split(","))
    try:
        variants = [parse_variant(v) for v in args.variant]
    except ValueError as e:
        ap.error(str(e))
    dev = jax.devices()[0]
    if dev.platform != "gpu":
        sys.exit(f"bench_fa3_bwd.py times CUDA kernels and needs a GPU; JAX runs on {dev.platform}: nothing measured")
    seqs = (1024, 4096, 16384) if args.quick else (512, 1024, 2048, 4096, 8192, 16384)
    rows, key = [], jax.random.key(0)
    grid = [(S, hd, c, jnp.bfloat16) for hd in head_dims for c in (False, True) for S in seqs]
    if not args.quick and args.fp16 != "none":
        grid += [(S, hd, c, jnp.float16) for hd in head_dims for c in (False, True) for S in (1024, 4096, 16384)
                 if args.fp16 == "all" or not c]
    for S, hd, causal, dtype in grid:
        shape, forwards = _impls(S, hd, causal, dtype, args.blocked_max > 0, variants)
        key, *ks = jax.random.split(key, 4)
        q, k, v = (jax.random.normal(kk, shape, dtype) for kk in ks)
        flops = 10 * shape[0] * S * S * shape[2] * hd / (2 if causal else 1)
        row = {"S": S, "hd": hd, "causal": causal, "dtype": jnp.dtype(dtype).name}
        timed = {}   # name -> (vjp function, cotangent): the timed call's arguments
        for name, forward in forwards.items():
            if name == "blocked" and S > args.blocked_max:
                continue
            try:
                timed[name] = _backward(forward, q, k, v)
            except Exception as e:  # report, keep the table going
                print(f"    {name} failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        slow = {n: timed.pop(n) for n in ("blocked",) if n in timed}   # 3 calls, one round
        ms = {**measure_row(timed, None, args.iters, args.rounds, measure=_measure_backward),
              **measure_row(slow, None, 3, 1, measure=_measure_backward)}
        for name in (*IMPLS, *(f"specjax_{n}" for n, _ in variants)):
            row[f"{name}_tflops"] = None if not ms.get(name) else round(flops / statistics.median(ms[name]) / 1e9, 1)
        del timed, slow
        print(row, flush=True)
        rows.append(row)
        _write(rows, dev, " ".join(["python3", *sys.argv]), args.tag, args.rounds, len(rows) < len(grid),
               [n for n, _ in variants])


def _write(rows, dev, command, tag, rounds, quiet, variants=()) -> None:
    """Rewrites the JSON and markdown table after every row (a cut-off run keeps its rows)."""
    date = datetime.date.today().isoformat()
    doc = {"device": dev.device_kind, "jax": jax.__version__, "date": date, "command": command,
           "timing_rounds": rounds, "flops": "10*B*S^2*H*hd per backward, halved when causal", "rows": rows}
    fmt = lambda x: "-" if x is None else f"{x:.0f}"
    ratio = lambda a, b: "-" if not (a and b) else f"{a / b:.2f}"
    extra = [f"specjax_{n}" for n in variants]
    md = ["| dtype | hd | causal | S | specjax | cuDNN | blocked JAX | attention_mgpu | specjax/cuDNN |"
          + "".join(f" {n} | {n}/cuDNN |" for n in extra),
          "|---|---|---|---|---|---|---|---|---|" + "---|---|" * len(extra)]
    for r in rows:
        md.append(f"| {r['dtype']} | {r['hd']} | {r['causal']} | {r['S']} | {fmt(r['specjax_tflops'])} | "
                  f"{fmt(r['cudnn_tflops'])} | {fmt(r['blocked_tflops'])} | {fmt(r['jax_mgpu_tflops'])} | "
                  f"{ratio(r['specjax_tflops'], r['cudnn_tflops'])} |"
                  + "".join(f" {fmt(r.get(f'{n}_tflops'))} | {ratio(r.get(f'{n}_tflops'), r['cudnn_tflops'])} |"
                            for n in extra))
    write_results(f"fa3_bwd_{device_name().lower()}_{date}{tag}", doc,
                  f"{dev.device_kind}, jax {jax.__version__}, {date}, backward TFLOPS (10*B*S^2*H*hd / t, halved "
                  f"when causal; median of {rounds} timing rounds)\n\n" + "\n".join(md) + "\n")
    if not quiet:
        print("\n".join(md))

if __name__ == "__main__":
    main()
