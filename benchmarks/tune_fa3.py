"""Sweep the FA3 kernel's TuningConfig over the FA3-paper table (one GPU, one process).

For every row of ``bench_fa3.py``'s table in one dtype (bf16 by default): every
``(block_kv, num_stages, schedule)`` that fits shared memory at that head dim, and cuDNN, timed in
the same process (CUPTI median of ``--iters`` calls). Writes
``benchmarks/results/fa3_tune_<device>_<date><tag>.{json,md}``: all timings, and per row the best
config and its ratio to today's ``default_config``. The picks feed ``flash_attention.TUNED``; the
picks are then checked by a separate ``bench_fa3.py`` run (a sweep's best of N is biased upward by
timing noise, so its own numbers are not the result). ``--schedules-only``: the base blocks with the
grid, persistent and balanced persistent schedules; ``--overlap``: intra-warpgroup overlap configs;
``--o-tiles``: each row's pick as a persistent kernel, with and without overlap, at every number of
O staging tiles that fits (``TuningConfig.o_tiles``: 0 or 2). Needs a GPU.

    PYTHONPATH=. python3 benchmarks/tune_fa3.py [--dtype bfloat16] [--iters 20] [--tag _x] [--schedules-only | --overlap | --o-tiles]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime
import itertools
import json
import os
import sys

import jax
import jax.numpy as jnp

from bench_fa3 import _try_compile, measure_row
from common import device_name
from pallas_kernels.flash_attention import (_SMEM_LIMIT, TuningConfig, default_config, flash_attention_fwd,
                                            key_end, max_overlap_block_kv, with_overlap)
from specjax.files import atomic_write_text

SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def candidates(hd: int, sms: int, schedules_only: bool = False, overlap: bool = False) -> list[TuningConfig]:
    """Every block_kv in {64, 128, 192, 256} x num_stages in {2, 3, 4} x {grid, persistent} whose
    SMEM fits (multiples of 64 keep V's 128-byte swizzle; the narrower-swizzle blocks in between
    measured slower on every row probed, pallas_kernels/NOTES.md v8); ``schedules_only``:
    default_config(hd)'s blocks with the grid, the persistent and the balanced persistent schedule;
    ``overlap``: intra-warpgroup overlap with every block_kv up to ``max_overlap_block_kv(hd)`` and
    the three schedules (``main`` adds each row's tuned default; ``o_tile_candidates`` for --o-tiles)."""
    if overlap:
        return [TuningConfig(block_kv=bkv, persistent=p, balanced=b, num_ctas=sms, overlap=True)
                for bkv in range(64, max_overlap_block_kv(hd) + 1, 64)
                for p, b in ((False, False), (True, False), (True, True))]
    if schedules_only:
        base = default_config(hd)
        return [dataclasses.replace(base, persistent=p, balanced=b, num_ctas=sms)
                for p, b in ((False, False), (True, False), (True, True))]
    out = []
    for bkv, st, pers in itertools.product((64, 128, 192, 256), (2, 3, 4), (False, True)):
        cfg = TuningConfig(block_kv=bkv, num_stages=st, persistent=pers, num_ctas=sms)
        if cfg.smem_bytes(hd) <= _SMEM_LIMIT:   # Mosaic GPU's own count (test_smem_bytes_is_what_mosaic_allocates)
            out.append(cfg)
    return out


def o_tile_candidates(pick: TuningConfig, hd: int) -> list[TuningConfig]:
    """``pick`` as a persistent kernel (balanced if the pick is), without and with overlap, at each
    ``o_tiles`` that fits."""
    out = []
    for overlap in (False, True):
        base = dataclasses.replace(pick, persistent=True, overlap=False)
        p = with_overlap(base, hd) if overlap else base
        tiles = (0,) if p.spare_q else (0, p.consumers)   # o_tiles is 0 or one per consumer; spare_q: 0
        out += [c for n in tiles if (c := dataclasses.replace(p, o_tiles=n)).smem_bytes(hd) <= _SMEM_LIMIT]
    return out


def parse_label(text: str, sms: int, config_type=TuningConfig) -> TuningConfig:
    """The inverse of ``label``: ``"128/2/P+O/o0"`` -> TuningConfig(block_kv=128, num_stages=2,
    persistent=True, overlap=True, o_tiles=0, num_ctas=sms); a ``/c3`` suffix: 3 consumers, ``/s1``:
    ``spare_q``, ``/a1``: ``alternate_gemms``, ``/f1``: ``prefetch``, ``/m0``: ``kernel_mask=False``,
    ``/n128``: ``num_ctas=128``, ``/p1``: ``fp8_p_in_regs``, ``/l1``: ``lazy_rescale``."""
    bkv, stages, sched, *rest = text.split("/")
    sched, _, ov = sched.partition("+")
    if sched not in ("G", "P", "B") or ov not in ("", "O"):
        raise ValueError(f"not a config label (block_kv/num_stages/G|P|B[+O][/oN][/cN][/s1][/a1][/f1][/m0]"
                         f"[/nN][/p1][/l1]): {text!r}")
    return config_type(block_kv=int(bkv), num_stages=int(stages), persistent=sched != "G",
                       balanced=sched == "B", overlap=ov == "O", **{"num_ctas": sms, **label_fields(rest, text)})


def label_fields(suffixes, text: str = "") -> dict:
    """A label's ``/xN`` suffixes (``parse_label``) as TuningConfig fields."""
    keys = {"o": "o_tiles", "c": "consumers", "s": "spare_q", "a": "alternate_gemms", "f": "prefetch",
            "m": "kernel_mask", "n": "num_ctas", "p": "fp8_p_in_regs", "l": "lazy_rescale"}
    if any(r[:1] not in keys or not r[1:].isdigit() for r in suffixes):
        raise ValueError(f"not a config label's suffixes (/oN /cN /s1 /a1 /f1 /m0 /nN /p1 /l1): {text or suffixes!r}")
    return {keys[r[0]]: bool(int(r[1:])) if r[0] in "safmpl" else int(r[1:]) for r in suffixes}


def label(cfg: TuningConfig) -> str:
    sched = 'B' if cfg.balanced else 'P' if cfg.persistent else 'G'
    o_tiles = "" if cfg.o_tiles is None else f"/o{cfg.o_tiles}"
    consumers = "" if cfg.consumers == 2 else f"/c{cfg.consumers}"
    spare = "/s1" if cfg.spare_q else ""
    turns = "/a1" if cfg.alternate_gemms else ""
    prefetch = "/f1" if cfg.prefetch else ""
    mask = "" if cfg.kernel_mask else "/m0"
    regs = "/p1" if cfg.fp8_p_in_regs else ""
    lazy = "/l1" if cfg.lazy_rescale else ""
    return (f"{cfg.block_kv}/{cfg.num_stages}/{sched}{'+O' if cfg.overlap else ''}{o_tiles}{consumers}{spare}"
            f"{turns}{prefetch}{mask}{regs}{lazy}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--hds", default="64,128,256")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--schedules-only", action="store_true",
                      help="default blocks; grid (G), persistent (P) and balanced persistent (B) schedules")
    mode.add_argument("--overlap", action="store_true",
                      help="each row's tuned default against intra-warpgroup overlap (+O) configs")
    mode.add_argument("--o-tiles", action="store_true",
                      help="each row's tuned default against its persistent forms with 0 / 2 O staging tiles (/oN)")
    args = ap.parse_args(argv)
    dev = jax.devices()[0]
    if dev.platform != "gpu":
        sys.exit(f"tune_fa3.py times CUDA kernels and needs a GPU; JAX runs on {dev.platform}")
    sms = getattr(dev, "core_count", None) or 132
    dtype = jnp.dtype(args.dtype)
    key = jax.random.key(0)
    jobs = []
    for hd in map(int, args.hds.split(",")):
        for causal, S in itertools.product((False, True), SEQS):
            B, H = 16384 // S, 2048 // hd
            kend = key_end(B, S, S, causal="top_left" if causal else "none")
            d = default_config(hd, S, causal)
            if args.o_tiles:
                cands = o_tile_candidates(d, hd) + [d]
            else:
                cands = candidates(hd, sms, args.schedules_only, args.overlap) + ([d] if args.overlap else [])
            fns = {label(c): jax.jit(lambda q, k, v, c=c, e=kend: flash_attention_fwd(q, k, v, e, config=c)[0])
                   for c in cands}
            fns["cudnn"] = jax.jit(lambda q, k, v, c=causal: jax.nn.dot_product_attention(
                q, k, v, is_causal=c, implementation="cudnn"))
            key, *ks = jax.random.split(key, 4)
            qkv = [jax.random.normal(kk, (B, S, H, hd), dtype) for kk in ks]
            jobs.append(dict(hd=hd, causal=causal, S=S, flops=4 * B * S * S * H * hd / (2 if causal else 1),
                             fns=fns, qkv=qkv, default=label(d)))
    with cf.ThreadPoolExecutor(16) as pool:   # compile everything first, in parallel
        list(pool.map(lambda jf: _try_compile(*jf), [(f, j["qkv"]) for j in jobs for f in j["fns"].values()]))
    rows = []
    for j in jobs:
        timed = measure_row(j["fns"], j["qkv"], args.iters, rounds=1)  # one round: the configs in a fixed order
        tf = {name: None if ms is None else round(j["flops"] / ms[0] / 1e9, 1) for name, ms in timed.items()}
        cud = tf.pop("cudnn")
        ok = {k: v for k, v in tf.items() if v}
        best = max(ok, key=ok.get)
        row = dict(hd=j["hd"], causal=j["causal"], S=j["S"], dtype=args.dtype, cudnn_tflops=cud,
                   default=j["default"], default_tflops=tf.get(j["default"]), best=best,
                   best_tflops=ok[best], configs=tf)
        print({k: v for k, v in row.items() if k != "configs"}, flush=True)
        rows.append(row)
        _write(rows, dev, args, quiet=len(rows) < len(jobs))


