"""CPU check: is this tree's FA3 forward the same kernel as another revision's? Lowers every ``TUNED``
config (static masks, the table's shapes) and three ``k_end``-array shapes (regular, and
interpretable at hd 64 / 128) with both modules for CUDA on this host and compares the Mosaic GPU modules as MLIR
text, locations and Mosaic's per-kernel dump counter stripped. Equal text means equal kernels: a
change that leaves them equal needs no new GPU run for those configs.

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
    return re.sub(r'dump_basename = "entry_[0-9]+"', "", text)


def _lowered(m, hd, S, causal, form, interpretable=False) -> str:
    B, H = max(16384 // S, 1), 2048 // hd
    q = jax.ShapeDtypeStruct((B, S, H, hd), jnp.bfloat16)
    cfg = m.default_config(hd, S, causal)
    if interpretable:
        cfg = dataclasses.replace(cfg, interpretable=True, overlap=False)
    mask = "top_left" if causal else "none"
    if form == "static":
        f = lambda q, k, v: m.flash_attention_fwd(q, k, v, causal=mask, config=cfg)
    else:
        f = lambda q, k, v: m.flash_attention_fwd(q, k, v, m.key_end(B, S, S, causal=mask), config=cfg)
    return _strip(_mosaic_gpu_text(jax.jit(f).trace(q, q, q).lower(lowering_platforms=("cuda",))))


def main(path: str) -> int:
    spec = importlib.util.spec_from_file_location("_fa_rev", path)
    rev = sys.modules["_fa_rev"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rev)
    cases = [(hd, min(longest or 16384, 16384), causal, "static", False)
             for (hd, causal), rows in new.TUNED.items() for longest, _, _ in rows]
    cases += [(hd, S, c, "kend", i) for hd, S, c in ((128, 1000, False), (64, 300, True), (256, 77, False))
              for i in ((False, True) if hd < 256 else (False,))]  # hd 256's interpretable P tile: no room
    differ = 0
    for case in cases:
        same = _lowered(rev, *case) == _lowered(new, *case)
        differ += not same
        print("hd {} S {} causal {} {} interpretable {}:".format(*case), "same" if same else "DIFFERENT", flush=True)
    print(f"{len(cases) - differ} of {len(cases)} kernels identical")
    return int(differ > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
