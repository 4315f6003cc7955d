"""FlashAttention-3 forward for Hopper (sm90) in Pallas Mosaic GPU, with a custom_vjp backward.

One CTA owns ``2 * block_q`` query rows of one (batch, head). Three warpgroups:
  * wg 2, the producer: registers lowered with ``setmaxnreg`` to 40, issues TMA loads of K/V blocks
    into a ring of ``num_stages`` SMEM slots (``k_ready``/``v_ready`` barriers) and refills a slot
    once both consumers released it (``k_free``/``v_free``).
  * wg 0 and wg 1, the consumers (registers raised to 232), ``block_q`` rows each, in ping-pong: a
    shared two-arrival ``schedule`` barrier lets one warpgroup's QK^T / PV wgmma run while the other
    does its online softmax (exp2, scale folded into one FMA), so the tensor cores stay busy.
    QK^T is wgmma SMEM x SMEM; PV is wgmma with P in registers (A operand) into the running acc.
  ``num_stages=1, alternate_gemms=True``: cuDNN's hd 256 form, one 128-key K and V buffer, the wgmmas
  in turns QK QK PV PV so each refill has two GEMMs of time (``TUNED``: every non-causal length, balanced
  persistent up to 2k keys, the grid past that; causal past 8k; NOTES v13, v23, v24).
  ``TuningConfig(consumers=3)``: FA3's hd 64 form, three consumers of 160 registers (wg 3 produces,
  with 32) over ``3 * block_q`` rows, without the ping-pong rendezvous (pallas_kernels/NOTES.md, v10).
  float8_e4m3fn inputs (forward only, ``fp8_config``): 8-bit wgmma reads both operands K-major, so
  V arrives transposed (V^T [B, G, d, S], by XLA before the kernel); P, converted to e4m3, stays in
  registers as PV's A operand (``fp8_p_in_regs``, V^T's keys permuted to its fragment) or goes
  through SMEM; O is bfloat16, through tiles of its own. The 8-bit tensor cores accumulate with 13
  mantissa bits, truncated, so scores carry ~1e-4 relative error (NOTES v21: 1.24 PFLOPS at hd 256
  16k on an H200).

Intra-warpgroup overlap (``TuningConfig(overlap=True)``, FA3's Algorithm 2, both schedules): a
consumer issues the QK^T of block j and the PV of block j - 1 back to back (async, one wgmma group
each), waits with ``wgmma_wait(1)`` semantics for the QK^T only, and does block j's softmax while
its PV still runs on the tensor cores; it then waits for the PV and only then converts P_j to 16
bits (writing P's registers while the PV that reads P_{j-1} is in flight makes ptxas serialize
every wgmma of the kernel). O is rescaled between the two issues at hd <= 128, as FA3 does, and
after the PV's wait at hd 256, where that measured faster. The ping-pong with the other consumer is
kept (two ``schedule`` rendezvous per step, as without overlap). A consumer then holds O, S / P of
block j in float32 and the 16-bit P of block j - 1 in registers: ``max_overlap_block_kv`` bounds
block_kv per head dim (``overlap_config`` picks it). ``default_config`` uses it where it measured
faster (``TUNED``: hd 128 non-causal up to 4k keys, hd 256 causal from 513 to 8k keys).

Lazy rescaling (``TuningConfig(lazy_rescale=True)``, FA4's conditional rescale): a row's running max
moves only when a block's scores pass it by more than 2^8, so most steps leave every factor alpha at
exactly 1, and a warp whose 16 rows all keep theirs skips O's multiply (a warp-uniform branch after a
``vote.sync``). ``TUNED`` uses it where it measured faster: hd 128 non-causal 1k-4k, hd 128 causal 2k-4k
and past 8k, every hd 256 causal row (NOTES v26; at hd 64 it was slower); ``fp8_config`` at hd 256
non-causal (NOTES v28).

Masking is one rule: key ``s`` is visible to query row ``t`` of batch ``b`` iff ``s < k_end[b, t]``
(see ``key_end``). It expresses non-causal, causal top-left, causal bottom-right (KV-cache offsets),
per-sequence lengths and the model's ``s <= q_pos`` rule. Per CTA the kernel reads the min / max
of ``k_end`` over its rows: KV blocks past ``cdiv(max, block_kv)`` are never loaded, blocks below
``min // block_kv`` run unmasked, only the rest pay for the mask. Sequence tails need no
divisibility: TMA zero-fills out-of-bounds loads and drops out-of-bounds stores. Rows that see no key
return 0 and ``lse = -inf``. A static mask (``flash_attention_fwd(..., causal=...)``, ``STATIC_MASKS``:
non-causal, top-left, bottom-right without lengths) is the same rule with ``k_end``, the tiles' min / max
and the balanced order computed from the tile index in the kernel or at trace time (``_KeyEnds``): no XLA
op runs before the kernel and no consumer loads ``k_end`` (NOTES v17).

Persistent variant (``TuningConfig(persistent=True)``): the grid is ``min(num_ctas, items)`` CTAs
over the work items, all ``(q tile, batch, head)`` triples ordered batch, head, q tile (fastest,
zigzag: see ``item``); CTA c runs items c, c + grid, c + 2 * grid, ...
and the per-item fixed cost (Q load, pipeline ramp, O/LSE epilogue) overlaps the CTA's next item:
  * the producer walks the CTA's (item, KV step) pairs with one running step counter, so the K/V
    ring's slots and barrier phases carry on from item to item, and also loads each item's Q into
    the consumers' ``q_smem`` once a ``q_free`` barrier says the previous item is done with it;
  * the consumers loop over the same items: wait Q, run the steps, write O and LSE, then arrive on
    ``q_free``. Where SMEM allows (hd 64, 128) O has a tile of its own per consumer and ``q_free``
    is arrived right after the item's last QK^T, so the producer loads the next Q, K and V while the
    consumers are still in the last PV and the epilogue; at hd 256 (or with ``o_tiles=0``) O reuses
    ``q_smem`` and ``q_free`` waits for the O store to have read it (the producer then loads the
    next item's first K/V blocks first). One O tile that the two consumers took in turn, which fits
    at hd 256, measured slower than that (pallas_kernels/NOTES.md, v7). ``spare_q=True`` (hd 256's
    32 KiB left over) keeps O in Q's SMEM but adds a Q tile: the (item j, consumer w) pairs take
    the ``consumers + 1`` tiles in turn (tile ``(consumers * j + w) % (consumers + 1)``), so a
    consumer's next Q is loaded into another tile while it writes O through its current one; only
    the first consumer's tile, freed half a step before the second consumer finishes, gates the
    second consumer's next Q (pallas_kernels/NOTES.md, v11);
  * ``prefetch=True``: each consumer issues the GMEM loads of its next item's ``k_end`` row and key
    range before it runs the current item, so that round trip is off the way between items (short
    items: hd 64 causal 512 +6 %; the overlap forms lose ~1 % to the registers it holds; NOTES v14).
With ``balanced=True`` CTA c runs ``order[c], order[c + grid], ...`` instead: the items sorted by
KV steps, longest first, dealt in snake order (``_balanced_order``: a trace-time constant for a static
mask, else computed in XLA from the per-tile key ranges), so causal tiles of unequal work even out;
``default_config`` uses it for long causal rows.
Barrier phases: Mosaic GPU keeps one parity bit per barrier per thread, flipped by each
``barrier_wait``, so every thread that waits on a barrier must wait on every one of its phases, in
order, and no barrier may complete twice ahead of a waiter; both kernels keep that (the producer
ends by observing the last releases).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jax import lax

_WGMMA = plgpu.Layout.WGMMA
_ROW = plgpu.Layout.WGMMA.reduce(1)
_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
_MASKED = -1e30  # finite: a row that has seen only masked keys still has a finite running max
_LAZY_RESCALE = 8.0  # ``lazy_rescale``: the running max moves once scores pass it by more than this (log2 units)


_SMEM_LIMIT = 227 * 1024  # bytes of shared memory one Hopper CTA may use


def _smem_align(n: int) -> int:
    """Bytes ``n`` rounded up to Mosaic GPU's 1 KiB shared-memory alignment (each buffer's footprint)."""
    return -(-n // 1024) * 1024


# setmaxnreg per thread of (consumer, producer) warpgroups, by consumer count: 2 * 232 + 40 and
# 3 * 160 + 32 registers of 128 threads fill the 64K register file (FA3's split for 3 consumers).
_REGISTERS = {2: (232, 40), 3: (160, 32)}
_REGISTER_MARGIN = 40     # of a consumer's registers: m, l, k_end, indices, addresses


def _out_dtype(dtype):
    """O's dtype: the inputs', bfloat16 for float8 inputs."""
    return jnp.dtype(jnp.bfloat16 if jnp.dtype(dtype).itemsize == 1 else dtype)


def _out_itemsize(itemsize: int) -> int:
    """Bytes per element of O for inputs of ``itemsize`` bytes (``_out_dtype``)."""
    return 2 if itemsize == 1 else itemsize


def max_overlap_block_kv(head_dim: int, consumers: int = 2) -> int:
    """Largest block_kv for ``overlap=True``. Per thread of a consumer warpgroup a [64, n] float32
    tile takes n / 2 registers: O (head_dim / 2), S / P of block j in float32 (block_kv / 2) and the
    16-bit P of block j - 1 (read by the PV in flight, block_kv / 4), with a block_kv / 4 margin,
    must fit the consumer's registers less 40 (the rest: m, l, k_end, indices, addresses): 192 of
    232 with 2 consumers (hd 64 and 128: 128, hd 256: 64), 120 of 160 with 3 (hd 64: 64, else 0:
    no overlap)."""
    return (_REGISTERS[consumers][0] - _REGISTER_MARGIN - head_dim // 2) // 64 * 64


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Block sizes of the forward kernel. ``interpretable`` swaps PV's register A-operand and
    accumulator-init wgmma for SMEM x SMEM + add, which the Mosaic GPU interpreter can run.
    ``persistent`` launches ``min(num_ctas, work items)`` CTAs that loop over (q tile, batch, head)
    items instead of one CTA per item; ``overlap`` overlaps each consumer's softmax of block j with
    its own PV of block j - 1 (module docstring; block_kv <= ``max_overlap_block_kv(head_dim)``).
    ``consumers=3`` runs three consumer warpgroups of 160 registers (a CTA owns 192 query rows, FA3's
    tile at hd 64) without the ping-pong rendezvous, which pairs two. ``spare_q`` (persistent, O staged
    in Q's SMEM): one Q tile more than consumers, taken in rotation, so each consumer's next Q is
    loaded while it still writes O through its current tile (the module docstring).
    ``alternate_gemms``: every wgmma is a ping-pong turn of its own, so the tensor cores run
    QK^T_0 QK^T_1 PV_0 PV_1 (subscript: consumer) instead of (PV QK^T)_0 (PV QK^T)_1; a refill of a
    one-stage ring (``num_stages=1``) then has two GEMMs to land in instead of one.
    ``prefetch`` (persistent): each consumer issues the GMEM loads of its next item's ``k_end`` row
    and key range before running the current item, so their latency leaves the way from one item
    to the next (a few registers more across the KV loop), and with O tiles the producer loads an
    item's first K/V block before its Q tiles; for short items (pallas_kernels/NOTES.md, v14).
    ``kernel_mask=False``: a static mask (``flash_attention_fwd(..., causal=...)``) runs as its ``k_end``
    arrays (``key_end``, ``tile_key_bounds``), the form that measured faster at hd 64 non-causal (NOTES v17).
    ``fp8_p_in_regs`` (float8 inputs, not interpretable): P stays in registers as PV's A operand instead
    of going through SMEM (``_fp8_a_operand``: no shuffle, each row's two 8-key register tiles packed into
    one 16-key 8-bit fragment), with V^T's keys permuted to match in the XLA transpose (``_fp8_keys_permuted``).
    ``lazy_rescale`` (FA4's conditional rescaling): a row keeps its running max ``m`` until a block's
    scores exceed it by more than ``_LAZY_RESCALE`` (8 in the scaled log2 domain), so P <= 2^8 and most
    blocks leave every row's factor alpha exactly 1; a warp whose 16 rows all have alpha == 1 skips
    the multiply of its O registers (a warp-uniform branch, ``_rescaled``). O and l stay relative to the
    same ``m``, so the result is the softmax's up to rounding (NOTES v26)."""
    block_q: int = 64        # query rows per consumer warpgroup (a CTA owns consumers * block_q)
    block_kv: int = 128      # keys per pipeline step
    num_stages: int = 2      # K/V SMEM ring depth
    interpretable: bool = False
    persistent: bool = False
    num_ctas: int = 132      # persistent grid size: the SM count of an H100 / H200
    overlap: bool = False    # intra-warpgroup overlap: QK^T of block j in flight with PV of j - 1
    balanced: bool = False   # persistent only: items dealt longest-first in snake order (LPT)
    o_tiles: int | None = None  # persistent only: O staging tiles, 0 or one per consumer (None: those where they fit)
    consumers: int = 2       # consumer warpgroups: 2 (ping-pong) or 3
    spare_q: bool = False    # persistent, o_tiles 0: consumers + 1 Q tiles in rotation
    alternate_gemms: bool = False  # 2 consumers, no overlap: wgmma order QK QK PV PV (``_attend``)
    prefetch: bool = False   # persistent only: the next item's k_end loads one item ahead (class doc)
    kernel_mask: bool = True  # static masks (``causal=``) in the kernel; False: as k_end arrays (class doc)
    fp8_p_in_regs: bool = False  # float8: P as PV's register A operand, V^T's keys permuted (class doc)
    lazy_rescale: bool = False  # a row's running max moves only when it grows by more than 2^8 (class doc)

    def __post_init__(self):
        if self.block_q != 64:
            raise ValueError(f"block_q must be 64 (one wgmma M tile per warpgroup), got {self.block_q}")
        if self.block_kv % 16 or not 64 <= self.block_kv <= 256:
            raise ValueError(f"block_kv must be a multiple of 16 from 64 to 256 (PV's wgmma K is a "
                             f"multiple of V's swizzle width, at least 16 keys), got {self.block_kv}")
        if isinstance(self.num_stages, bool) or not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"num_stages must be an int >= 1 (K/V ring depth; 1: one K and one V buffer, "
                             f"refilled once both consumers released them), got {self.num_stages!r}")
        if not isinstance(self.persistent, bool):
            raise ValueError(f"persistent must be True or False, got {self.persistent!r}")
        if not isinstance(self.overlap, bool):
            raise ValueError(f"overlap must be True or False, got {self.overlap!r}")
        if not isinstance(self.balanced, bool) or (self.balanced and not self.persistent):
            raise ValueError(f"balanced must be True or False and needs persistent=True (it orders the "
                             f"persistent grid's items), got balanced={self.balanced!r}, "
                             f"persistent={self.persistent!r}")
        if isinstance(self.consumers, bool) or self.consumers not in (2, 3):
            raise ValueError(f"consumers must be 2 or 3 (consumer warpgroups of a CTA), got {self.consumers!r}")
        if self.o_tiles not in (None, 0, self.consumers) or (self.o_tiles is not None and not self.persistent):
            raise ValueError(f"o_tiles must be None, 0 or consumers ({self.consumers}) and needs "
                             f"persistent=True (O staging tiles of the persistent kernel), got "
                             f"o_tiles={self.o_tiles!r}, persistent={self.persistent!r}")
        if not isinstance(self.spare_q, bool) or (self.spare_q and (not self.persistent or self.o_tiles)):
            raise ValueError(f"spare_q must be True or False and needs persistent=True with O staged in "
                             f"Q's SMEM (o_tiles None or 0), got spare_q={self.spare_q!r}, "
                             f"persistent={self.persistent!r}, o_tiles={self.o_tiles!r}")
        if not isinstance(self.alternate_gemms, bool) or (self.alternate_gemms and (self.overlap or self.consumers != 2)):
            raise ValueError(f"alternate_gemms must be True or False and needs the ping-pong without overlap "
                             f"(consumers=2, overlap=False), got alternate_gemms={self.alternate_gemms!r}, "
                             f"overlap={self.overlap!r}, consumers={self.consumers!r}")
        if not isinstance(self.prefetch, bool) or (self.prefetch and not self.persistent):
            raise ValueError(f"prefetch must be True or False and needs persistent=True (it loads the "
                             f"persistent kernel's next item ahead), got prefetch={self.prefetch!r}, "
                             f"persistent={self.persistent!r}")
        if not isinstance(self.kernel_mask, bool):
            raise ValueError(f"kernel_mask must be True or False (static masks computed in the kernel, or "
                             f"passed to it as k_end arrays), got {self.kernel_mask!r}")
        if not isinstance(self.fp8_p_in_regs, bool) or (self.fp8_p_in_regs and self.interpretable):
            raise ValueError(f"fp8_p_in_regs must be True or False and needs interpretable=False (the interpreter "
                             f"runs no register A operand), got fp8_p_in_regs={self.fp8_p_in_regs!r}, "
                             f"interpretable={self.interpretable!r}")
        if not isinstance(self.lazy_rescale, bool):
            raise ValueError(f"lazy_rescale must be True or False (skip O's rescale while no row's max grows "
                             f"by more than 2^{_LAZY_RESCALE:g}), got {self.lazy_rescale!r}")
        if isinstance(self.num_ctas, bool) or not isinstance(self.num_ctas, int) or self.num_ctas < 1:
            raise ValueError(f"num_ctas must be a positive int (CTAs of the persistent grid, at most "
                             f"one per SM is useful), got {self.num_ctas!r}")

    @property
    def rows(self) -> int:
        """Query rows of one CTA (one work item): ``consumers * block_q``."""
        return self.consumers * self.block_q

    def check_head_dim(self, head_dim: int, itemsize: int = 2) -> None:
        """Raises ValueError where the buffers would not fit 227 KiB of SMEM or ``overlap`` (any
        config, with 3 consumers) would not fit the consumers' registers; for 8-bit inputs
        (``itemsize=1``, float8_e4m3fn) also where the config needs what the FP8 form lacks."""
        if itemsize != 1 and self.fp8_p_in_regs:
            raise ValueError(f"fp8_p_in_regs applies to float8 inputs only (16-bit P is always in registers), "
                             f"got {itemsize}-byte inputs")
        if itemsize == 1 and (self.overlap or self.spare_q or self.o_tiles == 0):
            raise ValueError(
                f"float8 inputs stage P through SMEM and O (bfloat16) through tiles of its own: they need "
                f"overlap=False, spare_q=False and o_tiles None or {self.consumers}, got overlap={self.overlap}, "
                f"spare_q={self.spare_q}, o_tiles={self.o_tiles} (fp8_config(head_dim) is one that fits)")
        if self.overlap and self.block_kv > (top := max_overlap_block_kv(head_dim, self.consumers)):
            raise ValueError(
                f"overlap=True keeps O, S / P and the previous P in registers: at head dim {head_dim} "
                f"with {self.consumers} consumers block_kv must be <= {top}, got {self.block_kv} "
                f"(overlap_config(head_dim) picks one that fits)")
        budget = _REGISTERS[self.consumers][0] - _REGISTER_MARGIN
        if self.consumers == 3 and head_dim // 2 + self.block_kv // 2 > budget:
            raise ValueError(
                f"consumers=3 leaves 160 registers per consumer thread: O and S in float32 (head_dim / 2 "
                f"+ block_kv / 2) must fit {budget}, got head dim {head_dim}, block_kv {self.block_kv} "
                f"(use block_kv <= {2 * (budget - head_dim // 2)} or 2 consumers)")
        if (need := self.smem_bytes(head_dim, itemsize)) > _SMEM_LIMIT:
            raise ValueError(
                f"{self} needs {need} bytes of shared memory at head dim "
                f"{head_dim}, more than the {_SMEM_LIMIT} a Hopper CTA has: use a smaller block_kv, "
                f"fewer num_stages or fewer o_tiles")

    @property
    def q_tiles(self) -> int:
        """Q SMEM tiles: one per consumer, one more with ``spare_q``."""
        return self.consumers + self.spare_q

    @property
    def q_ready_barriers(self) -> int:
        """Q-ready barriers: one per consumer, with ``spare_q`` one per (consumer, Q tile), so that
        each consumer waits on every phase of the barriers it uses."""
        return self.consumers * self.q_tiles if self.spare_q else self.consumers

    def _barriers(self) -> int:
        """Barriers the kernel allocates: K/V ready and free per ring slot, ``q_ready_barriers``,
        the ``schedule`` rendezvous (2 consumers); persistent: ``q_free`` per Q tile."""
        return (4 * self.num_stages + self.q_ready_barriers + (self.consumers == 2)
                + (self.q_tiles if self.persistent else 0))

    def smem_bytes(self, head_dim: int, itemsize: int = 2, o_tiles: int | None = None) -> int:
        """Shared memory the kernel allocates, as Mosaic GPU counts it: every buffer rounded up to
        1 KiB (its SMEM alignment), then 8 bytes per barrier. ``o_tiles``: O staging tiles
        (persistent only; default ``self.o_tile_count``)."""
        o_tiles = self.o_tile_count(head_dim, itemsize) if o_tiles is None else o_tiles
        tile = self.block_q * head_dim * itemsize           # one consumer's [block_q, d] Q tile
        o_tile = self.block_q * head_dim * _out_itemsize(itemsize)  # ... and O tile
        ring = self.num_stages * self.block_kv * head_dim * itemsize   # K's or V's
        c = self.consumers
        buffers = [self.q_tiles * tile, ring, ring, c * self.block_q * 4,
                   c * self.block_q * self.block_kv * itemsize if self._p_tiles(itemsize) else 0,
                   o_tiles * o_tile]
        return sum(map(_smem_align, buffers)) + 8 * self._barriers()

    def _p_tiles(self, itemsize: int) -> bool:
        """Whether P goes through SMEM tiles: interpretable, or float8 without ``fp8_p_in_regs``."""
        return self.interpretable or (itemsize == 1 and not self.fp8_p_in_regs)

    def o_tile_count(self, head_dim: int, itemsize: int = 2) -> int:
        """Persistent kernel only: SMEM tiles that stage O for its TMA store, so that a consumer's Q
        tile can be refilled for the next item right after its last QK^T. ``o_tiles`` if set, else
        one per consumer where they fit 227 KiB (hd 64, 128), else 0 (O is written through the
        consumer's Q tile, and the next item's Q loads after that store; with ``spare_q`` into
        another tile, before it). The grid kernel: 0. 8-bit inputs: one per consumer (O is bfloat16)."""
        if itemsize == 1:
            return self.consumers
        if not self.persistent or self.spare_q:
            return 0
        if self.o_tiles is not None:
            return self.o_tiles
        c = self.consumers
        return c if self.smem_bytes(head_dim, itemsize, c) <= _SMEM_LIMIT else 0


