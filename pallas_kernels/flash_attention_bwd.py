"""FlashAttention backward for Hopper (sm90) in Pallas Mosaic GPU: a dK/dV kernel and a dQ kernel.

Given the forward's O and log-sum-exp, with ``delta = rowsum(dO * O)`` (XLA, float32) and
``s = scale * q.k``, ``p = exp(s - lse)``:
  dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   dK = scale * dS^T Q,   dQ = scale * dS K.
FA2's split into two kernels (as JAX's ``attention_mgpu`` backward): each recomputes P, so neither
needs atomics or a float32 dQ buffer in GMEM; or FA3's one kernel (``fused_dq``, below).

  * dK/dV kernel, one CTA per (kv head g, batch b, ``2 * block_kv`` keys). wg 2, the producer
    (40 registers), streams through a ring of ``stages_dkv`` SMEM slots the Q and dO blocks of
    ``block_q_dkv`` rows (64; or 128 at head dim 64, whose steps are otherwise four 64 x 64 x 64
    wgmmas) and the ``(lse * log2 e, delta, k_end)`` rows of every (query head r of g's group, q
    block) pair whose rows see any of the CTA's keys (the q-block range comes from XLA, so a causal
    CTA skips the blocks above the diagonal). wg 0 and wg 1 (232 registers) own ``block_kv`` keys
    each, K and V in SMEM, dK and dV accumulating in registers over the steps:
      S^T = K Q^T (SMEM x SMEM), P^T = exp2(S^T * c - lse2) masked by k_end,
      dV += P^T dO and dP^T = V dO^T (issued together), dS^T = P^T * (dP^T - delta), dK += dS^T Q
    (P^T and dS^T are register A operands). GQA needs no reduction afterwards: a CTA runs all the
    query heads of its kv head, so dK/dV come out [B, S, G, d] directly.
  * dQ kernel, one CTA per (head h, batch b, ``2 * block_q`` query rows), the forward's grid: the
    producer streams K/V blocks, the consumers own ``block_q`` rows each, Q, dO in SMEM and
    ``lse2``, ``delta``, ``k_end`` rows in registers:
      S = Q K^T and dP = dO V^T (issued together), P = exp2(S * c - lse2), dS = P * (dP - delta),
      dQ += dS K;
    KV blocks past the tile's largest k_end are never loaded; below its smallest they run unmasked.
  * ``BwdConfig.fused_dq`` (FA3's one kernel; head dims 64 and 128): no dQ kernel. The dK/dV kernel's
    consumers also share their dS^T tiles through SMEM, each forms half of the step's dQ tile over the
    CTA's 128 keys and adds it into a float32 dQ in GMEM by TMA reduce-add; XLA zeroes that buffer
    before and scales and casts it after. 10 S^2 d of matmul work instead of the split's 14, for a
    float32 read-modify-write of dQ per 128 keys in L2.

Masking follows the forward's one rule (key s is visible to row t iff ``s < k_end[b, t]``), so every
mode of ``flash_attention.key_end`` works, and sequence tails need no divisibility (TMA zero-fills
loads and drops stores out of bounds; a zero dO row contributes nothing). Rows that saw no key
(lse = -inf) get dQ = 0 and contribute nothing. Head dims 64, 128 and 256. At 256 a consumer's dK and
dV accumulators together (2 x 64 x 256 float32 over 128 threads) would need 256 registers, so the dK/dV
kernel runs twice: a dV pass (no V tiles, no dP; a deeper ring, ``stages_dv``), then a dK pass. No ping-pong and no
intra-warpgroup overlap (the consumers share the tensor cores as the warp schedulers interleave
them): pallas_kernels/NOTES.md "Backward" has the measurements.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from pallas_kernels.flash_attention import (_LOG2E, _REGISTERS, _SMEM_LIMIT, _check, _kv_range, _load_kend_row,
                                            _produce, _smem_align, _smem_tiled, default_config, flash_attention_fwd,
                                            flash_attention_reference, key_end, padded_key_ends)

_WGMMA = plgpu.Layout.WGMMA
_ROW = plgpu.Layout.WGMMA.reduce(1)   # one value per row of a [64, n] wgmma tile
_COL = plgpu.Layout.WGMMA.reduce(0)   # one value per column
_REGS, _PRODUCER_REGS = _REGISTERS[2]  # setmaxnreg of the two consumers and the producer (the forward's)
_BLOCK = 64                           # rows per consumer warpgroup: one wgmma M tile
# ``fused_dq``'s barriers the two consumers meet at: dS^T stored, by step parity (0, 1); the end (2)
_MEET = 3
HEAD_DIMS = (64, 128, 256)
_TWO_PASSES = (256,)                  # head dims whose dK and dV come from two dK/dV launches


@dataclasses.dataclass(frozen=True)
class BwdConfig:
    """Block sizes of the backward kernels. dK/dV: each consumer owns 64 keys, a step is
    ``block_q_dkv`` query rows of one head, ``stages_dkv`` steps in flight. dQ: each consumer owns 64
    rows, a step is ``block_kv_dq`` keys, ``stages_dq`` in flight. Where dK and dV come from two passes
    (hd 256), ``stages_dv`` is the dV pass's ring (it holds no V tiles, so it fits a deeper one; None:
    ``stages_dkv``). ``fused_dq`` (head dims 64 with 128-row steps, and 128): FA3's one kernel, the
    dK/dV kernel forms dQ too and no dQ kernel runs (``_dkv_kernel``). ``interpretable`` stages the
    register A operands (P^T, dS^T, dS) in SMEM and accumulates wgmma into fresh zeros, which the
    Mosaic GPU interpreter can run; with ``fused_dq`` it also stores each kv tile's dQ part on its own
    instead of reducing it by TMA (the interpreter has no TMA reduction). ``default_bwd_config`` gives
    the tuned blocks per head dim."""
    block_kv_dq: int = 64
    block_q_dkv: int = 64
    stages_dkv: int = 2
    stages_dq: int = 2
    stages_dv: int | None = None
    fused_dq: bool = False
    interpretable: bool = False

    def __post_init__(self):
        if self.block_kv_dq not in (64, 128):
            raise ValueError(f"block_kv_dq must be 64 or 128 (dQ += dS K reads K in 64-key swizzle groups; "
                             f"S and dP of 128 keys already take 128 of a consumer's registers), "
                             f"got {self.block_kv_dq!r}")
        if self.block_q_dkv not in (64, 128):
            raise ValueError(f"block_q_dkv must be 64 or 128 (query rows per dK/dV step: the N of S^T = K Q^T), "
                             f"got {self.block_q_dkv!r}")
        for name in ("stages_dkv", "stages_dq", "stages_dv"):
            n = getattr(self, name)
            if name == "stages_dv" and n is None:
                continue
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 4:
                raise ValueError(f"{name} must be an int from 1 to 4 (SMEM ring depth), got {n!r}")
        for name in ("fused_dq", "interpretable"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def smem_bytes(self, head_dim: int, itemsize: int = 2) -> tuple[int, int]:
        """(dK/dV kernel, dQ kernel) shared memory as Mosaic GPU allocates it: each buffer rounded up
        to 1 KiB, 8 bytes per barrier. Where dK and dV come from two passes, the larger pass's; with
        ``fused_dq``, the one kernel's and 0."""
        if self.fused_dq:
            return self._dkv_smem_bytes("dkdvdq", head_dim, itemsize), 0   # no dQ kernel
        tile = _BLOCK * head_dim * itemsize
        passes = ("dv", "dk") if head_dim in _TWO_PASSES else ("dkdv",)
        dkv = max(self._dkv_smem_bytes(g, head_dim, itemsize) for g in passes)
        kv = self.stages_dq * self.block_kv_dq * head_dim * itemsize
        staged = 2 * _BLOCK * self.block_kv_dq * itemsize if self.interpretable else 0
        dq = _smem_align(4 * tile) + 2 * _smem_align(kv) + _smem_align(staged) + 8 * (4 + 3 * self.stages_dq)
        return dkv, dq

    def dkv_stages(self, grads: str) -> int:
        """The Q / dO ring depth of a dK/dV launch: ``grads`` "dkdv", "dkdvdq", "dk" or "dv"."""
        return (self.stages_dv or self.stages_dkv) if grads == "dv" else self.stages_dkv

    def dq_part(self, head_dim: int) -> tuple[int, int]:
        """With ``fused_dq``, the (query rows, head-dim columns) of a step's dQ tile (``block_q_dkv`` x
        ``head_dim``) that one consumer forms and reduces: half the rows of 128-row steps, else half the
        columns (both halves 64-aligned, as the swizzled SMEM tiles are sliced)."""
        return (_BLOCK, head_dim) if self.block_q_dkv == 2 * _BLOCK else (self.block_q_dkv, head_dim // 2)

    def _dkv_smem_bytes(self, grads: str, head_dim: int, itemsize: int = 2) -> int:
        """One dK/dV launch's shared memory: K tiles (and V tiles, but for the dV pass), the Q / dO ring,
        the stats ring, the interpretable form's staging tiles (P^T and dS^T, one each in a pass)."""
        bq, stages = self.block_q_dkv, self.dkv_stages(grads)
        tile, staged = _BLOCK * head_dim * itemsize, 2 * _BLOCK * bq * itemsize if self.interpretable else 0
        kv_tiles, staged_tiles = (1 if grads == "dv" else 2), (2 if grads == "dkdv" else 1)
        fused = 0
        if grads == "dkdvdq":   # dS^T of both consumers x 2 parities (bf16), each consumer's dQ part (f32)
            rows, cols = self.dq_part(head_dim)
            fused = _smem_align(4 * _BLOCK * bq * itemsize) + _smem_align(2 * rows * cols * 4) + 8 * _MEET
        return (kv_tiles * _smem_align(2 * tile) + 2 * _smem_align(stages * bq * head_dim * itemsize)
                + _smem_align(stages * 3 * bq * 4) + staged_tiles * _smem_align(staged) + 8 * (4 + 4 * stages)
                + fused)

    def check_head_dim(self, head_dim: int, itemsize: int = 2) -> None:
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"the backward kernels take head dims {HEAD_DIMS}, got {head_dim}: use the blocked "
                             f"backward (flash_attention_vjp.attention_bwd_blocked)")
        # float32 registers a consumer thread holds: a [64, n] tile over 128 threads is n / 2
        n_accs = 1 if head_dim in _TWO_PASSES else 2
        need = (2 * self.block_q_dkv + n_accs * head_dim) // 2
        if need > _REGS:
            raise ValueError(f"{self}: block_q_dkv={self.block_q_dkv} is too many rows at head dim {head_dim}: a "
                             f"dK/dV consumer's S^T and dP^T of {self.block_q_dkv} rows beside its {n_accs} "
                             f"accumulator(s) would need {need} float32 registers a thread (it has {_REGS} in all)")
        need = (2 * self.block_kv_dq + head_dim) // 2
        if need > _REGS:
            raise ValueError(f"{self}: block_kv_dq={self.block_kv_dq} is too many keys at head dim {head_dim}: a "
                             f"dQ consumer's S and dP of {self.block_kv_dq} keys beside its dQ accumulator would "
                             f"need {need} float32 registers a thread (it has {_REGS} in all)")
        if self.fused_dq and (head_dim in _TWO_PASSES or (self.block_q_dkv == _BLOCK and head_dim % 128)):
            raise ValueError(f"{self}: fused_dq takes head dims 64 (with block_q_dkv=128) and 128, got head dim "
                             f"{head_dim}: a consumer forms half of a step's dQ tile, split by 64 rows or 64 "
                             f"columns, and at head dim 256 the dQ part does not fit SMEM beside K and V")
        for name, need in zip(("dK/dV", "dQ"), self.smem_bytes(head_dim, itemsize)):
            if need > _SMEM_LIMIT:
                raise ValueError(f"{self}: the {name} kernel needs {need} bytes of shared memory at head dim "
                                 f"{head_dim}, more than the {_SMEM_LIMIT} a Hopper CTA has: use fewer stages "
                                 f"or block_kv_dq=64")


