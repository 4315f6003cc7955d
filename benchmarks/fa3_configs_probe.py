"""Probe (GPU): forward TFLOPS of named FA3 configs on chosen rows of the FA3 table, for this tree's
kernel and, if ``benchmarks/_fa_head.py`` exists (gitignored; another revision or a patched copy,
carried to the device), for that one too, all in one process, with cuDNN per row and each output's
largest difference from cuDNN's.

    git show HEAD:pallas_kernels/flash_attention.py > benchmarks/_fa_head.py   # optional
    PYTHONPATH=. python3 benchmarks/fa3_configs_probe.py ROWS CONFIGS [--iters 20] [--new-only] [--mask kend]

ROWS: ``hd:S:c|n`` (causal or not) separated by commas, e.g. ``128:8192:n,256:4096:c``; CONFIGS:
``tune_fa3.label`` strings separated by commas, e.g. ``128/2/G+O,192/2/G,64/2/P+O/o0``; ``default``
is each row's ``default_config``, ``default/f1`` (any label suffixes) that config with those fields.
Configs that do not fit a row's head dim are skipped. ``--dtype float8_e4m3fn``: the kernel on the
row's inputs cast to e4m3 (``default``: ``fp8_config``), cuDNN on the same values in bfloat16.
"""
import argparse
import dataclasses
import importlib.util
import os
import statistics
import sys

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

sys.path.insert(0, os.path.dirname(__file__))
from pallas_kernels import flash_attention as new  # noqa: E402
from tune_fa3 import label_fields, parse_label  # noqa: E402


def _modules(new_only: bool):
    mods = [("new", new)]
    path = os.path.join(os.path.dirname(__file__), "_fa_head.py")
    if os.path.exists(path) and not new_only:
        spec = importlib.util.spec_from_file_location("_fa_head", path)
        head = sys.modules["_fa_head"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(head)
        mods.append(("head", head))
    return mods


def row_inputs(row: str, key_end, dtype=jnp.bfloat16):
    """``hd:S:c|n`` -> ``(hd, S, causal, (q, k, v), k_end, flops)``: inputs of the FA3 table's shape
    (B*S = 16k, H*hd = 2048; bf16 normals cast to ``dtype``) and the row's FLOPs (halved when causal)."""
    hd, S, c = row.split(":")
    hd, S, causal = int(hd), int(S), c == "c"
    B, H = 16384 // S, 2048 // hd
    qkv = tuple(jax.random.normal(x, (B, S, H, hd), jnp.bfloat16).astype(dtype)
                for x in jax.random.split(jax.random.key(0), 3))
    kend = key_end(B, S, S, causal="top_left" if causal else "none")
    return hd, S, causal, qkv, kend, 4 * B * S * S * H * hd / (2 if causal else 1)


def set_registers(module, text: str | None) -> None:
    """``--regs C,P``: setmaxnreg of (consumer, producer) warpgroups with 2 consumers for ``module``'s
    kernel (traced later, so it reads the patched table); None: leave its ``_REGISTERS``."""
    if text:
        module._REGISTERS = {**module._REGISTERS, 2: tuple(int(x) for x in text.split(","))}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("configs")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--new-only", action="store_true", help="skip _fa_head.py even if it exists")
    ap.add_argument("--any-overlap-block", action="store_true",
                    help="lift max_overlap_block_kv's register estimate (ptxas then says what spills)")
    ap.add_argument("--head-first", action="store_true",
                    help="time _fa_head.py's configs before this tree's in each row (order bias check)")
    ap.add_argument("--mask", default="static", choices=("static", "kend"),
                    help="static: flash_attention_fwd(..., causal=...), as bench_fa3.py's specjax column; "
                         "kend: the mask as a k_end array (the specjax_kend column)")
    ap.add_argument("--regs", default=None,
                    help="setmaxnreg of (consumer, producer) warpgroups with 2 consumers, e.g. 240,24 "
                         "(this tree's kernel; default: its _REGISTERS)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float8_e4m3fn"),
                    help="the kernel's input dtype (cuDNN runs bfloat16 either way)")
    a = ap.parse_args(argv)
    fp8 = a.dtype == "float8_e4m3fn"
    set_registers(new, a.regs)
    if a.any_overlap_block:
        new.max_overlap_block_kv = lambda head_dim, consumers=2: 256
    dev = jax.devices()[0]
    sms = getattr(dev, "core_count", None) or 132
    print(dev.device_kind, jax.__version__, "command:", " ".join(["python3", *sys.argv]), flush=True)
    mods = _modules(a.new_only)[::-1] if a.head_first else _modules(a.new_only)
    for row in a.rows.split(","):
        hd, S, causal, (q, k, v), kend, flops = row_inputs(row, new.key_end, jnp.dtype(a.dtype))
        runs = {"cudnn": jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
            *(x.astype(jnp.bfloat16) for x in (q, k, v)), is_causal=causal, implementation="cudnn"))}
        for mname, m in mods:
            for lab in a.configs.split(","):
                try:
                    if lab.split("/")[0] == "default":
                        base = m.fp8_config(hd, S, causal) if fp8 else m.default_config(hd, S, causal)
                        cfg = dataclasses.replace(base, **label_fields(lab.split("/")[1:], lab))
                    else:
                        cfg = parse_label(lab, sms, m.TuningConfig)
                    cfg.check_head_dim(hd, jnp.dtype(a.dtype).itemsize)
                except (ValueError, TypeError) as e:
                    print(f"  skip {mname} {lab} at hd{hd}: {str(e)[:120]}")
                    continue
                mask = dict(causal="top_left" if causal else "none") if a.mask == "static" else dict(kend_BT=kend)
                name = f"{mname} {lab}"
                while name in runs:  # a config listed again is timed again, under name' (order-bias checks)
                    name += "'"
                runs[name] = jax.jit(
                    lambda q, k, v, c=cfg, m=m, mask=mask: m.flash_attention_fwd(q, k, v, **mask, config=c)[0])
        ref = None
        for name, f in runs.items():
            try:
                o = f(q, k, v).block_until_ready().astype(jnp.float32)
                ref = o if ref is None else ref
                _, t = profiler.measure(f, iterations=a.iters)(q, k, v)
                print(f"hd{hd} S{S} causal={causal} {name}: {flops / statistics.median(t) / 1e9:.0f} TFLOPS, "
                      f"max|o - cuDNN's| {float(jnp.max(jnp.abs(o - ref))):.3g}", flush=True)
            except Exception as e:
                print(f"hd{hd} S{S} causal={causal} {name}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