# Per (head dim, causal): ``(longest kv_len, block_kv, schedule)`` rows, the first that covers kv_len
# wins (None: any length); "+overlap": intra-warpgroup overlap. Fitted to two H100 sweeps of the FA3
# table (bf16, cuDNN in the same process: benchmarks/results/fa3_tune_h100_2026-11-27{,_sched}.*,
# benchmarks/tune_fa3.py; see pallas_kernels/NOTES.md "v5"; a schedule that was within ~2 % of another
# in one run and behind it in the other is not trusted), then the overlap picks to one H200 sweep of
# the overlap configs against those (fa3_tune_h200_2026-11-28_overlap.*, NOTES "v6"); hd 128
# non-causal up to 4k to an H100 probe of the overlap with O rescaled early (..._hd128early.txt); hd 128
# from 8k keys to 192-key blocks, which fit once the Mosaic GPU reduction scratch was dropped (NOTES "v7");
# "+c3": three consumer warpgroups (192-row items), hd 64 non-causal 4k < S <= 8k, an H200 probe (NOTES "v10"), and
# past 8k with a 3-deep K/V ring ("+3stage"), two H100 probes (NOTES "v24");
# "+spare": a spare Q tile (``spare_q``), hd 256 causal up to 1k keys (non-causal up to 2k until v23), three H200
# probes (NOTES "v11");
# "+1stage+turns": cuDNN's hd 256 form, 128-key blocks with one K/V stage (``num_stages=1``) and the wgmmas in
# the order QK QK PV PV (``alternate_gemms``), hd 256 non-causal past 2k keys and causal past 8k, H200 probes (NOTES "v13");
# "+prefetch": the next item's k_end loads one item ahead, the persistent picks without overlap at hd 64 / 128 up to
# the lengths probed (16k non-causal at hd 64 not), H200 probes (NOTES "v14"); with overlap it measured slower.
# "+kend": a static mask runs as k_end arrays (``kernel_mask=False``), hd 64 non-causal, an H200 table and probe (NOTES "v17").
# "balanced" with v18's snake at hd 128 causal 4k < S <= 8k and hd 64 causal past 8k: an H200 probe (NOTES "v19").
# hd 256 non-causal up to 2k keys: the balanced one-stage form with turns, an H100 probe (NOTES "v23"); past 8k the
# grid, as from 2k to 8k, and hd 64 non-causal 1k < S <= 2k balanced with the static mask: two H100 probes (NOTES "v24").
# "+lazy": ``lazy_rescale`` (O rescaled only in warps where a row's max grew by more than 2^8), where an H100 probe of
# every bf16 row measured it faster: hd 128 non-causal 1k-4k (+1.6 %), causal 4k and past 8k (+0.9 / +1.5 %), every
# hd 256 causal row (+1.2-3.1 %); at hd 64 it was 1-10 % slower (NOTES "v26").
TUNED = {
    (64, False): ((1024, 256, "persistent+prefetch+kend"), (2048, 256, "balanced+prefetch"),
                  (4096, 256, "persistent+prefetch+kend"), (8192, 128, "persistent+c3+prefetch+kend"),
                  (None, 128, "persistent+c3+3stage+prefetch+kend")),
    (64, True): ((1024, 128, "persistent+prefetch"), (8192, 256, "persistent+prefetch"),
                 (None, 256, "balanced+prefetch")),
    (128, False): ((512, 128, "persistent+overlap"), (4096, 128, "persistent+overlap+lazy"), (None, 192, "grid")),
    (128, True): ((2048, 128, "persistent+prefetch"), (4096, 128, "persistent+prefetch+lazy"), (8192, 128, "balanced"),
                  (None, 192, "grid+lazy")),
    (256, False): ((2048, 128, "balanced+1stage+turns"), (None, 128, "grid+1stage+turns")),
    (256, True): ((512, 64, "persistent+spare+lazy"), (1024, 64, "persistent+overlap+spare+lazy"),
                  (2048, 64, "persistent+overlap+lazy"), (8192, 64, "balanced+overlap+lazy"),
                  (None, 128, "grid+1stage+turns+lazy")),
}
# Rows whose pick above is balanced where a mask passed as a ``k_end`` array takes another: for an array the
# balanced order is sorted by XLA before the kernel, and these short rows lost 12-18 % with it (hd 256
# non-causal 512-2k on an H100: 417-590 TFLOPS balanced against 506-671 with this pick; NOTES "v23"). hd 64
# non-causal up to 2k keeps its neighbours' pick (with arrays the balanced one ran 322-447 TFLOPS against
# 405-491 at 512-2k keys in an H100 probe; NOTES "v24").
TUNED_ARRAYS = {
    (64, False): ((2048, 256, "persistent+prefetch+kend"),),
    (256, False): ((2048, 64, "persistent+overlap+spare"),),
}