# The blocks per head dim (pallas_kernels/NOTES.md "Backward v2"; two H100 tables, results/fa3_bwd_h100_2026-12-07_*):
# at hd 64, 128-row dK/dV steps with 128-key dQ steps were 6-15 % faster than 64 / 64 on every row; at hd 128,
# 128-key dQ steps alone were level (-1.5 to +3.7 %) and 128-row dK/dV steps do not fit a consumer's registers.
# At hd 256 (two dK/dV passes) one stage is what fits 227 KiB of SMEM in the dK pass and the dQ kernel; the dV
# pass, without V tiles, fits two.
BWD_TUNED = {64: dict(block_q_dkv=128, block_kv_dq=128), 128: {},
             256: dict(stages_dkv=1, stages_dq=1, stages_dv=2)}


def default_bwd_config(head_dim: int, interpretable: bool = False) -> BwdConfig:
    """The tuned backward blocks for this head dim (``BWD_TUNED``; untuned head dims get the base
    blocks, which ``check_head_dim`` then judges)."""
    return BwdConfig(interpretable=interpretable, **BWD_TUNED.get(head_dim, {}))


# ---------------------------------------------------------------- pieces of both kernels
def _gemms(pairs, accs, staged=None):
    """Issues the wgmmas ``acc_i += a_i @ b_i`` together and waits for them. ``staged`` None: onto
    ``accs`` in place, register A operands allowed. Otherwise (interpretable) one entry per pair:
    an SMEM tile that the register operand ``a_i`` is written to, or None where ``a_i`` is an SMEM
    ref already; the wgmmas then accumulate into zeros, added to ``accs`` afterwards."""
    if staged is None:
        def body(refs):
            for ref, (a, b) in zip(refs, pairs):
                plgpu.wgmma(ref, a, b)
        return pl.run_state(body)(tuple(plgpu.ACC.init(acc) for acc in accs))
    for smem, (a, _) in zip(staged, pairs):
        if smem is not None:
            smem[...] = a
    plgpu.commit_smem()

    def body(*refs):
        for ref, smem, (a, b) in zip(refs, staged, pairs):
            plgpu.wgmma(ref, a if smem is None else smem, b)
        return tuple(ref[...] for ref in refs)
    out = pl.run_scoped(body, *(plgpu.ACC(acc.shape, jnp.float32) for acc in accs))
    return tuple(acc + o for acc, o in zip(accs, out))


