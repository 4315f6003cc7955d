"""GPU probe: the decode/verify attention call (``rope_attention_write``: split kernel + combine kernel) of
this checkout against another version of ``pallas_kernels/decode_attention.py`` (``--old PATH``, e.g.
``git show REV:pallas_kernels/decode_attention.py > /tmp/old.py``), in one process, alternating which runs
first. Median CUPTI time of the whole call (all its kernels), and whether the two give the same bits.

    python3 benchmarks/combine_probe.py --old /tmp/old.py [--kernels]

``--kernels`` instead traces 20 calls per case (SmolLM2 shape, B=1, S=1024, T = 1, 8, 32; the old file, and this
one at block_m 16 / 32 / 64) and lists each kernel's mean duration per call (perfetto trace). ``--variants 16x8,8x8``
traces this file's kernels the same way with ``COMBINE_ROWS`` x ``SPLITS_PER_STEP`` set to each pair (no ``--old``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import itertools
import sys

import jax
import numpy as np

from pallas_kernels import decode_attention as new


def _load(path: str):
    spec = importlib.util.spec_from_file_location("old_decode_attention", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> None:
    from jax.experimental.mosaic.gpu import profiler
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="path of the decode_attention.py to compare against (not with --variants)")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kernels", action="store_true", help="per-kernel durations from a trace (see above)")
    ap.add_argument("--variants", default="", help="COMBINE_ROWSxSPLITS_PER_STEP pairs, e.g. 16x8,8x8 (see above)")
    a = ap.parse_args(argv)
    if a.variants:
        return variants([tuple(map(int, v.split("x"))) for v in a.variants.split(",")])
    if not a.old:
        ap.error("--old PATH is needed (the file to compare against), except with --variants")
    old = _load(a.old)
    if a.kernels:
        return kernels(old)

    def us(f, *args):
        _, ms = profiler.measure(f, iterations=a.iterations)(*args)
        return 1000 * float(np.median(ms))

    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {datetime.date.today()}: "
          f"python3 benchmarks/combine_probe.py --old {a.old} --iterations {a.iterations} --rounds {a.rounds}")
    print("| model | B | T | S | splits | old us (per round) | new us (per round) | old / new | same bits |")
    print("|---|---|---|---|---|---|---|---|---|")
    shapes = {"smollm2": (9, 3, 64), "llama3-8b": (32, 8, 128)}
    for (name, (H, G, d)), B, T, S in itertools.chain(
            itertools.product([("smollm2", shapes["smollm2"])], (1,), (1, 8, 16, 32), (512, 1024, 2048)),
            itertools.product([("llama3-8b", shapes["llama3-8b"])], (1,), (1, 8), (1024,)),
            itertools.product([("smollm2", shapes["smollm2"])], (8,), (1, 8), (1024,))):
        args = new._bench_inputs(B, T, H, G, d, S)
        cfg = new.default_config(B, G, H // G, d)
        splits = new.split_geometry(S, cfg)[0]
        f_new = jax.jit(functools.partial(new.rope_attention_write, n_heads=H, config=cfg))
        f_old = jax.jit(functools.partial(old.rope_attention_write, n_heads=H,
                                          config=old.TuningConfig(**vars(cfg))))
        same = all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(f_new(*args), f_old(*args)))
        t_old, t_new = [], []
        for r in range(a.rounds):
            pair = [(f_old, t_old), (f_new, t_new)]
            for f, acc in (pair if r % 2 == 0 else pair[::-1]):
                acc.append(us(f, *args))
        mo, mn = np.median(t_old), np.median(t_new)
        print(f"| {name} | {B} | {T} | {S} | {splits} | " + " / ".join(f"{t:.1f}" for t in t_old) + " | "
              + " / ".join(f"{t:.1f}" for t in t_new) + f" | {mo / mn:.2f}x | {same} |", flush=True)


def kernels(old) -> None:
    import dataclasses
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {datetime.date.today()}: "
          f"python3 benchmarks/combine_probe.py --old ... --kernels (SmolLM2 shape, B=1, S=1024; mean us per call)")
    print("| version | block_m | T | kernel | us per call |\n|---|---|---|---|---|")
    H, G, d, S, n = 9, 3, 64, 1024, 20
    for T in (1, 8, 32):
        args = new._bench_inputs(1, T, H, G, d, S)
        cfg = new.default_config(1, G, H // G, d)
        cases = [("old", old, old.TuningConfig(**vars(cfg)))] + [
            ("new", new, dataclasses.replace(cfg, block_m=bm)) for bm in (16, 32, 64)]
        for label, mod, c in cases:
            us = _kernel_us(jax.jit(functools.partial(mod.rope_attention_write, n_heads=H, config=c)), args, n)
            for name, t in sorted(us.items(), key=lambda x: -x[1]):
                print(f"| {label} | {c.block_m} | {T} | {name[:60]} | {t:.2f} |", flush=True)


def _kernel_us(f, args, n=20) -> dict:
    """Mean GPU microseconds per call of ``f(*args)`` by kernel name (numeric suffixes dropped), from a trace."""
    import profile_decode
    jax.block_until_ready(f(*args))
    _, events = profile_decode.gpu_events(lambda: [jax.block_until_ready(f(*args)) for _ in range(n)])
    return profile_decode.us_by_kind(events, n)


def variants(pairs) -> None:
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {datetime.date.today()}: python3 "
          f"benchmarks/combine_probe.py --variants {','.join(f'{r}x{k}' for r, k in pairs)} (SmolLM2 shape, B=1, "
          f"S=1024; mean us per call over 20 traced calls)")
    print("| COMBINE_ROWS x SPLITS_PER_STEP | T | combine us | split kernel us | same bits as the first |\n"
          "|---|---|---|---|---|")
    H, G, d, S = 9, 3, 64, 1024
    for T in (1, 8, 32):
        args = new._bench_inputs(1, T, H, G, d, S)
        cfg = new.default_config(1, G, H // G, d)
        first = None
        for rows, per_step in pairs:
            new.COMBINE_ROWS, new.SPLITS_PER_STEP = rows, per_step
            jax.clear_caches()
            f = jax.jit(functools.partial(new.rope_attention_write, n_heads=H, config=cfg))
            out = [np.asarray(x) for x in f(*args)]
            first = out if first is None else first
            us = _kernel_us(f, args)
            same = all(np.array_equal(x, y) for x, y in zip(out, first))
            print(f"| {rows} x {per_step} | {T} | {us['decode_attention_combine']:.2f} | "
                  f"{us['decode_attention']:.2f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