def default_config(head_dim: int, kv_len: int | None = None, causal: bool = False,
                   mask_array: bool = False) -> TuningConfig:
    """The tuned config for this head dim, key length and mask (``TUNED``). ``causal`` only steers
    the choice (the kernel reads the mask from ``k_end`` either way): causal tiles differ in work,
    so long causal rows want the balanced persistent schedule or the one-CTA-per-tile grid, while
    equal tiles want the persistent grid. ``mask_array``: the mask comes as a ``k_end`` array, not a
    static mask (``TUNED_ARRAYS`` rows first). Without ``kv_len``: the largest KV block that fits
    227 KiB with a 2-deep ring, one CTA per tile (the untuned base the sweeps start from). The
    persistent grid has one CTA per SM of the first device."""
    base = {64: 256, 128: 128, 256: 64}.get(head_dim, 64)
    if kv_len is None or (head_dim, bool(causal)) not in TUNED:
        return TuningConfig(block_kv=base)
    rows = TUNED_ARRAYS.get((head_dim, bool(causal)), ()) if mask_array else ()
    for longest, block_kv, schedule in (*rows, *TUNED[head_dim, bool(causal)]):
        if longest is None or kv_len <= longest:
            break
    schedule, *flags = schedule.split("+")
    extra = dict(overlap="overlap" in flags, consumers=3 if "c3" in flags else 2, spare_q="spare" in flags,
                 num_stages=next((int(f[0]) for f in flags if f.endswith("stage")), 2), alternate_gemms="turns" in flags,
                 prefetch="prefetch" in flags, kernel_mask="kend" not in flags,
                 lazy_rescale="lazy" in flags)
    if schedule == "grid":
        return TuningConfig(block_kv=block_kv, **extra)
    return TuningConfig(block_kv=block_kv, persistent=True, balanced=schedule == "balanced",
                        num_ctas=_sm_count(), **extra)


def _sm_count() -> int:
    """The persistent grid's size: the SM count of the first device if it is a GPU, else an H100's 132."""
    dev = jax.devices()[0]
    return (getattr(dev, "core_count", None) if dev.platform == "gpu" else None) or 132


def overlap_config(head_dim: int, kv_len: int | None = None, causal: bool = False) -> TuningConfig:
    """``default_config(head_dim, kv_len, causal)`` (same schedule) in its overlap form
    (``with_overlap``)."""
    return with_overlap(default_config(head_dim, kv_len, causal), head_dim)


def fp8_config(head_dim: int, kv_len: int | None = None, causal: bool = False) -> TuningConfig:
    """The float8_e4m3fn forward's config, tuned on an H200 (NOTES v21, ``results/fa3_fp8_*``): P in
    registers (``fp8_p_in_regs``: 5-12 % over P through SMEM on every row probed; without P tiles two
    128-key stages fit at hd 256), the balanced persistent grid, two K/V stages; 128-key blocks at
    hd 256 and on the short rows (``kv_len`` <= 1024) at hd 64 and causal hd 128, 256-key blocks
    elsewhere. ``lazy_rescale`` at hd 256 non-causal: +1-5 % from 1k to 8k keys in two H100 probes, level
    at 512; 5-16 % slower at hd 64 / 128 (NOTES v27, v28)."""
    short = kv_len is not None and kv_len <= 1024 and (head_dim <= 64 or causal)
    return TuningConfig(block_kv=128 if head_dim > 128 or short else 256, num_stages=2, persistent=True,
                        balanced=True, fp8_p_in_regs=True, num_ctas=_sm_count(),
                        lazy_rescale=head_dim > 128 and not causal)


def with_overlap(cfg: TuningConfig, head_dim: int) -> TuningConfig:
    """``cfg`` with ``overlap=True``, block_kv capped at ``max_overlap_block_kv(head_dim,
    cfg.consumers)`` (hd64: 256 -> 128, hd 256: 128 -> 64) and a one-stage ring back to two stages
    in the ping-pong's usual order."""
    return dataclasses.replace(cfg, overlap=True, num_stages=2, alternate_gemms=False,
                               block_kv=min(cfg.block_kv, max_overlap_block_kv(head_dim, cfg.consumers)))


# ---------------------------------------------------------------- pieces shared by both kernels
def _produce(n_steps, stages: int, loads):
    """A producer's ring over ``n_steps`` steps. ``loads``: ``((load, free), ...)``; step ``ki`` runs
    each ``load(ki, slot)`` in turn into slot ``ki % stages``, a refill only once that load's ``free``
    barrier says the consumers released the slot (the forward frees K and V apart, so K's refill does
    not wait for the PV); then the last releases are observed, so no barrier phase is left pending at
    exit. The grid forward and both ``flash_attention_bwd`` kernels use it."""
    for i in range(stages):
        @pl.when(i < n_steps)
        def _():
            for load, _ in loads:
                load(i, i)

    @pl.loop(0, jnp.maximum(n_steps - stages, 0))
    def _(ki):
        slot = lax.rem(ki, stages)
        for load, free in loads:
            plgpu.barrier_wait(free.at[slot])
            load(ki + stages, slot)

    @pl.loop(jnp.maximum(n_steps - stages, 0), n_steps)
    def _(ki):
        for _, free in loads:
            plgpu.barrier_wait(free.at[lax.rem(ki, stages)])


def _kv_steps(kmax, block_kv: int, n_kv_blocks: int):
    """KV blocks any row of a tile whose largest ``k_end`` is ``kmax`` sees (its KV steps)."""
    return jnp.minimum(pl.cdiv(kmax, block_kv), n_kv_blocks)


def _kv_range(kmin, kmax, block_kv: int, n_kv_blocks: int):
    """``(n_steps, n_open)``: KV blocks any row of the tile sees, blocks every row sees entirely."""
    n_steps = _kv_steps(kmax, block_kv, n_kv_blocks)
    return n_steps, jnp.minimum(lax.div(kmin, block_kv), n_steps)


def _item_steps(kmax_BN, block_kv: int, n_kv_blocks: int, n_heads: int):
    """Each item's KV steps, items in ``_item_tile``'s base order, from the tiles' largest ``k_end``
    [B, tiles] (``_balanced_order``, ``benchmarks/fa3_waves.py``)."""
    B, n_tiles = kmax_BN.shape
    qi, bi, _ = _item_tile(jnp.arange(B * n_heads * n_tiles, dtype=jnp.int32), n_tiles, n_heads)
    return _kv_steps(kmax_BN[bi, qi], block_kv, n_kv_blocks)