def _at(ref, i):  # a consumer's staging tile (interpretable only)
    return None if ref is None else ref.at[i]


def _zeros(shape):
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), _WGMMA)


# ---------------------------------------------------------------- dK / dV
def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, stats_ref, qlo_ref, qhi_ref, *refs,
                cfg: BwdConfig, n_rep: int, scale_log2: float, scale: float, grads: str):
    """``grads``: "dkdv" (both accumulators), or one of them per launch, "dv" or "dk" (head dim 256, where
    the two would need 256 registers a thread): the "dv" pass neither loads V nor forms dP.

    "dkdvdq" (``fused_dq``, FA3's one kernel) forms dQ too; ``refs`` then begin with ``dq_ref``, the
    float32 dQ [B, Tp, H, d] in GMEM (the interpretable form: one part per kv tile, [tiles, B, Tp, H, d]),
    zeros at the start. Each step, each consumer stores its dS^T (64 keys x ``bq`` rows, bf16) in SMEM,
    in one of two slots by step parity; once both have (``meet``, two arrivals), consumer c forms its half
    of the step's dQ tile over all 128 keys of the CTA, dQ_c = dS[rows_c, :] K[:, cols_c] (the dS^T
    tiles read transposed, ``BwdConfig.dq_part``), and reduces it into ``dq_ref`` by TMA (``add``). The
    parity slots make one barrier a step enough: a consumer rewrites a slot two steps later, after the
    other has passed the next step's barrier, so after its dQ wgmmas that read the slot."""
    bq, bkv, stages = cfg.block_q_dkv, _BLOCK, cfg.dkv_stages(grads)
    fused = grads == "dkdvdq"
    dq_ref = refs[0] if fused else None
    *outs, scoped = refs[1:] if fused else refs
    (k_tiles, v_tiles, q_smem, do_smem, st_smem, pt_smem, dst_smem, ds_smem, dq_smem), \
        (kv_ready, q_ready, do_ready, st_ready), free, *meet = scoped
    meet = meet[0] if fused else None   # ``_MEET`` barriers
    want_dk, want_dv = grads in ("dkdv", "dkdvdq", "dk"), grads in ("dkdv", "dkdvdq", "dv")
    gi, bi, ti, wg = (lax.axis_index(n) for n in ("kv_heads", "batch", "kv_tiles", "wg"))
    qlo, n_q = qlo_ref[bi, ti], qhi_ref[bi, ti] - qlo_ref[bi, ti]
    n_steps = n_rep * n_q                 # step i: query head gi * n_rep + i // n_q, q block qlo + i % n_q (bq rows)
    head_block = lambda i: (gi * n_rep + lax.div(i, n_q), qlo + lax.rem(i, n_q))

    @pl.when(wg < 2)
    def _consumer():
        plgpu.set_max_registers(_REGS, action="increase")
        k_base = (2 * ti + wg) * bkv
        k_smem, v_smem = k_tiles.at[wg], (v_tiles.at[wg] if want_dk else None)
        rows = (bi, pl.ds(k_base, bkv), gi)
        plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem, kv_ready.at[wg])
        if want_dk:   # V is read only by dP
            plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem, kv_ready.at[2 + wg])
        staged = lambda *tiles: tiles if cfg.interpretable else None
        key_tile = lambda: plgpu.broadcasted_iota(jnp.int32, (bkv, bq), 0, layout=_WGMMA) + k_base
        key = key_tile() if grads == "dkdv" else None   # else made per step, 32 registers fewer to hold
        plgpu.barrier_wait(kv_ready.at[wg])
        if want_dk:
            plgpu.barrier_wait(kv_ready.at[2 + wg])
        lo, d = k_smem.dtype, k_smem.shape[-1]

        def step(ki, carry):
            dk, dv = carry   # None: the gradient this launch does not form
            slot = lax.rem(ki, stages)
            plgpu.barrier_wait(q_ready.at[slot])

            def scores(ref):
                plgpu.wgmma(ref, k_smem, q_smem.at[slot].T)
                return ref[...]
            st = pl.run_scoped(scores, plgpu.ACC((bkv, bq), jnp.float32))
            plgpu.barrier_wait(st_ready.at[slot])
            col = lambda j: lax.broadcast_in_dim(plgpu.load(st_smem.at[slot, j], layout=_COL),
                                                 (bkv, bq), [1])
            pt = jnp.exp2(st * scale_log2 - col(0))
            pt = jnp.where((key_tile() if key is None else key) < col(2).astype(jnp.int32), pt, 0.0)
            plgpu.barrier_wait(do_ready.at[slot])
            # dV += P^T dO and dP^T = V dO^T, issued together (a one-gradient pass issues its one)
            pairs, accs, tiles = [], [], []
            if want_dv:
                pairs.append((pt.astype(lo), do_smem.at[slot]))
                accs.append(dv)
                tiles.append(_at(pt_smem, wg))
            if want_dk:
                pairs.append((v_smem, do_smem.at[slot].T))
                accs.append(_zeros((bkv, bq)))
                tiles.append(None)
            done = _gemms(tuple(pairs), tuple(accs), staged(*tiles))
            if want_dv:
                dv = done[0]
            if want_dk:
                dst = (pt * (done[-1] - col(1))).astype(lo)
                if fused:
                    dk = _dk_and_dq(ki, slot, dst, dk)
                else:
                    (dk,) = _gemms(((dst, q_smem.at[slot]),), (dk,), staged(_at(dst_smem, wg)))
            if not fused:
                plgpu.barrier_arrive(free.at[slot])
            return dk, dv

        def _dk_and_dq(ki, slot, dst, dk):
            """dK += dS^T Q (dS^T from its SMEM slot), issued before the wait for the other consumer's
            dS^T; then this consumer's dQ part over both, the three wgmmas waited for together; the dQ
            part goes to ``dq_ref`` by a TMA reduce-add."""
            par = lax.rem(ki, 2)
            ds_own = ds_smem.at[par, wg]
            ds_own[...] = dst
            plgpu.commit_smem()
            plgpu.barrier_arrive(meet.at[par])
            rows, cols = cfg.dq_part(d)
            # rows r0.. and columns c0.. of the step's dQ tile, over both consumers' keys (tiles 0 and 1:
            # traced, as a Python int index of a ref used inside run_state is a constant its lowering
            # cannot carry; for the same reason only the split dim is sliced)
            tiles = (wg * 0, wg * 0 + 1)
            if rows < bq:
                r0, c0 = wg * rows, 0
                pairs = tuple((ds_smem.at[par, j, :, pl.ds(r0, rows)].T, k_tiles.at[j]) for j in tiles)
            else:
                r0, c0 = 0, wg * cols
                pairs = tuple((ds_smem.at[par, j].T, k_tiles.at[j, :, pl.ds(c0, cols)]) for j in tiles)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # the last reduce has read dq_smem

            def dq_part(acc):   # issued behind dK's wgmma; reading it waits for both
                for a, b in pairs:
                    plgpu.wgmma(acc, a, b)
                dq_smem.at[wg][...] = acc[...]

            def body(refs):
                plgpu.wgmma(refs[0], ds_own, q_smem.at[slot])
                plgpu.barrier_wait(meet.at[par])   # the other consumer's dS^T is in SMEM
                pl.run_scoped(dq_part, plgpu.ACC((rows, cols), jnp.float32))
            if cfg.interpretable:   # a fresh dK accumulator, added after
                def fresh(ref):
                    body((ref,))
                    return ref[...]
                dk = dk + pl.run_scoped(fresh, plgpu.ACC((bkv, d), jnp.float32))
            else:
                (dk,) = pl.run_state(body)((plgpu.ACC.init(dk),))
            plgpu.barrier_arrive(free.at[slot])   # Q and dO are no longer read
            hi, qb = head_block(ki)
            plgpu.commit_smem()
            target = (bi, pl.ds(qb * bq + r0, rows), hi, pl.ds(c0, cols))
            if cfg.interpretable:
                plgpu.copy_smem_to_gmem(dq_smem.at[wg], dq_ref.at[(ti,) + target])
            else:
                plgpu.copy_smem_to_gmem(dq_smem.at[wg], dq_ref.at[target], reduction_op="add")
            return dk

        zeros = lambda want: _zeros((bkv, d)) if want else None
        dk, dv = lax.fori_loop(0, n_steps, step, (zeros(want_dk), zeros(want_dv)))
        if fused:   # the other consumer's last dQ wgmmas read this K tile, about to stage dK
            plgpu.barrier_arrive(meet.at[2])
            plgpu.barrier_wait(meet.at[2])
        # K and V are no longer read: their SMEM stages the outputs in order (a one-gradient pass: K's)
        results = [r for r in (dk * scale if want_dk else None, dv) if r is not None]
        for smem, r in zip((k_smem, v_smem), results):
            smem[...] = r.astype(lo)
        plgpu.commit_smem()
        for smem, out_ref in zip((k_smem, v_smem), outs):
            plgpu.copy_smem_to_gmem(smem, out_ref.at[rows])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    @pl.when(wg == 2)
    def _producer():
        plgpu.set_max_registers(_PRODUCER_REGS, action="decrease")

        def load(ki, slot):
            hi, qb = head_block(ki)
            rows = (bi, pl.ds(qb * bq, bq), hi)
            plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem.at[slot], q_ready.at[slot])
            plgpu.copy_gmem_to_smem(stats_ref.at[bi, hi, :, pl.ds(qb * bq, bq)], st_smem.at[slot],
                                    st_ready.at[slot])
            plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem.at[slot], do_ready.at[slot])

        _produce(n_steps, stages, ((load, free),))


