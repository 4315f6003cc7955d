"""Shared benchmark plumbing: device facts, timing, and atomic JSON + markdown results."""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax.files import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def device_name() -> str:
    kind = jax.devices()[0].device_kind
    for short in ("H200", "H100"):
        if short in kind:
            return short
    return kind.replace(" ", "_")


def header() -> dict:
    return {"device": device_name(), "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
            "date": datetime.date.today().isoformat(), "command": " ".join([Path(sys.executable).name] + sys.argv)}


def median_seconds(fn, repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(gib: float = 4.0) -> dict:
    """HBM bandwidth in bytes/s, measured three ways on a random bf16 array of ``gib`` GiB:
    copy (x * 2: read + write), read (a sum: read only) and their max, the roofline's denominator."""
    n = int(gib * 2**30) // 2
    x = jax.random.normal(jax.random.key(0), (n,), jnp.bfloat16)
    scale = jax.jit(lambda x: x * 2)
    total = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))
    copy = 2 * n * 2 / median_seconds(lambda: scale(x), repeats=20, warmup=3)
    read = n * 2 / median_seconds(lambda: total(x), repeats=20, warmup=3)
    return {"copy": copy, "read": read, "best": max(copy, read)}


def compute_suffix(compute_dtype: str) -> str:
    """Results-file suffix naming the matmul operand mode (``ModelConfig.compute_dtype``)."""
    return "" if compute_dtype == "param" else "_f32compute"


def write_results(name: str, payload: dict, table_md: str) -> Path:
    """Write results/<name>.json and .md atomically (never a half-written file)."""
    for suffix, text in ((".json", json.dumps(payload, indent=1)), (".md", table_md)):
        atomic_write_text(RESULTS / f"{name}{suffix}", text)
    out = os.environ.get("OUT")
    if out:  # on the device machine, also hand the files back
        for suffix in (".json", ".md"):
            (Path(out) / f"{name}{suffix}").write_text((RESULTS / f"{name}{suffix}").read_text())
    return RESULTS / f"{name}.json"


def relative_differences(got, want) -> str:
    """Each array's largest difference from its counterpart, relative to that one's largest value, joined by " / "."""
    f32 = lambda x: x.astype(jnp.float32)
    return " / ".join(f"{float(jnp.max(jnp.abs(f32(x) - f32(y))) / jnp.max(jnp.abs(f32(y)))):.2e}"
                      for x, y in zip(got, want))


def backward_inputs(S: int, d: int, causal: bool):
    """The backward probes' inputs at one row of the FA3 table (B x S = 16k tokens, H x d = 2048, bf16): ``(args,
    kend)`` with ``args = (q, k, v, o, lse, do)``, o and lse from the forward's default config."""
    from pallas_kernels.flash_attention import default_config, flash_attention_fwd, key_end
    B, H = 16384 // S, 2048 // d
    q, k, v, do = (jax.random.normal(kk, (B, S, H, d), jnp.bfloat16) for kk in jax.random.split(jax.random.key(0), 4))
    kend = key_end(B, S, S, causal="top_left" if causal else "none")
    o, lse = flash_attention_fwd(q, k, v, kend, config=default_config(d, S, causal))
    return (q, k, v, o, lse, do), kend


def md_table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"