def _item_tile(w, n_tiles: int, n_heads: int):
    """``(qi, bi, hi)`` of persistent item ``w`` in the base order: batch slowest, then head, then
    q tile fastest, zigzag (longest-first for even heads, shortest-first for odd ones; see the
    persistent kernel's ``item``). Scalars in the kernel, arrays in ``_balanced_order``."""
    r, bh = lax.rem(w, n_tiles), lax.div(w, n_tiles)
    qi = jnp.where(lax.rem(bh, 2) == 0, n_tiles - 1 - r, r)
    return qi, lax.div(bh, n_heads), lax.rem(bh, n_heads)


def _arrive(schedule):  # the ping-pong's halves; no-ops with 3 consumers (``schedule`` None)
    if schedule is not None:
        plgpu.barrier_arrive(schedule)


def _wait(schedule):
    if schedule is not None:
        plgpu.barrier_wait(schedule)


def _sync(schedule):
    _arrive(schedule)
    _wait(schedule)


def _init_carry(bq: int, d: int):
    m_i = plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), _ROW)
    l_i = plgpu.layout_cast(jnp.zeros((bq,), jnp.float32), _ROW)
    acc = plgpu.layout_cast(jnp.zeros((bq, d), jnp.float32), _WGMMA)
    return acc, m_i, l_i


def _scores_to_p(s, m_i, kend_row, ki, masked: bool, scale_log2: float, lazy: bool = False):
    """Online softmax of one block's scores: ``(m_new, alpha, p)``, m in the scaled log2 domain, so
    p = exp2(s * c - m) is one FMA per element; ``masked``: keys at or past ``k_end`` get -1e30.
    ``lazy``: a row's m moves only if the block's max passes it by more than ``_LAZY_RESCALE``, else
    its alpha is exactly 1 and its p at most 2^8 (``TuningConfig.lazy_rescale``)."""
    if masked:
        col = plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=_WGMMA) + ki * s.shape[1]
        s = jnp.where(col < lax.broadcast_in_dim(kend_row, s.shape, [0]), s, _MASKED)
    m_new = jnp.maximum(m_i, s.max(axis=1) * scale_log2)
    if lazy:  # m_i = -inf (no block yet) always moves
        m_new = jnp.where(m_new > m_i + _LAZY_RESCALE, m_new, m_i)
    alpha = jnp.exp2(m_i - m_new)
    return m_new, alpha, jnp.exp2(s * scale_log2 - lax.broadcast_in_dim(m_new, s.shape, [0]))


def _rescaled(acc, alpha, cfg: TuningConfig):
    """O's rows times their factors ``alpha``. With ``cfg.lazy_rescale`` on the GPU, a warp multiplies
    only if one of its 16 rows has alpha != 1 (a ``vote.any`` over the warp, so the branch is uniform
    within it); a skipped multiply is by exactly 1, so the result is the same bits either way. The
    interpreter runs no inline Mosaic GPU code: ``interpretable`` configs always multiply."""
    if not cfg.lazy_rescale or cfg.interpretable:
        return acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
    import jax.experimental.mosaic.gpu as mgpu
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, nvvm, scf, vector

    @plgpu.inline_mgpu(arg_types=(_WGMMA, _ROW),
                       return_type=plgpu.ShapeDtypeStruct(acc.shape, jnp.float32, layout=_WGMMA))
    def rescale(ctx, acc_fa, alpha_fa):
        i1, i32 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(32)
        one = arith.constant(ir.F32Type.get(), 1.0)
        need = arith.constant(i1, 0)
        for reg in alpha_fa.registers.flat:    # this thread's rows
            for i in range(ir.VectorType(reg.type).shape[0]):
                x = vector.extract(reg, dynamic_position=[], static_position=[i])
                need = arith.ori(need, arith.cmpf(arith.CmpFPredicate.UNE, x, one))
        need = nvvm.vote_sync(arith.constant(i32, -1), need, "any")  # mask: all 32 lanes
        regs = acc_fa.registers
        branch = scf.IfOp(need, [r.type for r in regs.flat], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            scaled = acc_fa * alpha_fa.broadcast_in_dim(acc_fa.shape, (0,), acc_fa.layout)
            scf.yield_(list(scaled.registers.flat))
        with ir.InsertionPoint(branch.else_block):
            scf.yield_(list(regs.flat))
        out = np.empty(regs.shape, dtype=object)
        for idx, r in zip(np.ndindex(regs.shape), branch.results):
            out[idx] = r
        return mgpu.FragmentedArray(_registers=out, _layout=acc_fa.layout, _is_signed=None)
    return rescale(acc, alpha)


def _fp8(ref) -> bool:
    return jnp.dtype(ref.dtype).itemsize == 1


def _v_operand(v_smem, slot):
    """PV's B operand [block_kv, d] in ring slot ``slot``. 8-bit wgmma reads both operands K-major
    (the contraction dim contiguous), so float8 V is staged as V^T [d, block_kv] and read transposed."""
    return v_smem.at[slot].T if _fp8(v_smem) else v_smem.at[slot]


def _v_block(v_ref, bi, ki, gi, bkv: int):
    """The GMEM block of V that fills a ring slot: keys ``ki * bkv ...`` of (batch bi, kv head gi);
    float8 V comes as V^T [B, G, d, S] (``flash_attention_fwd``)."""
    if _fp8(v_ref):
        return v_ref.at[bi, gi, :, pl.ds(ki * bkv, bkv)]
    return v_ref.at[bi, pl.ds(ki * bkv, bkv), gi]


def _fp8_keys_permuted(vt):
    """V^T [..., S] with its keys in ``_fp8_a_operand``'s order: position ``16 i + 4 q + 2 h + l`` holds
    key ``16 i + 8 h + 2 q + l`` (S a multiple of 16); a transpose, which XLA fuses with V's."""
    *lead, S = vt.shape
    return vt.reshape(*lead, S // 16, 2, 4, 2).swapaxes(-3, -2).reshape(*lead, S)


def _fp8_a_operand(p):
    """float32 P [64, n] (WGMMA layout) as e4m3 in the 8-bit wgmma A-operand layout, in registers.
    A thread holds columns 2 q, 2 q + 1 of each 8-column tile (q = lane % 4); the 8-bit fragment
    wants 4 bytes per 16 columns, read as k = 4 q ... 4 q + 3. Packing the thread's two tiles of a
    16-column group gives k = 4 q + 2 h + l the key 8 h + 2 q + l: no shuffle, and V^T's keys are
    stored in that order (``_fp8_keys_permuted``), so P V sums the same products."""
    import jax.experimental.mosaic.gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jax._src.lib.mlir import ir

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,),
                       return_type=plgpu.ShapeDtypeStruct(p.shape, jnp.float8_e4m3fn, layout=plgpu.Layout.WGMMA_8BIT))
    def pack(ctx, p_fa):
        regs = p_fa.astype(ir.Float8E4M3FNType.get()).registers  # [.., n / 8 tiles, ..] of 2 x e4m3
        out = np.empty((regs.shape[0], regs.shape[1] // 2, *regs.shape[2:]), dtype=object)
        for idx in np.ndindex(out.shape):
            pair = [regs[(idx[0], 2 * idx[1] + h, *idx[2:])] for h in (0, 1)]
            out[idx] = mgpu_utils.vector_concat(pair)
        return mgpu.FragmentedArray(_registers=out, _layout=mgpu.WGMMA_LAYOUT_8BIT, _is_signed=None)
    return pack(p)


def _issue_pv(o_ref, acc, p_lo, v_smem, p_smem):
    """Starts PV into the accumulator ``o_ref``: onto ``acc`` with P in registers, or (``p_smem``
    given: interpretable) into zeros with P staged in SMEM, the caller then adds ``acc``."""
    if p_smem is None:
        o_ref[...] = acc
        plgpu.wgmma(o_ref, p_lo, v_smem)
    else:
        p_smem[...] = p_lo
        plgpu.commit_smem()
        plgpu.wgmma(o_ref, p_smem, v_smem)


def _overlap_steps(q_smem, p_smem, kend_row, carry, n_open, n_steps, ring, schedule, slot_of, *,
                   cfg: TuningConfig, scale_log2: float, on_last_qk=None):
    """``_attend``'s KV loop with intra-warpgroup overlap, for ``n_steps > 0``: step 0 computes
    P_0; step ki issues QK^T_ki and PV_{ki-1} (O rescaled by block ki - 1's factor in between, at
    hd <= 128), waits for the QK^T only (``wgmma_wait(1)``: one group left in flight), does softmax
    ki while PV_{ki-1} runs, then waits for it (and rescales O, at hd 256); after the loop, PV of the
    last step. Each step has the two ``schedule`` rendezvous of the ping-pong: after issuing its
    wgmma and after its softmax (2 consumers; none with 3)."""
    bq, bkv = cfg.block_q, cfg.block_kv
    k_smem, v_smem, k_ready, v_ready, k_free, v_free = ring
    sync = functools.partial(_sync, schedule)
    lo = k_smem.dtype

    def scores_read(ki, slot):  # K's slot may be refilled; last QK^T: q_smem may be too
        plgpu.barrier_arrive(k_free.at[slot])
        if on_last_qk is not None:
            pl.when(ki == n_steps - 1)(on_last_qk)

    # FA3 rescales O between the QK^T and PV issues (O is no input of the QK^T): +2-3 % at hd 128; at
    # hd 256, where O takes 128 registers, rescaling it after the PV's wait measured faster (NOTES, v6).
    early = carry[0].shape[1] <= 128

    def end_step(ki, *carry):
        carry = lax.optimization_barrier(carry)
        _arrive(schedule)     # softmax done: our next wgmma may go after the other's
        plgpu.barrier_wait(v_ready.at[slot_of(ki)])
        pl.when(ki + 1 < n_steps)(lambda: plgpu.barrier_wait(k_ready.at[slot_of(ki + 1)]))
        _wait(schedule)
        return carry

    rescaled = functools.partial(_rescaled, cfg=cfg)

    def onto(acc, owed):  # what the next PV accumulates onto: O with every rescale applied
        return rescaled(acc, owed) if early else acc

    def first(acc, m_i, l_i):
        def qk(s_ref):
            plgpu.wgmma(s_ref, q_smem, k_smem.at[slot_of(0)].T)
            sync()                   # let the other warpgroup issue its wgmma
            return s_ref[...]
        s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
        scores_read(0, slot_of(0))
        # Step 0 is masked, except for n_open > 0, where (as unmasked) every row sees block 0.
        kend0 = jnp.maximum(kend_row, jnp.where(n_open > 0, bkv, 0))
        m_new, alpha, p = _scores_to_p(s, m_i, kend0, 0, True, scale_log2, cfg.lazy_rescale)  # acc is still 0
        return end_step(0, acc, m_new, l_i * alpha + p.sum(axis=1), p.astype(lo), alpha)

    def step(ki, carry, masked: bool):
        acc, m_i, l_i, p_lo, owed = carry   # owed: block ki - 1's rescale of O, if ``early``
        slot, prev = slot_of(ki), slot_of(ki - 1)

        def gemms(s_ref, o_ref):
            plgpu.wgmma(s_ref, q_smem, k_smem.at[slot].T)
            _issue_pv(o_ref, onto(acc, owed), p_lo, v_smem.at[prev], p_smem)
            sync()
            s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)  # QK^T done; PV may still run
            scores_read(ki, slot)
            m_new, alpha, p = _scores_to_p(s, m_i, kend_row, ki, masked, scale_log2, cfg.lazy_rescale)
            return o_ref[...], m_new, alpha, l_i * alpha + p.sum(axis=1), p  # o_ref[...]: waits for PV
        o, m_new, alpha, l_new, p = pl.run_scoped(
            gemms, plgpu.ACC((bq, bkv), jnp.float32), plgpu.ACC(acc.shape, jnp.float32))
        # P is converted only now, after the PV's wait, as in FA3: writing 16-bit P registers while the
        # PV that reads the previous P is in flight made ptxas serialize every wgmma of the kernel
        # (C7513, "non wgmma instructions defining input registers of a wgmma"; 0.68x cuDNN).
        p_new = p.astype(lo)
        plgpu.barrier_arrive(v_free.at[prev])
        o = o if p_smem is None else onto(acc, owed) + o
        return end_step(ki, o if early else rescaled(o, alpha), m_new, l_new, p_new, alpha)

    def last(acc, p_lo, owed):
        slot = slot_of(n_steps - 1)

        def pv(o_ref):
            _issue_pv(o_ref, onto(acc, owed), p_lo, v_smem.at[slot], p_smem)
            return o_ref[...]
        o = pl.run_scoped(pv, plgpu.ACC(acc.shape, jnp.float32))
        plgpu.barrier_arrive(v_free.at[slot])
        return o if p_smem is None else onto(acc, owed) + o

    carry = first(*carry)
    n_open = jnp.maximum(n_open, 1)    # step 0 ran masked
    carry = lax.fori_loop(1, n_open, functools.partial(step, masked=False), carry)
    acc, m_i, l_i, p_lo, owed = lax.fori_loop(n_open, n_steps, functools.partial(step, masked=True), carry)
    return last(acc, p_lo, owed), m_i, l_i


def _attend(q_smem, p_smem, kend_row, carry, n_open, n_steps, ring, schedule, *, wg,
            cfg: TuningConfig, scale_log2: float, step0=None, on_last_qk=None, zero=None):
    """One consumer warpgroup's KV loop over its ``block_q`` query rows: ``n_open`` unmasked steps,
    then masked ones up to ``n_steps``, ping-ponged with the other consumer through ``schedule``
    (per tile each warpgroup arrives and waits ``2 * n_steps + 1`` times, ``4 * n_steps + 1`` with
    ``alternate_gemms``, so the pairing stays balanced from one tile to the next). Tile step ``ki``
    uses ring slot ``(step0 + ki) % num_stages`` (``step0`` None: 0). ``on_last_qk`` runs once the
    last QK^T has read ``q_smem``. ``p_smem`` (P's SMEM tile) is None unless ``cfg.interpretable`` or
    the inputs are float8. ``zero``:
    ``_KeyEnds.zero``, for ``num_stages=1``."""
    bq, bkv, stages = cfg.block_q, cfg.block_kv, cfg.num_stages
    k_smem, v_smem, k_ready, v_ready, k_free, v_free = ring
    step0 = 0 if step0 is None else step0
    if stages == 1:
        # One K/V buffer: the slot is 0. A constant slot makes every wgmma descriptor of the loop
        # loop-invariant (40 64-bit values at hd 256, 128-key blocks); LLVM hoists them out of the KV
        # loop and ptxas spills them (pallas_kernels/NOTES.md, v12). ``step & zero`` is 0 too, but
        # LLVM cannot see that, so the descriptors are computed in the loop, as with 2 stages.
        slot_of = lambda ki: lax.bitwise_and(step0 + ki, zero)
    else:
        slot_of = lambda ki: lax.rem(step0 + ki, stages)
    first_slot = slot_of(0)

    @pl.when(n_steps > 0)
    def _():
        plgpu.barrier_wait(k_ready.at[first_slot])

    sync = functools.partial(_sync, schedule)
    if schedule is not None:
        pl.when(wg == 1)(sync)  # wg 1 starts half a step behind wg 0: ping-pong
    if cfg.overlap:
        steps = functools.partial(_overlap_steps, q_smem, p_smem, kend_row, n_open=n_open,
                                  n_steps=n_steps, ring=ring, schedule=schedule, slot_of=slot_of,
                                  cfg=cfg, scale_log2=scale_log2, on_last_qk=on_last_qk)
        carry = lax.cond(n_steps > 0, steps, lambda c: c, carry)
        if schedule is not None:
            pl.when(wg == 0)(sync)
        return carry

    # A step's rendezvous: after our QK^T issue (the other consumer may issue its wgmma), after our
    # softmax (before our PV). alternate_gemms adds two: after our PV issue (the other's PV may go)
    # and before our next QK^T (once the other's PV is issued): wgmmas go QK^T_0 QK^T_1 PV_0 PV_1.
    turns = cfg.alternate_gemms
    pv_issued = functools.partial(_arrive, schedule) if turns else lambda: None

    def step(ki, carry, masked: bool):
        acc, m_i, l_i = carry
        slot = slot_of(ki)

        def qk(acc_ref):
            plgpu.wgmma(acc_ref, q_smem, k_smem.at[slot].T)
            sync()                   # let the other warpgroup issue its wgmma
            return acc_ref[...]
        s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
        plgpu.barrier_arrive(k_free.at[slot])
        if on_last_qk is not None:
            pl.when(ki == n_steps - 1)(on_last_qk)
        m_new, alpha, p = _scores_to_p(s, m_i, kend_row, ki, masked, scale_log2, cfg.lazy_rescale)
        l_i = l_i * alpha + p.sum(axis=1)
        acc = _rescaled(acc, alpha, cfg)
        if _fp8(k_smem):  # Mosaic's barrier takes no 2 x 8-bit registers: P converts after it
            acc, l_i, m_new, p = lax.optimization_barrier((acc, l_i, m_new, p))
            p_lo = _fp8_a_operand(p) if cfg.fp8_p_in_regs else p.astype(k_smem.dtype)
        else:
            p_lo = p.astype(k_smem.dtype)
            acc, l_i, m_new, p_lo = lax.optimization_barrier((acc, l_i, m_new, p_lo))
        _arrive(schedule)     # softmax done: our PV may go after the other's QK
        plgpu.barrier_wait(v_ready.at[slot])
        _wait(schedule)

        def wait_next_k():
            @pl.when(ki + 1 < n_steps)
            def _():
                plgpu.barrier_wait(k_ready.at[slot_of(ki + 1)])

        if p_smem is not None:  # interpretable, or float8 (8-bit A operands are read from SMEM here)
            p_smem[...] = p_lo
            plgpu.commit_smem()
        p_op = p_lo if p_smem is None else p_smem
        if cfg.interpretable:
            def pv(acc_ref):
                plgpu.wgmma(acc_ref, p_smem, _v_operand(v_smem, slot))
                pv_issued()
                wait_next_k()
                return acc_ref[...]
            acc = acc + pl.run_scoped(pv, plgpu.ACC(acc.shape, jnp.float32))
        else:
            def pv(acc_ref):
                plgpu.wgmma(acc_ref, p_op, _v_operand(v_smem, slot))
                pv_issued()
                wait_next_k()
            acc = pl.run_state(pv)(plgpu.ACC.init(acc))
        plgpu.barrier_arrive(v_free.at[slot])
        if turns:
            _wait(schedule)   # the other consumer is past its softmax ...
            sync()            # ... and has issued its PV: our next QK^T goes after it
        return acc, m_new, l_i

    carry = lax.fori_loop(0, n_open, functools.partial(step, masked=False), carry)
    acc, m_i, l_i = lax.fori_loop(n_open, n_steps, functools.partial(step, masked=True), carry)
    if schedule is not None:
        pl.when(wg == 0)(sync)
    return acc, m_i, l_i


def _store_tile(acc, m_i, l_i, kend_row, o_smem, lse_smem, o_gmem, lse_gmem):
    """Normalizes the tile into SMEM and starts its O and LSE TMA stores; rows that saw no key
    get 0 and ``lse = -inf``."""
    seen = kend_row > 0
    inv_l = jnp.where(seen, 1.0 / jnp.where(seen, l_i, 1.0), 0.0)
    inv_l = lax.broadcast_in_dim(inv_l, acc.shape, [0])
    # A select, not just the 0 factor: a row that saw only masked scores has p = exp2(the rounding
    # error of the s * c - m FMA), which is inf for some scales (hd 64, 256), so its acc is inf/NaN.
    o_smem[...] = jnp.where(inv_l > 0, acc * inv_l, 0.0).astype(o_smem.dtype)
    lse_smem[...] = jnp.where(seen, m_i * _LN2 + jnp.log(jnp.where(seen, l_i, 1.0)), -jnp.inf)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem)
    plgpu.copy_smem_to_gmem(lse_smem, lse_gmem)