# ---------------------------------------------------------------- dQ
def _dq_kernel(q_ref, k_ref, v_ref, do_ref, stats_ref, kend_ref, kmin_ref, kmax_ref, dq_ref, scoped, *,
               cfg: BwdConfig, n_rep: int, scale_log2: float, scale: float, n_kv_blocks: int, n_tiles: int):
    bq, bkv, stages = _BLOCK, cfg.block_kv_dq, cfg.stages_dq
    (q_tiles, do_tiles, k_smem, v_smem, ds_smem), (qd_ready, k_ready, v_ready), free = scoped
    hi, bi, wg = (lax.axis_index(n) for n in ("heads", "batch", "wg"))
    qi = n_tiles - 1 - lax.axis_index("q_tiles")   # causal: the longest tiles first
    n_steps, n_open = _kv_range(kmin_ref[bi, qi], kmax_ref[bi, qi], bkv, n_kv_blocks)

    @pl.when(wg < 2)
    def _consumer():
        plgpu.set_max_registers(_REGS, action="increase")
        q_base = (2 * qi + wg) * bq
        rows = (bi, pl.ds(q_base, bq), hi)
        q_smem, do_smem = q_tiles.at[wg], do_tiles.at[wg]
        plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem, qd_ready.at[wg])
        plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem, qd_ready.at[2 + wg])
        row = lambda j: plgpu.load(stats_ref.at[bi, hi, j, pl.ds(q_base, bq)], layout=_ROW, optimized=False)
        lse2, delta, kend = row(0), row(1), _load_kend_row(kend_ref, bi, q_base, bq)
        tile = lambda x: lax.broadcast_in_dim(x, (bq, bkv), [0])
        staged = lambda *tiles: tiles if cfg.interpretable else None
        plgpu.barrier_wait(qd_ready.at[wg])
        plgpu.barrier_wait(qd_ready.at[2 + wg])
        lo = q_smem.dtype

        def step(ki, dq, masked: bool):
            slot = lax.rem(ki, stages)
            plgpu.barrier_wait(k_ready.at[slot])
            plgpu.barrier_wait(v_ready.at[slot])
            s, dp = _gemms(((q_smem, k_smem.at[slot].T), (do_smem, v_smem.at[slot].T)),
                           (_zeros((bq, bkv)), _zeros((bq, bkv))), staged(None, None))
            p = jnp.exp2(s * scale_log2 - tile(lse2))
            if masked:
                col = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 1, layout=_WGMMA) + ki * bkv
                p = jnp.where(col < tile(kend), p, 0.0)
            (dq,) = _gemms((((p * (dp - tile(delta))).astype(lo), k_smem.at[slot]),), (dq,),
                           staged(_at(ds_smem, wg)))
            plgpu.barrier_arrive(free.at[slot])
            return dq

        dq = lax.fori_loop(0, n_open, functools.partial(step, masked=False), _zeros(q_smem.shape))
        dq = lax.fori_loop(n_open, n_steps, functools.partial(step, masked=True), dq)
        q_smem[...] = (dq * scale).astype(lo)    # Q is no longer read: its SMEM stages dQ
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[rows])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    @pl.when(wg == 2)
    def _producer():
        plgpu.set_max_registers(_PRODUCER_REGS, action="decrease")
        gi = lax.div(hi, n_rep)

        def load(ki, slot):
            rows = (bi, pl.ds(ki * bkv, bkv), gi)
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem.at[slot], k_ready.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem.at[slot], v_ready.at[slot])

        _produce(n_steps, stages, ((load, free),))


