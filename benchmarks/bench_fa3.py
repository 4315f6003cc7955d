"""FA3-paper attention forward benchmark: specjax kernel vs cuDNN vs JAX's attention_mgpu.

Shapes as in the FlashAttention-3 paper: B*S = 16k tokens, H*hd = 2048, S in 512..16k,
hd in {64, 128, 256}, causal and not, bf16 and fp16. TFLOPS = 4*B*S*S*H*hd / t (halved when
causal); t = median of CUPTI-measured GPU time of all kernels the call launches, over ``--iters`` calls, then
the median over ``--rounds`` rounds in which the row's implementations take turns, their order reversed every
round (``measure_row``), so that none is always timed first after the previous row. attention_mgpu
only takes fp16, so its column is filled on fp16 rows. ``specjax`` is the kernel with
``default_config(hd, S, causal)`` (the tuned pick; the model's dispatch passes causal=True) and the static
mask (``causal="top_left"`` or ``"none"``: k_end computed in the kernel, as cuDNN gets ``is_causal``);
``specjax_kend`` the same kernel with the mask as a ``k_end`` array (``key_end``: the general
path, with an XLA op for the tiles' bounds before the kernel) and the array form's pick,
``default_config(hd, S, causal, mask_array=True)``: the same config but on ``TUNED_ARRAYS``' rows
(up to and including 2026-12-05's ``_h100v23`` table the column took the static form's config);
``--variants`` also times both fixed
variants in the same process: one CTA per tile (``specjax_grid``) and the persistent grid
(``specjax_persistent``, ``num_ctas`` = the device's SM count), and ``specjax_overlap``:
``overlap_config(hd, S)``, default_config's schedule with FA3's intra-warpgroup overlap (block_kv
capped to fit registers: hd64 256 -> 128). ``--fp8``: float8_e4m3fn rows instead (hd x causal x S,
the stretch row hd 256 16k among them): ``specjax`` / ``specjax_kend`` are the FP8 forward
(``fp8_config(hd, S, causal)``; bfloat16 O; the time includes the XLA transpose of V to V^T before the kernel),
``cudnn`` and ``specjax_bf16`` (``default_config``) the same values in bfloat16. ``--sustained SECONDS``: a
second measure, not CUPTI bursts: per round each implementation runs back to back for ``--warm`` seconds untimed and
then SECONDS timed by the wall clock (``sustained_ms``), so every figure is taken at the clock the board's power cap
holds (the long rows' bursts start above it, pallas_kernels/NOTES.md v29); ``nvidia-smi`` samples the SM clock, power
and clock-event reasons meanwhile and each row keeps their means over its windows; only ``specjax`` and ``cudnn``
are timed. ``--dtypes`` picks the 16-bit dtypes. Writes
``benchmarks/results/fa3_<device>_<date><tag>.{json,md}`` (or under ``--out``). Needs a GPU.

    PYTHONPATH=. python3 benchmarks/bench_fa3.py [--quick] [--variants] [--fp8] [--sustained 1.5] [--dtypes bfloat16]
        [--tag _x] [--out DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime
import functools
import json
import os
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

from common import device_name
from pallas_kernels.flash_attention import default_config, flash_attention_fwd, fp8_config, key_end, overlap_config
from specjax.files import atomic_write_text


def _mgpu(causal: bool, hd: int):
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am
    block_kv = {64: 256, 128: 128, 256: 64}[hd]   # its main()'s first fitting block
    cfg = am.TuningConfig(block_q=64, block_kv=block_kv, max_concurrent_steps=2, causal=causal)
    return functools.partial(am.attention, config=cfg)


IMPLS = ("specjax", "specjax_kend", "specjax_grid", "specjax_persistent", "specjax_overlap", "specjax_bf16", "cudnn",
         "jax_mgpu")
F8 = jnp.float8_e4m3fn
VARIANTS = ("specjax_grid", "specjax_persistent", "specjax_overlap")  # timed with --variants only


def _impls(S: int, hd: int, causal: bool, dtype, persistent_ctas: int | None):
    B, H = 16384 // S, 2048 // hd
    mask = "top_left" if causal else "none"
    kend = key_end(B, S, S, causal=mask)
    specjax = lambda cfg: jax.jit(lambda q, k, v: flash_attention_fwd(q, k, v, causal=mask, config=cfg)[0])
    kend_form = lambda cfg: jax.jit(lambda q, k, v: flash_attention_fwd(q, k, v, kend, config=cfg)[0])
    cudnn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn"))
    tuned = default_config(hd, S, causal)  # the tuned pick (the model's dispatch passes causal)
    if dtype == F8:  # the FP8 forward on e4m3 values; cuDNN and the bf16 kernel on the same values
        f8 = fp8_config(hd, S, causal)
        return (B, S, H, hd), {"specjax": specjax(f8), "specjax_kend": kend_form(f8), "specjax_bf16": specjax(tuned),
                               "cudnn": cudnn}
    impls = {"specjax": specjax(tuned), "specjax_kend": kend_form(default_config(hd, S, causal, mask_array=True)),
             "cudnn": cudnn}
    if persistent_ctas:  # both fixed variants, and default_config's schedule with overlap
        impls["specjax_grid"] = specjax(default_config(hd))
        impls["specjax_persistent"] = specjax(
            dataclasses.replace(default_config(hd), persistent=True, num_ctas=persistent_ctas))
        ov = overlap_config(hd, S, causal)
        impls["specjax_overlap"] = specjax(
            dataclasses.replace(ov, num_ctas=persistent_ctas) if ov.persistent else ov)
    if dtype == jnp.float16:
        impls["jax_mgpu"] = jax.jit(_mgpu(causal, hd))
    return (B, S, H, hd), impls


def _measure(fn, args, iters: int) -> float | None:
    try:
        jax.block_until_ready(fn(*args))   # an array or a tuple of them (the backward's)
        _, times = profiler.measure(fn, iterations=iters)(*args)
        return statistics.median(times)
    except Exception as e:  # report, keep the table going
        print(f"    failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return None


def sustained_ms(fn, args, seconds: float, warm: float, spans: list | None = None, clock=time.time) -> float | None:
    """ms per call of ``fn`` called back to back: ``warm`` seconds untimed, then ``seconds`` timed by ``clock``,
    synchronising once per ~0.1 s of calls (a batch sized from one timed call) so the queue never runs dry for
    long. Appends ``(fn, start, end)`` of the timed part to ``spans`` (for the clock samples)."""
    try:
        jax.block_until_ready(fn(*args))
        t = clock()
        jax.block_until_ready(fn(*args))
        batch = max(1, min(10_000, int(0.1 / max(clock() - t, 1e-6))))

        def run(limit):
            t0, n = clock(), 0
            while n == 0 or clock() - t0 < limit:
                for _ in range(batch):
                    out = fn(*args)
                jax.block_until_ready(out)
                n += batch
            return t0, clock(), n
        if warm > 0:
            run(warm)
        t0, t1, n = run(seconds)
    except Exception as e:  # report, keep the table going
        print(f"    failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return None
    if spans is not None:
        spans.append((fn, t0, t1))
    return (t1 - t0) / n * 1e3


def _args_for(args, name: str):
    """``args`` as one tuple for every implementation, or ``{name: tuple}`` (--fp8: bf16 copies for some)."""
    return args[name] if isinstance(args, dict) else args


def measure_row(impls: dict, args, iters: int, rounds: int, measure=_measure) -> dict:
    """``{name: [ms of each round] or None}`` from ``measure(fn, args, iters)``; the table reports the
    median and keeps the rounds. The implementations take turns, in ``impls``' order in even rounds
    and reversed in odd ones, so none is always timed first in its row: in the tables up to v14
    (specjax always first) several rows ran up to ~10 % below their probe figures for specjax and up
    to ~5 % for cuDNN (pallas_kernels/NOTES.md v15; the order is a suspect, not a proven cause). One
    that fails once is None. ``args``: one tuple for all, or ``{name: tuple}``."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 (timing rounds per row), got {rounds}")
    names, times = list(impls), {n: [] for n in impls}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if times[name] is not None:
                t = measure(impls[name], _args_for(args, name), iters)
                times[name] = None if t is None else times[name] + [t]
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="hd128, S in {1k, 16k} only")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4,
                    help="timing rounds per row, the implementations' order reversed every round (1: specjax "
                         "first, as the tables up to v14)")
    ap.add_argument("--tag", default="", help="suffix of the result files' names")
    ap.add_argument("--variants", action="store_true",
                    help="also time both fixed variants: one CTA per tile (specjax_grid) and the persistent "
                         "grid (specjax_persistent), at the untuned base blocks; specjax is default_config's "
                         "pick (TUNED); and specjax_overlap: default_config's schedule with intra-warpgroup "
                         "overlap")
    ap.add_argument("--fp8", action="store_true",
                    help="float8_e4m3fn rows (the FP8 forward) instead of bf16 / fp16, cuDNN and the bf16 kernel "
                         "on the same values beside")
    ap.add_argument("--num-ctas", type=int, default=None,
                    help="persistent grid size (default: the device's SM count, else 132)")
    ap.add_argument("--sustained", type=float, default=None, metavar="SECONDS",
                    help="time each implementation by the wall clock over SECONDS of back-to-back calls per round, "
                         "after --warm seconds untimed (the clock the power cap holds), instead of CUPTI bursts; "
                         "specjax and cudnn only")
    ap.add_argument("--warm", type=float, default=0.5, help="untimed seconds before each --sustained window")
    ap.add_argument("--dtypes", default="bfloat16,float16", help="the 16-bit rows' dtypes, comma-separated")
    ap.add_argument("--rows", default=None, metavar="HD:S:c|n,...",
                    help="only these rows of the table (head dim, keys, c causal / n not), e.g. 256:4096:c,128:16384:n")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds takes a count >= 1 (timing rounds per row); got {args.rounds}")
    if args.sustained is not None and (args.sustained <= 0 or args.warm < 0 or args.variants or args.fp8):
        ap.error(f"--sustained takes seconds > 0 and --warm >= 0, without --variants or --fp8; got "
                 f"{args.sustained}, {args.warm}, variants={args.variants}, fp8={args.fp8}")
    dtypes = [d.strip() for d in args.dtypes.split(",")]
    if not dtypes or any(d not in ("bfloat16", "float16") for d in dtypes):
        ap.error(f"--dtypes takes bfloat16 and / or float16, comma-separated; got {args.dtypes!r}")
    try:
        only = parse_rows(args.rows)
    except ValueError as e:
        ap.error(str(e))
    seqs = (1024, 16384) if args.quick else (512, 1024, 2048, 4096, 8192, 16384)
    hds = (128,) if args.quick else (64, 128, 256)
    outside = [r for r in only or () if r[0] not in hds or r[1] not in seqs]
    if outside:
        ap.error(f"--rows names rows outside the table chosen (S 512-16384 in powers of two; --quick: hd 128, S 1k "
                 f"and 16k only): {', '.join(f'{hd}:{S}:{'c' if c else 'n'}' for hd, S, c in outside)}")
    dev = jax.devices()[0]
    if dev.platform != "gpu":
        sys.exit(f"bench_fa3.py times CUDA kernels and needs a GPU; JAX runs on {dev.platform}: "
                 "nothing measured")
    ctas = (args.num_ctas or getattr(dev, "core_count", None) or 132) if args.variants else None
    grid = [(S, hd, c, dt) for dt in ((F8,) if args.fp8 else [jnp.dtype(d).type for d in dtypes]) for hd in hds
            for c in (False, True) for S in seqs if only is None or (hd, S, c) in only]
    key = jax.random.key(0)
    jobs = []
    for S, hd, causal, dtype in grid:
        shape, impls = _impls(S, hd, causal, dtype, ctas)
        key, *ks = jax.random.split(key, 4)
        qkv = [jax.random.normal(kk, shape, jnp.bfloat16 if dtype == F8 else dtype) for kk in ks]
        if dtype == F8:  # e4m3 values; the bfloat16 implementations get the same values
            q8 = [x.astype(F8) for x in qkv]
            q16 = [x.astype(jnp.bfloat16) for x in q8]
            qkv = {n: q16 if n in ("cudnn", "specjax_bf16") else q8 for n in impls}
        jobs.append(((S, hd, causal, dtype), shape, impls, qkv))
    with cf.ThreadPoolExecutor(8) as pool:  # compile everything in parallel first
        list(pool.map(lambda j: [_try_compile(f, _args_for(j[3], n)) for n, f in j[2].items()], jobs))
    rows = []
    columns = [n for n in IMPLS if (ctas or n not in VARIANTS) and (args.fp8 or n != "specjax_bf16")]
    measure, sampler = _measure, None
    if args.sustained:
        columns = ["specjax", "cudnn"]
        spans = []
        measure = lambda fn, a, _iters: sustained_ms(fn, a, args.sustained, args.warm, spans)
        from fa3_power_probe import Sampler, window_stats   # not at the top: it imports this module
        sampler = Sampler()
    for (S, hd, causal, dtype), (B, _, H, _), impls, qkv in jobs:
        flops = 4 * B * S * S * H * hd / (2 if causal else 1)
        row = {"S": S, "hd": hd, "causal": causal, "dtype": jnp.dtype(dtype).name}
        timed = measure_row({n: impls[n] for n in columns if n in impls}, qkv, args.iters, args.rounds, measure)
        for name in columns:
            ms = timed.get(name)
            row[f"{name}_tflops"] = None if not ms else round(flops / statistics.median(ms) / 1e9, 1)
            if args.rounds > 1:  # even rounds: specjax timed first in the row, odd ones: last
                row[f"{name}_tflops_rounds"] = None if not ms else [round(flops / t / 1e9, 1) for t in ms]
        if sampler:  # the SM clock, power and clock-event reasons over each implementation's timed windows
            samples = sampler.samples()
            for name in columns:
                st = [window_stats(samples, t0, t1, skip=0.0) for fn, t0, t1 in spans if fn is impls.get(name)]
                st = [x for x in st if x]
                if st:
                    row[f"{name}_mhz"] = round(statistics.mean(x["mhz"] for x in st))
                    row[f"{name}_watts"] = round(statistics.mean(x["watts"] for x in st))
                    row[f"{name}_clock_events"] = hex(functools.reduce(lambda m, x: m | x["throttle"], st, 0))
            spans.clear()
        print(row, flush=True)
        rows.append(row)
        _write(rows, dev, args.out, " ".join(["python3", *sys.argv]), quiet=len(rows) < len(jobs),
               persistent_ctas=ctas, tag=args.tag, rounds=args.rounds,
               sustained=None if not args.sustained else (args.sustained, args.warm), planned=len(jobs))
    if sampler:
        sampler.stop()