def _load_kend_row(kend_ref, bi, q_base, bq: int):
    return plgpu.load(kend_ref.at[bi, pl.ds(q_base, bq)], layout=_ROW, optimized=False)


# The static masks ``flash_attention_fwd(..., causal=...)`` takes instead of a ``k_end`` array: the
# same names and rows as ``key_end(B, T, S, causal=...)`` without lengths, and the offset of their
# formula ``k_end[t] = clip(t + 1 + offset, 0, S)`` (None: every row sees all S keys).
STATIC_MASKS = ("none", "top_left", "bottom_right")


@dataclasses.dataclass(frozen=True)
class _KeyEnds:
    """Where the kernels read ``k_end`` from. Array form (``mask`` None): ``refs = (kend [B, Tp],
    kmin [B, tiles], kmax [B, tiles])`` in GMEM, from ``key_end`` and ``tile_key_bounds``. Static form:
    ``refs = (zero [1],)``, and each tile's bounds and row are arithmetic on its index, so no XLA op
    runs before the kernel and no consumer waits on a GMEM load between items (``STATIC_MASKS``)."""
    refs: tuple
    mask: str | None = None
    T: int = 0      # the caller's query rows (the kernel's may be padded)
    S: int = 0      # the caller's keys
    rows: int = 0   # query rows per tile
    zero_value: object = None  # static form: ``refs[0][0]``, read once at the kernel's start

    def _offset(self):
        return {"none": None, "top_left": 0, "bottom_right": self.S - self.T}[self.mask]

    def tile(self, bi, qi):
        """``(kmin, kmax)`` of tile ``qi`` of sequence ``bi`` (``tile_key_bounds``): the smallest and
        largest ``k_end`` of its real rows, which for a static mask are its first and last."""
        if self.mask is None:
            return self.refs[1][bi, qi], self.refs[2][bi, qi]
        if (off := self._offset()) is None:
            return jnp.int32(self.S), jnp.int32(self.S)
        first = qi * self.rows
        last = jnp.minimum(first + self.rows, self.T) - 1
        return tuple(jnp.clip(t + 1 + off, 0, self.S) for t in (first, last))

    def row(self, bi, q_base, bq: int):
        """``k_end`` of rows ``q_base ...`` (``bq`` of them) in the softmax's row layout. Static masks
        give rows past T (padding, never returned) their formula's value; their keys stay within the
        tile's steps, which only real rows bound."""
        if self.mask is None:
            return _load_kend_row(self.refs[0], bi, q_base, bq)
        if (off := self._offset()) is None:
            return plgpu.layout_cast(jnp.full((bq,), self.S, jnp.int32), _ROW)
        t = plgpu.broadcasted_iota(jnp.int32, (bq,), 0, layout=_ROW) + q_base
        return jnp.clip(t + 1 + off, 0, self.S)

    def zero(self, bi, q_base):
        """0, read from memory, which the compiler cannot fold (``_attend``'s ring slot with
        ``num_stages=1``): ``k_end`` is clipped to [0, S], so its sign bit is 0; the static form
        reads its ``zero`` input."""
        if self.mask is None:
            return lax.shift_right_arithmetic(self.refs[0][bi, q_base], 31)
        return self.zero_value


