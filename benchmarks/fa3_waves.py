"""CPU analysis: how evenly the FA3 table's work items fill the GPU's SMs (wave quantization), per row.

Each row (the FA3 paper's shapes: B*S = 16k tokens, H*hd = 2048) runs ``default_config(hd, S, causal)``. A work
item is one q tile of one (batch, head), ``cfg.rows`` query rows; its cost is its KV steps (``_kv_steps`` of the
static mask's tile bounds) plus ``--item-cost`` steps of fixed work (Q load, ramp, O store). Items go to SMs as
the kernel deals them:
  * persistent: CTA c takes items c, c + C, ... of ``_item_tile``'s order, or of ``_balanced_order``'s;
  * grid (one CTA per tile, one CTA per SM fits): each CTA, in launch order, goes to the SM that frees first.
    The launch order assumed is the grid's first axis fastest (heads, then batch, then q tiles, the q tile index
    reversed in the kernel, so the longest causal tiles go first).
Per row it prints the items, the waves (items / SMs), and ``busiest``: the busiest SM's cost over the mean, which
is 1.0 when the work divides evenly. ``1 - 1 / busiest`` is what the row loses to SMs idling at the end, the most
that splitting items along the keys to fill the last wave (stream-K, as CUTLASS does for GEMMs) could win back
before that split's own cost. Nothing is timed: the costs are counts. A stream-K over the last round
(``split_tail``, built, measured slower on an H100 and removed; pallas_kernels/NOTES.md v25 and the removal there)
recovered less than this count: the split kernel alone was level at hd 128 1-2k non-causal where the count
predicted +1.3-2.1 %, and lost 7-12 % at hd 256 with one K/V stage.

    PYTHONPATH=. python3 benchmarks/fa3_waves.py [--sms 132] [--item-cost 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import heapq
import math
import os

import jax
import numpy as np

from pallas_kernels.flash_attention import _balanced_order, _item_steps, default_config, key_end, padded_key_ends

SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def item_costs(hd: int, S: int, causal: bool, item_cost: float):
    """``(cfg, cost of each item in the kernel's base order, the tiles' largest k_end [B, n_tiles], H)`` for
    one row of the table."""
    cfg = default_config(hd, S, causal)
    B, H, rows = 16384 // S, 2048 // hd, cfg.rows
    kmax = np.asarray(padded_key_ends(key_end(B, S, S, causal="top_left" if causal else "none"), S, S, rows)[2])
    steps = np.asarray(_item_steps(kmax, cfg.block_kv, -(-S // cfg.block_kv), H))
    return cfg, steps + item_cost, kmax, H


def sm_loads(hd: int, S: int, causal: bool, sms: int, item_cost: float):
    """Each SM's total cost as the row's config deals its items: ``(n_items, loads [sms])``."""
    cfg, cost, kmax, H = item_costs(hd, S, causal, item_cost)
    (B, n_tiles), n = kmax.shape, cost.shape[0]
    load = np.zeros(sms)
    if cfg.persistent:
        ctas = min(sms, n)
        order = (np.asarray(_balanced_order(kmax, cfg, -(-S // cfg.block_kv), H, ctas)) if cfg.balanced
                 else np.arange(n))
        load[:ctas] = [cost[order[c::ctas]].sum() for c in range(ctas)]
        return n, load
    # grid: launch order heads fastest, then batch, then the q tile axis (whose index the kernel reverses)
    free = [(0.0, s) for s in range(sms)]
    for t in range(n_tiles):
        for b in range(B):
            for h in range(H):
                qi, bh = n_tiles - 1 - t, b * H + h
                i = bh * n_tiles + (n_tiles - 1 - qi if bh % 2 == 0 else qi)  # inverse of _item_tile
                start, s = heapq.heappop(free)
                load[s] = start + cost[i]
                heapq.heappush(free, (load[s], s))
    return n, load


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132, help="SMs (H100 SXM and H200: 132)")
    ap.add_argument("--item-cost", type=float, default=2.0, help="fixed cost of an item, in KV steps")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    a = ap.parse_args(argv)
    lines = [f"# FA3 table rows: items per SM and the busiest SM's work over the mean ({a.sms} SMs, item cost = "
             f"KV steps + {a.item_cost:g}; jax {jax.__version__}; command: python3 benchmarks/fa3_waves.py "
             f"--sms {a.sms} --item-cost {a.item_cost:g})",
             "| hd | S | mask | config | items | waves | busiest / mean | lost to the last wave |",
             "|---|---|---|---|---|---|---|---|"]
    lost = []
    for hd in (64, 128, 256):
        for causal in (False, True):
            for S in SEQS:
                cfg = default_config(hd, S, causal)
                n, load = sm_loads(hd, S, causal, a.sms, a.item_cost)
                waves, b = n / a.sms, float(load.max() / load.mean())
                lost.append(1 - 1 / b)
                sched = "balanced" if cfg.balanced else "persistent" if cfg.persistent else "grid"
                lines.append(f"| {hd} | {S} | {'causal' if causal else 'none'} | {cfg.block_kv}-key {sched}, "
                             f"{cfg.rows} rows | {n} | {waves:.2f} | {b:.3f} | {100 * (1 - 1 / b):.1f} % |")
    lines.append(f"mean loss over the 36 rows: {100 * np.mean(lost):.2f} %; "
                 f"geomean of busiest / mean: {math.exp(-np.mean(np.log(1 - np.array(lost)))):.4f}")
    print("\n".join(lines))
    if a.out:   # written whole, then renamed: never a half-written results file
        with open(a.out + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