# ---------------------------------------------------------------- builders and entry
def _call(body, out_type, grid, names, scratch, ready, stages: int, name: str, sync: int = 0):
    """``plgpu.kernel`` of ``body(*refs, (smem, ready barriers, free[, sync]))`` on 2 consumers + 1
    producer; ``free``: a slot of the ring may be refilled (both consumers arrive); ``sync``: that many
    barriers the two consumers meet at. ``name`` names the CUDA kernel (``{name}_mosaic_gpu_kernel``
    in profiles and in compute-sanitizer's ``--kernel-name kns=`` filter)."""
    barriers = tuple(plgpu.Barrier(num_barriers=n) for n in ready)
    free = plgpu.Barrier(num_arrivals=2, num_barriers=stages)
    meet = (plgpu.Barrier(num_arrivals=2, num_barriers=sync),) if sync else ()

    def entry(*refs):
        pl.run_scoped(lambda smem, bars, *fr: body(*refs, (smem, bars, *fr)), scratch, barriers, free, *meet,
                      collective_axes="wg")
    # No cross-warp reductions: Mosaic GPU's default 2 KiB reduction scratch is not needed.
    return plgpu.kernel(entry, out_type=out_type, grid=grid, grid_names=names, num_threads=3, thread_name="wg",
                        kernel_name=name,
                        compiler_params=plgpu.CompilerParams(approx_math=True, reduction_scratch_bytes=0))