# ---------------------------------------------------------------- one CTA per (q tile, batch, head)
def _kernel(q_ref, k_ref, v_ref, keys: _KeyEnds, o_ref, lse_ref, scoped, *,
            cfg: TuningConfig, n_rep: int, scale_log2: float, n_kv_blocks: int, n_tiles: int):
    bq, bkv, stages = cfg.block_q, cfg.block_kv, cfg.num_stages
    (q_smem2, k_smem, v_smem, lse_smem2, p_smem2, o_smem2), (k_ready, v_ready, q_ready), \
        (k_free, v_free), schedule = scoped
    ring = (k_smem, v_smem, k_ready, v_ready, k_free, v_free)
    hi, bi, wg = (lax.axis_index(n) for n in ("heads", "batch", "wg"))
    qi = n_tiles - 1 - lax.axis_index("q_tiles")  # longest (causal) tiles first
    n_steps, n_open = _kv_range(*keys.tile(bi, qi), bkv, n_kv_blocks)

    n_wg, (regs, producer_regs) = cfg.consumers, _REGISTERS[cfg.consumers]

    @pl.when(wg < n_wg)
    def _consumer():
        plgpu.set_max_registers(regs, action="increase")
        q_smem, lse_smem = q_smem2.at[wg], lse_smem2.at[wg]
        q_base = (n_wg * qi + wg) * bq
        plgpu.copy_gmem_to_smem(q_ref.at[bi, pl.ds(q_base, bq), hi], q_smem, q_ready.at[wg])
        kend_row = keys.row(bi, q_base, bq)
        zero = keys.zero(bi, q_base) if stages == 1 else None  # loaded while Q arrives
        carry = _init_carry(bq, q_smem.shape[-1])
        plgpu.barrier_wait(q_ready.at[wg])
        acc, m_i, l_i = _attend(q_smem, None if p_smem2 is None else p_smem2.at[wg], kend_row, carry,
                                n_open, n_steps, ring, schedule, wg=wg, cfg=cfg, scale_log2=scale_log2,
                                zero=zero)
        o_smem = q_smem if o_smem2 is None else o_smem2.at[wg]   # float8: O tiles of their own
        _store_tile(acc, m_i, l_i, kend_row, o_smem, lse_smem, o_ref.at[bi, pl.ds(q_base, bq), hi],
                    lse_ref.at[bi, hi, pl.ds(q_base, bq)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    @pl.when(wg == n_wg)
    def _producer():
        plgpu.set_max_registers(producer_regs, action="decrease")
        gi = lax.div(hi, n_rep)
        kv = lambda ki: (bi, pl.ds(ki * bkv, bkv), gi)
        load_k = lambda ki, slot: plgpu.copy_gmem_to_smem(k_ref.at[kv(ki)], k_smem.at[slot], k_ready.at[slot])
        load_v = lambda ki, slot: plgpu.copy_gmem_to_smem(_v_block(v_ref, bi, ki, gi, bkv), v_smem.at[slot],
                                                          v_ready.at[slot])
        _produce(n_steps, stages, ((load_k, k_free), (load_v, v_free)))


# ---------------------------------------------------------------- persistent: CTAs loop over items
def _persistent_kernel(q_ref, k_ref, v_ref, keys: _KeyEnds, *refs, cfg: TuningConfig,
                       n_rep: int, scale_log2: float, n_kv_blocks: int, n_tiles: int, n_batch: int,
                       n_heads: int, n_ctas: int, o_tiles: int):
    """``refs``: ``[order_ref,] o_ref, lse_ref, scoped`` (``order_ref`` with ``cfg.balanced``);
    ``o_tiles``: O staging tiles (``TuningConfig.o_tile_count``)."""
    bq, bkv, stages = cfg.block_q, cfg.block_kv, cfg.num_stages
    *order_refs, o_ref, lse_ref, scoped = refs
    order_ref = order_refs[0] if cfg.balanced else None
    (q_smem2, k_smem, v_smem, lse_smem2, p_smem2, o_smem2), (k_ready, v_ready, q_ready), \
        (k_free, v_free), q_free, schedule = scoped
    ring = (k_smem, v_smem, k_ready, v_ready, k_free, v_free)
    cta, wg = lax.axis_index("cta"), lax.axis_index("wg")
    n_items = lax.div(n_tiles * n_batch * n_heads - 1 - cta, n_ctas) + 1  # items cta, cta + n_ctas, ...

    def item_ids(j):
        """``(qi, bi, hi)`` of this CTA's j-th item (``item``)."""
        w = cta + j * n_ctas
        return _item_tile(order_ref[w] if order_ref is not None else w, n_tiles, n_heads)

    def item(j):
        """``(qi, bi, hi, n_open, n_steps)`` of this CTA's j-th item. Item order: batch slowest, then
        head, then q tile fastest, so the CTAs running at one time share a few heads' K/V in L2 (the
        first version put the q tile slowest: ~132 heads' K/V then streamed from HBM at once and
        short-S rows were bandwidth-bound, pallas_kernels/NOTES.md). The q tiles of a head run
        longest-first and of the next head shortest-first (a zigzag), so in causal attention a CTA,
        which takes every ``n_ctas``-th item, gets long and short tiles alike. ``balanced``: the
        CTA's j-th item is ``order[cta + j * n_ctas]`` instead (``_balanced_order``)."""
        qi, bi, hi = item_ids(j)
        n_steps, n_open = _kv_range(*keys.tile(bi, qi), bkv, n_kv_blocks)
        return qi, bi, hi, n_open, n_steps

    n_wg, (regs, producer_regs) = cfg.consumers, _REGISTERS[cfg.consumers]

    n_q = cfg.q_tiles

    def q_tile(j, w):  # (Q SMEM tile, its q_ready barrier) of consumer w's j-th item
        if not cfg.spare_q:
            return w, w
        slot = lax.rem(n_wg * j + w, n_q)   # item-consumer pairs take the tiles in turn
        return slot, w * n_q + slot         # a barrier per (consumer, tile): each waits every phase

    @pl.when(wg < n_wg)
    def _consumer():
        plgpu.set_max_registers(regs, action="increase")
        lse_smem = lse_smem2.at[wg]
        p_smem = None if p_smem2 is None else p_smem2.at[wg]

        def fetch(j):
            """Item j's ids and this consumer's loads from GMEM: the tile's k_end min / max and
            its ``k_end`` row (only loads: the arithmetic on them runs where they are used; a static
            mask computes them instead)."""
            qi, bi, hi = item_ids(j)
            q_base = (n_wg * qi + wg) * bq
            return (qi, bi, hi, *keys.tile(bi, qi), keys.row(bi, q_base, bq))

        def run_item(j, carry):
            step0, ahead = carry
            if cfg.prefetch:  # item j's loads were issued one item back; issue item j + 1's
                (qi, bi, hi, kmin, kmax, kend_row), ahead = ahead, fetch(jnp.minimum(j + 1, n_items - 1))
            else:             # their latency is on the way from one item to the next
                qi, bi, hi, kmin, kmax, kend_row = fetch(j)
            n_steps, n_open = _kv_range(kmin, kmax, bkv, n_kv_blocks)
            slot, ready = q_tile(j, wg)
            q_smem = q_smem2.at[slot]
            o_smem = o_smem2.at[wg] if o_tiles else q_smem
            release_q = lambda: plgpu.barrier_arrive(q_free.at[slot])
            q_base = (n_wg * qi + wg) * bq
            zero = keys.zero(bi, q_base) if stages == 1 else None  # loaded while Q arrives
            carry = _init_carry(bq, q_smem.shape[-1])
            plgpu.barrier_wait(q_ready.at[ready])
            acc, m_i, l_i = _attend(q_smem, p_smem, kend_row, carry, n_open, n_steps, ring, schedule,
                                    wg=wg, cfg=cfg, scale_log2=scale_log2, step0=step0,
                                    on_last_qk=release_q if o_tiles else None, zero=zero)
            if o_tiles:
                pl.when(n_steps == 0)(release_q)   # no QK^T ran: q_smem was not read
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # last item's stores left o/lse_smem
            _store_tile(acc, m_i, l_i, kend_row, o_smem, lse_smem,
                        o_ref.at[bi, pl.ds(q_base, bq), hi], lse_ref.at[bi, hi, pl.ds(q_base, bq)])
            if not o_tiles:
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # O (in q_smem) read out
                release_q()
            return step0 + n_steps, ahead

        lax.fori_loop(0, n_items, run_item, (jnp.int32(0), fetch(0) if cfg.prefetch else ()))
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    @pl.when(wg == n_wg)
    def _producer():
        plgpu.set_max_registers(producer_regs, action="decrease")
        # q_free completes when the item's Q SMEM may be refilled: at its last QK^T with O tiles of
        # its own (then Q goes first, after one K/V block with prefetch), after its O store otherwise
        # (then the first K/V blocks go first).
        # spare_q: Q of pair n = (item j, consumer w), n = n_wg * j + w, goes to tile n % n_q, freed by
        # pair n - n_q's O store. Item j loads its first K/V block, then Q of pairs (j, 1..), freed as
        # the previous item's first consumers finish, the rest of its K/V, then Q of pair (j + 1, 0),
        # whose tile has been free since item j - 1 ended: a consumer's next Q is in SMEM before it
        # stores O, and no Q load waits on the item it precedes.
        # prefetch with O tiles: the item's first K/V block goes first, its slot is free a step before
        # the Q tiles are (pallas_kernels/NOTES.md, v14).
        lead = int(cfg.prefetch) if o_tiles else (1 if cfg.spare_q else stages)

        def load_kv(step, ki, bi, gi):  # ``step`` counts K/V blocks over all of this CTA's items
            slot, kv = lax.rem(step, stages), (bi, pl.ds(ki * bkv, bkv), gi)
            pl.when(step >= stages)(lambda: plgpu.barrier_wait(k_free.at[slot]))
            plgpu.copy_gmem_to_smem(k_ref.at[kv], k_smem.at[slot], k_ready.at[slot])
            pl.when(step >= stages)(lambda: plgpu.barrier_wait(v_free.at[slot]))
            plgpu.copy_gmem_to_smem(_v_block(v_ref, bi, ki, gi, bkv), v_smem.at[slot], v_ready.at[slot])

        def load_q(j, w, qi, bi, hi):  # Q of consumer w's j-th item, once its tile is free
            slot, ready = q_tile(j, w)
            pl.when(n_wg * j + w >= n_q)(lambda: plgpu.barrier_wait(q_free.at[slot]))
            plgpu.copy_gmem_to_smem(q_ref.at[bi, pl.ds((n_wg * qi + w) * bq, bq), hi],
                                    q_smem2.at[slot], q_ready.at[ready])

        def run_item(j, step0):
            qi, bi, hi, _, n_steps = item(j)
            gi = lax.div(hi, n_rep)
            kv_steps = lambda lo, up: pl.loop(lo, up)(lambda ki: load_kv(step0 + ki, ki, bi, gi))
            n_lead = jnp.minimum(n_steps, lead)
            if lead:
                kv_steps(0, n_lead)
            if cfg.spare_q:
                pl.when(j == 0)(lambda: load_q(j, 0, qi, bi, hi))
            for w in range(1 if cfg.spare_q else 0, n_wg):
                load_q(j, w, qi, bi, hi)
            kv_steps(n_lead, n_steps)
            if cfg.spare_q:
                pl.when(j + 1 < n_items)(lambda: load_q(j + 1, 0, *item(j + 1)[:3]))
            return step0 + n_steps

        n_total = lax.fori_loop(0, n_items, run_item, jnp.int32(0))

        @pl.loop(jnp.maximum(n_total - stages, 0), n_total)
        def _(step):  # observe the last releases too, so no barrier phase is left pending at exit
            plgpu.barrier_wait(k_free.at[lax.rem(step, stages)])
            plgpu.barrier_wait(v_free.at[lax.rem(step, stages)])

        # ... and the last release of every Q tile (pairs n_wg * n_items - n_q ... - 1; fewer if the
        # CTA has fewer pairs than tiles, e.g. the spare tile of a one-item CTA is never used)
        n_pairs = n_wg * n_items
        for back in range(n_q):
            n = n_pairs - n_q + back
            pl.when(n >= 0)(lambda: plgpu.barrier_wait(q_free.at[lax.rem(n, n_q)]))


def _balanced_order(kmax_BN, cfg: TuningConfig, n_kv_blocks: int, n_heads: int, n_ctas: int):
    """``order[i]`` (int32, over all items) for ``TuningConfig(balanced=True)``: CTA c runs items
    ``order[c], order[c + n_ctas], ...``. Items (in ``item``'s base order) are sorted by their KV
    steps, longest first (stable: equal items keep the base order and its L2 locality), and dealt
    in snake order, anchored at the end: the last full round gives its ``n_ctas`` items to CTAs
    n_ctas - 1, ..., 0 (its largest to the last CTA), the round before it to 0, 1, ..., and so on
    back, so per-CTA work evens out (greedy LPT). The last, partial round can only go to CTAs 0, 1,
    ... (CTA c has the items c, c + n_ctas, ...), which the last full round gave its smallest items.
    Counting KV steps + 2 per item (``benchmarks/fa3_waves.py``): causal 8k at hd 128, the plain round
    robin leaves one CTA 1.44x the mean work, this 1.001x; hd 256 causal 4k / 8k 1.002x / 1.000x, where
    the snake anchored at the start (before NOTES v18) left 1.031x, the partial round landing on the
    CTAs that had the largest items."""
    steps = _item_steps(kmax_BN, cfg.block_kv, n_kv_blocks, n_heads)
    w = jnp.arange(steps.shape[0], dtype=jnp.int32)
    by_work = jnp.argsort(-steps, stable=True)
    rnd, c = w // n_ctas, w % n_ctas
    full = w.shape[0] // n_ctas
    snake = ((full - 1 - rnd) % 2 == 0) & (rnd < full)
    return by_work[jnp.where(snake, rnd * n_ctas + n_ctas - 1 - c, w)].astype(jnp.int32)


def v_swizzle(block_kv: int, itemsize: int = 2) -> int:
    """V's SMEM swizzle in bytes: the largest of 128, 64 and 32 whose width in elements divides
    block_kv. Mosaic GPU issues PV's wgmma in K groups as wide as the swizzle (K = block_kv keys), so
    128-byte swizzle, the widest, needs 64 | block_kv; 64-byte takes 96 or 160, 32-byte 80 or 176
    (FA3's tiles at hd 256 and 128). Q and K keep the widest swizzle their head dim allows."""
    return next(s for s in (128, 64, 32) if block_kv % (s // itemsize) == 0)


def _smem_tiled(shape, dtype, swizzle: int | None = None):
    """SMEM with the widest swizzle the minor dim allows (or ``swizzle`` bytes) and its 8-row tiling."""
    swizzle = swizzle or plgpu.find_swizzle(shape[-1] * jnp.dtype(dtype).itemsize * 8)
    tiling = plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize))
    return plgpu.SMEM(shape, dtype, transforms=(tiling, plgpu.SwizzleTransform(swizzle)))


def _build_forward(B: int, T: int, H: int, S: int, G: int, d: int, dtype, cfg: TuningConfig,
                   scale: float, mask: str | None = None, real_T: int = 0, real_S: int = 0):
    """Returns ``fwd(q, k, v, *key_ends[, order]) -> (o_BTHd, lse_BHTp)``:
    ``key_ends`` is ``(kend_BTp, kmin_BN, kmax_BN)``, or with a static ``mask`` (``STATIC_MASKS``;
    ``real_T`` / ``real_S``: the caller's lengths, T / S here may be padded) one int32 zero [1]
    (``_KeyEnds``); ``order`` from ``_balanced_order`` with ``cfg.balanced``."""
    n_tiles, n_wg = pl.cdiv(T, cfg.rows), cfg.consumers
    stages = cfg.num_stages
    common = dict(cfg=cfg, n_rep=H // G, scale_log2=scale * _LOG2E,
                  n_kv_blocks=pl.cdiv(S, cfg.block_kv), n_tiles=n_tiles)
    itemsize = jnp.dtype(dtype).itemsize
    o_tiles = cfg.o_tile_count(d, itemsize)
    o_dtype = _out_dtype(dtype)
    n_ctas = min(cfg.num_ctas, n_tiles * B * H)
    if cfg.persistent:
        kernel = functools.partial(_persistent_kernel, **common, n_batch=B, n_heads=H, n_ctas=n_ctas,
                                   o_tiles=o_tiles)
        grid, grid_names = (n_ctas,), ("cta",)
    else:
        kernel = functools.partial(_kernel, **common)
        grid, grid_names = (H, B, n_tiles), ("heads", "batch", "q_tiles")
    n_keys = 3 if mask is None else 1

    def body(q_ref, k_ref, v_ref, *refs):
        keys = _KeyEnds(refs[:n_keys], mask, real_T, real_S, cfg.rows, None if mask is None else refs[0][0])
        return kernel(q_ref, k_ref, v_ref, keys, *refs[n_keys:])

    pv_swizzle = v_swizzle(cfg.block_kv, itemsize)  # PV's A and B share it
    # float8: V staged as V^T [d, block_kv] (8-bit wgmma operands are K-major), P through SMEM
    v_tile = (d, cfg.block_kv) if itemsize == 1 else (cfg.block_kv, d)

    def entry(*refs):
        scratch = (
            _smem_tiled((cfg.q_tiles, cfg.block_q, d), dtype),
            _smem_tiled((stages, cfg.block_kv, d), dtype),
            _smem_tiled((stages, *v_tile), dtype, pv_swizzle),
            plgpu.SMEM((n_wg, cfg.block_q), jnp.float32),
            _smem_tiled((n_wg, cfg.block_q, cfg.block_kv), dtype, pv_swizzle) if cfg._p_tiles(itemsize) else None,
        )
        barriers = (plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=stages),
                    plgpu.Barrier(num_barriers=cfg.q_ready_barriers))
        free = (plgpu.Barrier(num_arrivals=n_wg, num_barriers=stages),) * 2
        q_free = ()
        # + the O tiles (persistent where they fit, float8 always)
        scratch += (_smem_tiled((n_wg, cfg.block_q, d), o_dtype) if o_tiles else None,)
        if cfg.persistent:  # q_free: a consumer warpgroup's Q SMEM may be refilled
            q_free = (plgpu.Barrier(num_barriers=cfg.q_tiles),)
        # The ping-pong's rendezvous pairs two consumers; three run without one (``schedule`` None).
        schedule = (plgpu.Barrier(num_arrivals=2),) if n_wg == 2 else ()
        pl.run_scoped(lambda *s: body(*refs, s if schedule else (*s, None)), scratch, barriers, free,
                      *q_free, *schedule, collective_axes="wg")

    return plgpu.kernel(
        entry,
        out_type=(jax.ShapeDtypeStruct((B, T, H, d), o_dtype),
                  jax.ShapeDtypeStruct((B, H, n_tiles * cfg.rows), jnp.float32)),
        grid=grid, grid_names=grid_names,
        num_threads=n_wg + 1, thread_name="wg", kernel_name="fa3_fwd",
        # No cross-warp reductions here (row max / sum stay within a warp's quads): the 2 KiB of SMEM
        # Mosaic GPU reserves for them by default would keep 192-key blocks at hd 128 and a 3-deep
        # ring of 128-key blocks out.
        compiler_params=plgpu.CompilerParams(approx_math=True, reduction_scratch_bytes=0))


def key_end(B: int, T: int, S: int, *, causal: str = "none", kv_lens_B=None, q_lens_B=None,
            q_pos_BT=None) -> jax.Array:
    """``k_end[b, t]``: query row t of sequence b sees key slots ``s < k_end[b, t]``.

    causal: "none"; "top_left" (prefill: row t sees keys <= t); "bottom_right" (the T queries are
    the last of ``kv_lens`` keys, as when appending to a KV cache); "positions" (row t sees keys
    ``<= q_pos_BT[b, t]``, the model's rule). ``kv_lens_B`` (default S) caps every row; rows at or
    past ``q_lens_B`` (default T) are padding and see nothing.
    """
    kv = jnp.full((B,), S, jnp.int32) if kv_lens_B is None else jnp.asarray(kv_lens_B, jnp.int32)
    ql = jnp.full((B,), T, jnp.int32) if q_lens_B is None else jnp.asarray(q_lens_B, jnp.int32)
    t = jnp.arange(T, dtype=jnp.int32)[None, :]
    end = {"none": lambda: jnp.broadcast_to(kv[:, None], (B, T)),
           "top_left": lambda: t + 1,
           "bottom_right": lambda: kv[:, None] - ql[:, None] + t + 1,
           "positions": lambda: jnp.asarray(q_pos_BT, jnp.int32) + 1}
    if causal not in end or (causal == "positions") != (q_pos_BT is not None):
        raise ValueError(f"causal must be one of {sorted(end)} (q_pos_BT given iff 'positions'), "
                         f"got causal={causal!r}, q_pos_BT given: {q_pos_BT is not None}")
    end_BT = jnp.clip(jnp.minimum(end[causal](), kv[:, None]), 0, S)
    return jnp.where(t < ql[:, None], end_BT, 0).astype(jnp.int32)


def _check(q, k, v, kend):
    (B, T, H, d), (Bk, _, G, dk) = q.shape, k.shape
    if k.shape != v.shape or (Bk, dk) != (B, d) or H % G or kend.shape != (B, T):
        raise ValueError(f"expected q [B,T,H,d], k = v [B,S,G,d] with H % G == 0, k_end [B,T]; got "
                         f"q {q.shape}, k {k.shape}, v {v.shape}, k_end {kend.shape}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (jnp.bfloat16, jnp.float16, jnp.float8_e4m3fn):
        raise ValueError(f"q, k, v must share dtype bfloat16, float16 or float8_e4m3fn, got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    if d not in (64, 128, 256):
        raise ValueError(f"head dim must be 64, 128 or 256, got {d}")


def tile_key_bounds(kend_BTp, T: int, S: int, rows: int):
    """``(kmin, kmax)`` [B, tiles]: the smallest and largest ``k_end`` of each ``rows``-row tile of the
    padded ``k_end`` [B, tiles * rows]; rows past T (padding, never stored) do not lower the minimum."""
    B, Tp = kend_BTp.shape
    tiles = kend_BTp.reshape(B, Tp // rows, rows)
    real = (jnp.arange(Tp) < T).reshape(1, Tp // rows, rows)
    return jnp.where(real, tiles, S).min(-1), tiles.max(-1)


def padded_key_ends(kend_BT, T: int, S: int, rows: int):
    """``(kend [B, tiles * rows], kmin, kmax [B, tiles])``: ``kend_BT`` clipped to [0, S] and padded to
    whole ``rows``-row tiles, and its tiles' bounds (``tile_key_bounds``), as the kernels read them."""
    n_tiles = -(-T // rows)
    kend = jnp.pad(jnp.clip(kend_BT.astype(jnp.int32), 0, S), ((0, 0), (0, n_tiles * rows - T)))
    return (kend, *tile_key_bounds(kend, T, S, rows))


@functools.partial(jax.jit, static_argnames=("causal", "scale", "config"))
def flash_attention_fwd(q_BTHd, k_BSGd, v_BSGd, kend_BT=None, *, causal: str | None = None,
                        scale: float | None = None, config: TuningConfig | None = None):
    """Jitted entry: ``(o [B,T,H,d], lse [B,H,T] natural log, float32)``; o has the inputs' dtype,
    bfloat16 for float8_e4m3fn inputs (forward only: no VJP; dequantization scales of q and k fold
    into ``scale``, v's multiplies o; V is transposed by XLA before the kernel). The mask is either
    ``kend_BT`` (``key_end``: any lengths and offsets) or ``causal``, one of ``STATIC_MASKS``, which is
    ``key_end(B, T, S, causal=causal)`` computed inside the kernel: no XLA op before it and no
    ``k_end`` loads in it, with the same outputs. ``config`` defaults to ``default_config(d, S, causal)``
    (``fp8_config(d, S, causal)`` for float8) with ``causal`` true for a causal static mask; with
    ``kend_BT`` to the non-causal tuning for arrays (``mask_array=True``), so causal callers of that
    form pass ``default_config(d, S, causal=True, mask_array=True)`` (the mask itself always comes
    from ``kend_BT`` or ``causal``)."""
    if (kend_BT is None) == (causal is None) or (causal is not None and causal not in STATIC_MASKS):
        raise ValueError(f"pass either kend_BT (a [B, T] int32 array, see key_end) or causal, one of "
                         f"{STATIC_MASKS}; got kend_BT {'None' if kend_BT is None else 'given'}, "
                         f"causal={causal!r}")
    (B, T, H, d), (S, G) = q_BTHd.shape, k_BSGd.shape[1:3]
    _check(q_BTHd, k_BSGd, v_BSGd, jax.ShapeDtypeStruct((B, T), jnp.int32) if kend_BT is None else kend_BT)
    itemsize = jnp.dtype(q_BTHd.dtype).itemsize
    is_causal = causal not in (None, "none")
    cfg = config or (fp8_config(d, S, is_causal) if itemsize == 1
                     else default_config(d, S, causal=is_causal, mask_array=kend_BT is not None))
    cfg.check_head_dim(d, itemsize)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    rows = cfg.rows
    n_tiles = pl.cdiv(T, rows)
    # TMA needs sequence dims that are multiples of its 8-row tiles and at least one box long:
    # only lengths breaking that are padded (a copy); other tails are zero-filled by TMA itself.
    # float8: V^T's minor dim is S, which TMA wants a whole number of the tile's swizzled rows (up to
    # 128 keys): S is padded to whole KV blocks.
    up8 = lambda n: -(-n // 8) * 8
    Sk = -(-S // cfg.block_kv) * cfg.block_kv if itemsize == 1 else up8(S)
    Tq, Sk = max(up8(T), rows), max(Sk, cfg.block_kv * cfg.num_stages)
    q = jnp.pad(q_BTHd, ((0, 0), (0, Tq - T), (0, 0), (0, 0))) if Tq > T else q_BTHd
    pad_kv = lambda x: jnp.pad(x, ((0, 0), (0, Sk - S), (0, 0), (0, 0))) if Sk > S else x
    v_in = jnp.transpose(pad_kv(v_BSGd), (0, 2, 3, 1)) if itemsize == 1 else pad_kv(v_BSGd)  # V^T [B, G, d, S]
    if cfg.fp8_p_in_regs:  # the keys in _fp8_a_operand's order (the same XLA copy; S is whole KV blocks)
        v_in = _fp8_keys_permuted(v_in)
    if causal is not None and not cfg.kernel_mask:
        kend_BT, causal = key_end(B, T, S, causal=causal), None

    def arrays(kend_BT):
        key_ends = padded_key_ends(kend_BT, T, S, rows)
        order = (_balanced_order(key_ends[2], cfg, pl.cdiv(Sk, cfg.block_kv), H, min(cfg.num_ctas, n_tiles * B * H)),
                 ) if cfg.balanced else ()
        return key_ends, order

    if causal is None:
        key_ends, order = arrays(kend_BT)
    else:  # the balanced order from the static mask's arrays at trace time: constants, no kernel makes them
        with jax.ensure_compile_time_eval():
            order = tuple(map(np.asarray, arrays(key_end(B, T, S, causal=causal))[1]))
        key_ends = (np.zeros((1,), np.int32),)
    fwd = _build_forward(B, Tq, H, Sk, G, d, q.dtype, cfg, scale, causal, T, S)
    o, lse = fwd(q, pad_kv(k_BSGd), v_in, *key_ends, *order)
    return o[:, :T], lse[:, :, :T]


def flash_attention_reference(q_BTHd, k_BSGd, v_BSGd, kend_BT, *, scale: float | None = None):
    """Pure JAX, float32 softmax: ``(o [B,T,H,d] in q's dtype (bfloat16 for float8), lse [B,H,T] float32)``."""
    (B, T, H, d), (S, G) = q_BTHd.shape, k_BSGd.shape[1:3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q_BTHd.astype(jnp.float32).reshape(B, T, G, H // G, d)
    s = jnp.einsum("btgrd,bsgd->bgrts", q, k_BSGd.astype(jnp.float32)) * scale
    mask = (jnp.arange(S)[None, None, :] < kend_BT[:, :, None])[:, None, None]
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)
    l = e.sum(-1, keepdims=True)
    p = e / jnp.where(l > 0, l, 1.0)
    o = jnp.einsum("bgrts,bsgd->btgrd", p, v_BSGd.astype(jnp.float32)).reshape(B, T, H, d)
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)[..., 0]
    return o.astype(_out_dtype(q_BTHd.dtype)), lse.reshape(B, H, T)


def main(argv=None) -> None:
    """Time one FA3-paper shape (16k tokens, H*d = 2048) or, with --small, run one tiny checked
    call (what benchmarks/fa3_racecheck_gpu.sh points compute-sanitizer at; with ``--schedule persistent
    --num-ctas 2`` each CTA runs several items). Its racecheck misses races between Mosaic GPU warpgroups
    (NOTES.md "Race checks"): the interpreter's race tests are the check."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=None, help="default 128 (64 with --small)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--schedule", choices=("default", "grid", "persistent"), default="default",
                    help="default: default_config's pick for this length; grid: one CTA per tile")
    ap.add_argument("--num-ctas", type=int, default=132, help="CTAs of the persistent grid")
    ap.add_argument("--overlap", action="store_true",
                    help="intra-warpgroup overlap, block_kv capped as in overlap_config")
    ap.add_argument("--spare-q", action="store_true",
                    help="persistent only: O in Q's SMEM with a spare Q tile (TuningConfig.spare_q)")
    ap.add_argument("--stages", type=int, default=None, help="K/V ring depth (TuningConfig.num_stages)")
    ap.add_argument("--alternate-gemms", action="store_true",
                    help="wgmma order QK QK PV PV (TuningConfig.alternate_gemms; no --overlap)")
    ap.add_argument("--prefetch", action="store_true",
                    help="persistent only: the next item's k_end loads one item ahead (TuningConfig.prefetch)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the float32 reference (XLA's GPU ops; e.g. under compute-sanitizer)")
    ap.add_argument("--fp8", action="store_true",
                    help="float8_e4m3fn inputs and fp8_config's pick (P in registers; --schedule grid / "
                         "persistent keep its blocks and P form)")
    a = ap.parse_args(argv)
    d = a.head_dim or (64 if a.small else 128)
    B, S = (1, 300) if a.small else (16384 // a.seq, a.seq)
    H = 2 if a.small else 2048 // d
    dtype = jnp.float8_e4m3fn if a.fp8 else jnp.bfloat16
    q, k, v = (jax.random.normal(kk, (B, S, H, d), jnp.float32 if a.fp8 else dtype).astype(dtype)  # bf16: as before
               for kk in jax.random.split(jax.random.key(0), 3))
    mask = "top_left" if a.causal else "none"
    kend = key_end(B, S, S, causal=mask)
    if a.schedule == "default":
        cfg = (fp8_config if a.fp8 else default_config)(d, S, a.causal)
    else:  # float8 keeps fp8_config's blocks and P form (its persistent grid is the balanced one)
        persistent = a.schedule == "persistent"
        cfg = dataclasses.replace(fp8_config(d, S, a.causal) if a.fp8 else default_config(d), persistent=persistent,
                                  balanced=a.fp8 and persistent, num_ctas=a.num_ctas)
    if a.overlap:
        cfg = with_overlap(cfg, d)
    if a.spare_q:
        cfg = dataclasses.replace(cfg, spare_q=True)
    if a.prefetch:
        cfg = dataclasses.replace(cfg, prefetch=True)
    if a.stages or a.alternate_gemms:
        cfg = dataclasses.replace(cfg, num_stages=a.stages or cfg.num_stages, alternate_gemms=a.alternate_gemms)
    fwd = functools.partial(flash_attention_fwd, causal=mask, config=cfg)  # the static mask, as bench_fa3
    o, lse = jax.block_until_ready(fwd(q, k, v))
    if a.no_check:
        check = "not checked (--no-check)"
    else:
        ref = flash_attention_reference(*(x.astype(jnp.float32) for x in (q, k, v)), kend)[0]
        check = f"relative error {float(jnp.linalg.norm(o.astype(jnp.float32) - ref) / jnp.linalg.norm(ref)):.2e}"
    print(f"B={B} S={S} H={H} d={d} {jnp.dtype(dtype).name} causal={a.causal} persistent={cfg.persistent} "
          f"overlap={cfg.overlap} spare_q={cfg.spare_q} block_kv={cfg.block_kv} stages={cfg.num_stages} "
          f"alternate_gemms={cfg.alternate_gemms} prefetch={cfg.prefetch} kernel_mask={cfg.kernel_mask} "
          f"fp8_p_in_regs={cfg.fp8_p_in_regs}: {check}")
    if not a.small:
        from jax.experimental.mosaic.gpu import profiler
        _, ms = profiler.measure(lambda *x: fwd(*x), iterations=20)(q, k, v)
        flops = 4 * B * S * S * H * d / (2 if a.causal else 1)
        print(f"median {np.median(ms):.3f} ms = {flops / np.median(ms) / 1e9:.0f} TFLOPS")


if __name__ == "__main__":
    main()