def parse_rows(text: str | None) -> list[tuple[int, int, bool]] | None:
    """``--rows``' "HD:S:c|n,..." (this table's and ``fa3_power_probe``'s) as [(hd, S, causal)] in the order
    given, each once; None: every row."""
    if text is None:
        return None
    rows = []
    for item in text.split(","):
        m = re.fullmatch(r"(64|128|256):([1-9][0-9]*):([cn])", item.strip())
        if not m:
            raise ValueError(f"--rows takes HD:S:c|n items (HD 64/128/256, S keys, c causal, n not), "
                             f"comma-separated; got {item!r}")
        row = (int(m[1]), int(m[2]), m[3] == "c")
        rows += [row] if row not in rows else []
    return rows


def _try_compile(fn, args):
    try:
        fn.lower(*args).compile()
    except Exception:
        pass


def _write(rows, dev, out_dir, command, quiet=False, persistent_ctas=None, tag="", rounds=1, sustained=None,
           planned=None) -> None:
    """Rewrites the JSON and markdown table (after every row, so a cut-off run keeps its rows; ``planned``: the
    rows the run set out to time, so a cut-off table says so)."""
    name = device_name().lower()
    date = datetime.date.today().isoformat()
    doc = {"device": dev.device_kind, "jax": jax.__version__, "date": date, "command": command,
           "persistent_num_ctas": persistent_ctas, "timing_rounds": rounds, "rows_planned": planned, "rows": rows}
    if sustained:
        doc["measure"] = (f"sustained: per round, {sustained[1]} s of back-to-back calls untimed, then "
                          f"{sustained[0]} s timed by the wall clock; *_mhz / *_watts / *_clock_events: nvidia-smi "
                          "over the timed windows")
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, f"fa3_{name}_{date}{tag}")
    fmt = lambda x: "-" if x is None else f"{x:.0f}"
    ratio = lambda a, b: "-" if not (a and b) else f"{a / b:.2f}"
    var = persistent_ctas is not None
    md = ["| dtype | hd | causal | S | specjax | k_end array |" + (" grid | persistent | overlap |" if var else "")
          + " cuDNN | attention_mgpu | specjax/cuDNN | k_end array/cuDNN |" + (" overlap/cuDNN |" if var else ""),
          "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if var else "")]
    for r in rows:
        extra = "".join(f"{fmt(r.get(f'{n}_tflops'))} | " for n in VARIANTS) if var else ""
        ov = f" {ratio(r.get('specjax_overlap_tflops'), r['cudnn_tflops'])} |" if var else ""
        md.append(f"| {r['dtype']} | {r['hd']} | {r['causal']} | {r['S']} | {fmt(r['specjax_tflops'])} | "
                  f"{fmt(r.get('specjax_kend_tflops'))} | " + extra
                  + f"{fmt(r['cudnn_tflops'])} | {fmt(r.get('jax_mgpu_tflops'))} | "
                  f"{ratio(r['specjax_tflops'], r['cudnn_tflops'])} | "
                  f"{ratio(r.get('specjax_kend_tflops'), r['cudnn_tflops'])} |" + ov)
    if any(r["dtype"] == "float8_e4m3fn" for r in rows):  # --fp8: the bf16 kernel beside, no attention_mgpu
        md = ["| dtype | hd | causal | S | specjax FP8 | k_end array | specjax bf16 | cuDNN bf16 | FP8/cuDNN | "
              "FP8/specjax bf16 |", "|---|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['dtype']} | {r['hd']} | {r['causal']} | {r['S']} | {fmt(r['specjax_tflops'])} | "
               f"{fmt(r.get('specjax_kend_tflops'))} | {fmt(r.get('specjax_bf16_tflops'))} | {fmt(r['cudnn_tflops'])} | "
               f"{ratio(r['specjax_tflops'], r['cudnn_tflops'])} | "
               f"{ratio(r['specjax_tflops'], r.get('specjax_bf16_tflops'))} |" for r in rows]
    if sustained:  # the clock and power each implementation ran at
        mw = lambda r, n: "-" if r.get(f"{n}_mhz") is None else f"{r[f'{n}_mhz']} / {r[f'{n}_watts']}"
        ratio3 = lambda a, b: "-" if not (a and b) else f"{a / b:.3f}"
        events = lambda r: " ".join(sorted({r.get(f"{n}_clock_events") for n in IMPLS} - {None}))
        md = ["| dtype | hd | causal | S | specjax | cuDNN | specjax/cuDNN | specjax MHz / W | cuDNN MHz / W | "
              "clock events |", "|---|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['dtype']} | {r['hd']} | {r['causal']} | {r['S']} | {fmt(r['specjax_tflops'])} | "
               f"{fmt(r['cudnn_tflops'])} | {ratio3(r['specjax_tflops'], r['cudnn_tflops'])} | {mw(r, 'specjax')} | "
               f"{mw(r, 'cudnn')} | {events(r)} |" for r in rows]
    measure = (f"sustained {sustained[0]} s windows after {sustained[1]} s untimed, median of {rounds} rounds"
               if sustained else f"median of {rounds} timing rounds")
    if planned and len(rows) < planned:
        measure += f"; {len(rows)} of {planned} rows, the run cut off or still going"
    for path, text in ((base + ".json", json.dumps(doc, indent=1)),
                       (base + ".md", f"{dev.device_kind}, jax {jax.__version__}, {date}, TFLOPS "
                        f"({measure})\n\n"
                        + "\n".join(md) + "\n")):
        atomic_write_text(path, text)
    if not quiet:
        print("\n".join(md))


if __name__ == "__main__":
    main()