def _build_dkv(B, H, Sk, G, d, dtype, cfg: BwdConfig, scale: float, grads: str = "dkdv"):
    """``dkv(q, k, v, do, stats, qlo, qhi) -> (dk, dv)`` [B, Sk, G, d]; with ``grads`` "dk" or "dv" that one
    alone (a 1-tuple); "dkdvdq": ``dkv(q, k, v, do, stats, qlo, qhi, dq_acc) -> (dk, dv)``, adding dQ
    (unscaled) into the float32 ref ``dq_acc`` (``_dkv_kernel``)."""
    stages, bq, fused = cfg.dkv_stages(grads), cfg.block_q_dkv, grads == "dkdvdq"
    tile = _smem_tiled((stages, bq, d), dtype)   # the ring of Q and dO blocks
    staged = _smem_tiled((2, _BLOCK, bq), dtype) if cfg.interpretable else None
    own = _smem_tiled((2, _BLOCK, d), dtype)   # each consumer's K or V tile
    fused_tiles = (None, None)
    if fused:   # dS^T [parity, consumer, keys, rows]; each consumer's float32 dQ part
        fused_tiles = (_smem_tiled((2, 2, _BLOCK, bq), dtype), _smem_tiled((2, *cfg.dq_part(d)), jnp.float32))
    scratch = (own, own if grads != "dv" else None, tile, tile, plgpu.SMEM((stages, 3, bq), jnp.float32),
               staged if grads != "dk" else None, staged if grads in ("dkdv", "dk") else None, *fused_tiles)
    body = functools.partial(_dkv_kernel, cfg=cfg, n_rep=H // G, scale_log2=scale * _LOG2E, scale=scale,
                             grads=grads)
    out = jax.ShapeDtypeStruct((B, Sk, G, d), dtype)
    return _call(body, (out, out) if grads in ("dkdv", "dkdvdq") else (out,), (G, B, pl.cdiv(Sk, 2 * _BLOCK)),
                 ("kv_heads", "batch", "kv_tiles"), scratch, (4, stages, stages, stages), stages,
                 {"dkdv": "fa3_bwd_dkv", "dkdvdq": "fa3_bwd"}.get(grads, f"fa3_bwd_{grads}"),
                 sync=_MEET if fused else 0)