def _write(rows, dev, args, quiet) -> None:
    name = device_name().lower()
    date = datetime.date.today().isoformat()
    doc = {"device": dev.device_kind, "jax": jax.__version__, "date": date,
           "command": " ".join(["python3", *sys.argv]), "label": "block_kv/num_stages/(G)rid|(P)ersistent|(B)alanced persistent[+O: overlap][/oN: N O staging tiles]",
           "rows": rows}
    base = os.path.join(args.out, f"fa3_tune_{name}_{date}{args.tag}")
    os.makedirs(args.out, exist_ok=True)
    f = lambda x: "-" if x is None else f"{x:.0f}"
    md = [f"{dev.device_kind}, jax {jax.__version__}, {date}, {args.dtype}, TFLOPS "
          "(config = block_kv/num_stages/G grid, P persistent or B balanced persistent)", "",
          "| hd | causal | S | cuDNN | default | default TFLOPS | best | best TFLOPS | best/default | best/cuDNN |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['hd']} | {r['causal']} | {r['S']} | {f(r['cudnn_tflops'])} | {r['default']} | "
                  f"{f(r['default_tflops'])} | {r['best']} | {f(r['best_tflops'])} | "
                  f"{r['best_tflops'] / r['default_tflops']:.3f} | "
                  f"{r['best_tflops'] / r['cudnn_tflops']:.3f} |" if r['default_tflops'] and r['cudnn_tflops']
                  else f"| {r['hd']} | {r['causal']} | {r['S']} | {f(r['cudnn_tflops'])} | {r['default']} | - | "
                       f"{r['best']} | {f(r['best_tflops'])} | - | - |")
    atomic_write_text(base + ".json", json.dumps(doc, indent=1))
    atomic_write_text(base + ".md", "\n".join(md) + "\n")
    if not quiet:
        print("\n".join(md))


if __name__ == "__main__":
    main()
