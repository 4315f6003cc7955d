"""CPU check: is this tree's FA3 forward the same kernel as another revision's? Lowers every ``TUNED``
config (static masks, the table's shapes), every ``fp8_config`` pick (float8, static masks), the ``k_end``-array
picks (``mask_array=True``) at each ``TUNED`` row, three ``k_end``-array shapes (regular, and interpretable at
hd 64 / 128) and the forms no pick uses (spare Q, O in Q's SMEM, balanced + prefetch, overlap + lazy rescale) on
an odd GQA shape, with both modules for CUDA on this host, and compares the Mosaic GPU modules as MLIR text,
locations and Mosaic's per-kernel dump counter stripped. Equal text means equal kernels: a change that leaves
them equal needs no new GPU run for those configs.

    git show REV:pallas_kernels/flash_attention.py > /tmp/fa_rev.py
    PYTHONPATH=.:tests python3 benchmarks/fa3_lowering_diff.py /tmp/fa_rev.py
"""
import dataclasses
import importlib.util
import re
import sys

import jax
import jax.numpy as jnp

from pallas_kernels import flash_attention as new
from test_flash_attention import _mosaic_gpu_text


def _strip(text: str) -> str:
    text = re.sub(r"\s*loc\((?:[^()]|\([^()]*\))*\)", "", text)
    return re.sub(r'dump_basename = "[A-Za-z0-9_]*_[0-9]+"', "", text)  # Mosaic's per-kernel dump counter


# Forms no ``TUNED`` row picks, lowered on an odd GQA shape (B, T, H, S, G, d) with a k_end array.
FORMS = {"spare_q": dict(block_kv=64, persistent=True, spare_q=True), "o_tiles0": dict(block_kv=64, persistent=True,
         o_tiles=0), "balanced_prefetch": dict(block_kv=128, persistent=True, balanced=True, prefetch=True),
         "overlap_lazy": dict(block_kv=64, persistent=True, overlap=True, lazy_rescale=True)}
ODD = (2, 77, 6, 301, 2, 128)


def _lowered(m, hd, S, causal, form, interpretable=False) -> str:
    """``form``: "static", "kend" (``default_config``), "kend_array" (``mask_array=True``), "fp8" (static), or a
    ``FORMS`` name (``ODD``'s shape, hd and S unused)."""
    B, T, H, S_, G, d = ODD if form in FORMS else (max(16384 // S, 1), S, 2048 // hd, S, 2048 // hd, hd)
    dtype = jnp.float8_e4m3fn if form == "fp8" else jnp.bfloat16
    q, k = jax.ShapeDtypeStruct((B, T, H, d), dtype), jax.ShapeDtypeStruct((B, S_, G, d), dtype)
    cfg = (m.TuningConfig(**FORMS[form]) if form in FORMS else m.fp8_config(hd, S, causal) if form == "fp8"
           else m.default_config(hd, S, causal, mask_array=form == "kend_array"))
    if interpretable:
        cfg = dataclasses.replace(cfg, interpretable=True, overlap=False)
    mask = "top_left" if causal else "none"
    if form in ("static", "fp8"):
        f = lambda q, k, v: m.flash_attention_fwd(q, k, v, causal=mask, config=cfg)
    else:
        f = lambda q, k, v: m.flash_attention_fwd(q, k, v, m.key_end(B, T, S_, causal=mask), config=cfg)
    return _strip(_mosaic_gpu_text(jax.jit(f).trace(q, k, k).lower(lowering_platforms=("cuda",))))


def main(path: str) -> int:
    spec = importlib.util.spec_from_file_location("_fa_rev", path)
    rev = sys.modules["_fa_rev"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rev)
    cases = [(hd, min(longest or 16384, 16384), causal, "static", False)
             for (hd, causal), rows in new.TUNED.items() for longest, _, _ in rows]
    cases += [(hd, S, c, form, False) for hd, S, c, _, _ in cases[:] for form in ("kend_array", "fp8")]
    cases += [(hd, S, c, "kend", i) for hd, S, c in ((128, 1000, False), (64, 300, True), (256, 77, False))
              for i in ((False, True) if hd < 256 else (False,))]  # hd 256's interpretable P tile: no room
    cases += [(0, 0, c, form, False) for form in FORMS for c in (False, True)]
    differ = 0
    for case in cases:
        same = _lowered(rev, *case) == _lowered(new, *case)
        differ += not same
        print("hd {} S {} causal {} {} interpretable {}:".format(*case), "same" if same else "DIFFERENT", flush=True)
    print(f"{len(cases) - differ} of {len(cases)} kernels identical")
    return int(differ > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