def _build_dq(B, Tq, H, Sk, G, d, dtype, cfg: BwdConfig, scale: float):
    """``dq(q, k, v, do, stats, kend, kmin, kmax) -> dq`` [B, Tq, H, d]."""
    stages, bkv, n_tiles = cfg.stages_dq, cfg.block_kv_dq, pl.cdiv(Tq, 2 * _BLOCK)
    ring = _smem_tiled((stages, bkv, d), dtype)
    own = _smem_tiled((2, _BLOCK, d), dtype)   # each consumer's Q or dO tile
    scratch = (own, own, ring, ring,
               _smem_tiled((2, _BLOCK, bkv), dtype) if cfg.interpretable else None)
    body = functools.partial(_dq_kernel, cfg=cfg, n_rep=H // G, scale_log2=scale * _LOG2E, scale=scale,
                             n_kv_blocks=pl.cdiv(Sk, bkv), n_tiles=n_tiles)
    return _call(body, jax.ShapeDtypeStruct((B, Tq, H, d), dtype), (H, B, n_tiles), ("heads", "batch", "q_tiles"),
                 scratch, (4, stages, stages), stages, "fa3_bwd_dq")


def _q_block_ranges(kend_BTp, n_kv_tiles: int, block_q: int = _BLOCK):
    """``(qlo, qhi)`` [B, n_kv_tiles]: the ``block_q``-row q blocks from the first to the last whose
    rows see any key of the kv tile (its keys start at ``128 * tile``, and a row sees keys ``< k_end``)."""
    B, Tp = kend_BTp.shape
    kmax_BN = kend_BTp.reshape(B, Tp // block_q, block_q).max(-1)
    sees = kmax_BN[:, None, :] > (2 * _BLOCK * jnp.arange(n_kv_tiles, dtype=jnp.int32))[None, :, None]
    n = sees.shape[-1]
    qlo, qhi = jnp.argmax(sees, -1), n - jnp.argmax(sees[..., ::-1], -1)
    some = sees.any(-1)
    return jnp.where(some, qlo, 0).astype(jnp.int32), jnp.where(some, qhi, 0).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("scale", "config"))
def flash_attention_bwd(q_BTHd, k_BSGd, v_BSGd, o_BTHd, lse_BHT, do_BTHd, kend_BT, *,
                        scale: float | None = None, config: BwdConfig | None = None):
    """Jitted entry: ``(dq [B,T,H,d], dk [B,S,G,d], dv [B,S,G,d])`` in the inputs' dtype, from the
    forward's ``o`` and ``lse`` ([B,H,T], natural log, -inf for rows that saw no key) and the
    output cotangent ``do``."""
    _check(q_BTHd, k_BSGd, v_BSGd, kend_BT)
    (B, T, H, d), (S, G) = q_BTHd.shape, k_BSGd.shape[1:3]
    if o_BTHd.shape != q_BTHd.shape or do_BTHd.shape != q_BTHd.shape or lse_BHT.shape != (B, H, T):
        raise ValueError(f"expected o and do of q's shape {q_BTHd.shape} and lse [B,H,T] = {(B, H, T)}; got "
                         f"o {o_BTHd.shape}, do {do_BTHd.shape}, lse {lse_BHT.shape}")
    cfg = config or default_bwd_config(d)
    cfg.check_head_dim(d, jnp.dtype(q_BTHd.dtype).itemsize)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    rows, f32 = 2 * _BLOCK, jnp.float32
    n_tiles = pl.cdiv(T, rows)
    Tp = n_tiles * rows
    # TMA boxes need sequence dims that are multiples of 8 rows and at least one box long (the
    # forward's rule); other tails are zero-filled on load and dropped on store by TMA itself.
    up8 = lambda n: -(-n // 8) * 8
    Tq, Sk = max(up8(T), rows), max(up8(S), rows, cfg.block_kv_dq * cfg.stages_dq)
    pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, 0))) if n > x.shape[1] else x
    q, do, k, v = pad(q_BTHd, Tq), pad(do_BTHd.astype(q_BTHd.dtype), Tq), pad(k_BSGd, Sk), pad(v_BSGd, Sk)
    kend, kmin, kmax = padded_key_ends(kend_BT, T, S, rows)
    # A reduction of its own: fused into the stack below it ran as a 0.28 ms loop at 16k tokens x 16
    # heads (the kernels: ~3 ms); alone it reads O and dO once at the HBM rate.
    delta = lax.optimization_barrier(jnp.sum(o_BTHd.astype(f32) * do_BTHd.astype(f32), -1)).transpose(0, 2, 1)
    lse2 = jnp.where(jnp.isfinite(lse_BHT), lse_BHT * _LOG2E, 0.0)   # rows that saw no key: p masked to 0
    stats = jnp.stack([lse2, delta, jnp.broadcast_to(kend[:, None, :T].astype(f32), (B, H, T))], axis=2)
    stats = jnp.pad(stats, ((0, 0), (0, 0), (0, 0), (0, Tp - T)))     # [B, H, (lse2, delta, k_end), Tp]
    qlo, qhi = _q_block_ranges(kend, pl.cdiv(Sk, rows), cfg.block_q_dkv)
    args = (q, k, v, do, stats, qlo, qhi)
    if cfg.fused_dq:   # one kernel; dQ summed in float32 (by TMA, or over the interpretable form's parts)
        parts = (pl.cdiv(Sk, rows),) if cfg.interpretable else ()
        dq_acc = jax.new_ref(jnp.zeros((*parts, B, Tp, H, d), f32))
        dk, dv = _build_dkv(B, H, Sk, G, d, q.dtype, cfg, scale, "dkdvdq")(*args, dq_acc)
        dq = dq_acc[...].sum(0) if cfg.interpretable else dq_acc[...]
        return (dq[:, :T] * scale).astype(q.dtype), dk[:, :S], dv[:, :S]
    if d in _TWO_PASSES:   # dV, then dK: each pass's accumulator alone fits a consumer's registers
        (dv,) = _build_dkv(B, H, Sk, G, d, q.dtype, cfg, scale, "dv")(*args)
        (dk,) = _build_dkv(B, H, Sk, G, d, q.dtype, cfg, scale, "dk")(*args)
    else:
        dk, dv = _build_dkv(B, H, Sk, G, d, q.dtype, cfg, scale)(*args)
    dq = _build_dq(B, Tq, H, Sk, G, d, q.dtype, cfg, scale)(q, k, v, do, stats, kend, kmin, kmax)
    return dq[:, :T], dk[:, :S], dv[:, :S]


def flash_attention_bwd_reference(q_BTHd, k_BSGd, v_BSGd, do_BTHd, kend_BT, *, scale: float | None = None):
    """``(dq, dk, dv)`` in float32 by autodiff of the forward's float32 reference."""
    f32 = lambda x: x.astype(jnp.float32)
    loss = lambda q, k, v: jnp.sum(flash_attention_reference(q, k, v, kend_BT, scale=scale)[0] * f32(do_BTHd))
    return jax.grad(loss, (0, 1, 2))(f32(q_BTHd), f32(k_BSGd), f32(v_BSGd))


def main(argv=None) -> None:
    """Time one FA3-paper shape's backward (16k tokens, H*d = 2048) or, with --small, run one tiny
    checked call (what benchmarks/fa3_racecheck_gpu.sh points compute-sanitizer at; its racecheck misses
    races between Mosaic GPU warpgroups, NOTES.md "Race checks": the interpreter's race tests are the check)."""
    import argparse
    import numpy as np
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=None, help="default 128 (64 with --small)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--block-kv-dq", type=int, help="default: default_bwd_config's")
    ap.add_argument("--block-q-dkv", type=int, help="default: default_bwd_config's")
    ap.add_argument("--stages-dkv", type=int, help="default: default_bwd_config's")
    ap.add_argument("--stages-dq", type=int, help="default: default_bwd_config's")
    ap.add_argument("--stages-dv", type=int, help="hd 256's dV pass; default: default_bwd_config's")
    ap.add_argument("--fused-dq", type=int, choices=(0, 1), help="one kernel (1) or dK/dV + dQ kernels (0); "
                    "default: default_bwd_config's")
    ap.add_argument("--no-check", action="store_true", help="skip the float32 reference (e.g. under racecheck)")
    a = ap.parse_args(argv)
    d = a.head_dim or (64 if a.small else 128)
    B, S = (1, 300) if a.small else (16384 // a.seq, a.seq)
    given = {f: getattr(a, f) for f in ("block_kv_dq", "block_q_dkv", "stages_dkv", "stages_dq", "stages_dv")
             if getattr(a, f) is not None}
    if a.fused_dq is not None:
        given["fused_dq"] = bool(a.fused_dq)
    cfg = dataclasses.replace(default_bwd_config(d), **given)
    H = 2 if a.small else 2048 // d
    q, k, v, do = (jax.random.normal(kk, (B, S, H, d), jnp.bfloat16) for kk in jax.random.split(jax.random.key(0), 4))
    kend = key_end(B, S, S, causal="top_left" if a.causal else "none")
    o, lse = flash_attention_fwd(q, k, v, kend, config=default_config(d, S, a.causal))
    bwd = jax.jit(lambda *x: flash_attention_bwd(*x, kend, config=cfg))
    got = bwd(q, k, v, o, lse, do)
    if not a.no_check and B * H * S * S <= 2 ** 30:   # the float32 reference holds a few [B, H, S, S] arrays
        ref = flash_attention_bwd_reference(q, k, v, do, kend)
        errs = [float(jnp.linalg.norm(g.astype(jnp.float32) - r) / jnp.linalg.norm(r)) for g, r in zip(got, ref)]
        check = "relative error dq/dk/dv " + " ".join(f"{e:.2e}" for e in errs)
    else:
        check = "not checked (--no-check, or the float32 reference would not fit)"
    print(f"B={B} S={S} H={H} d={d} causal={a.causal} {cfg}: {check}")
    if not a.small:
        import time
        from jax.experimental.mosaic.gpu import profiler
        args = (q, k, v, o, lse, do)
        _, per_kernel = profiler.measure(bwd, aggregate=False)(*args)   # bwd returns all three: none is dropped
        _, ms = profiler.measure(bwd, iterations=20)(*args)
        jax.block_until_ready(bwd(*args))
        t0 = time.perf_counter()
        for _ in range(20):
            out = bwd(*args)
        jax.block_until_ready(out)
        wall = (time.perf_counter() - t0) / 20 * 1e3
        flops = 10 * B * S * S * H * d / (2 if a.causal else 1)
        print("kernels: " + ", ".join(f"{n[:40]} {t:.3f} ms" for n, t in per_kernel))
        print(f"median {np.median(ms):.3f} ms = {flops / np.median(ms) / 1e9:.0f} TFLOPS (10*B*S^2*H*d); "
              f"wall clock {wall:.3f} ms per call = {flops / wall / 1e9:.0f}")

if __name__ == "__main__":
    main()
