"""EAGLE-3's training-time test (TTT): all rows' draft chains unrolled in parallel.

Step j at row t is what decoding computes on its j-th chained draft step when the target's features
are known up to position t: its query sits at position t+j, its input is
``(h^{j}_t, x_{t+1+j})`` (``h^0 = g``, the fused target features; ``h^{j}`` the head's own pre-norm
output of step j-1 at the same row), and it attends to the step-0 keys of rows ``s <= t`` (true
features) plus the keys of steps ``1..j`` at row t (the chain so far: positions t+1..t+j).
So step j's logits at row t predict ``x_{t+2+j}`` exactly as the decoding chain would
(``tests/test_training.py`` checks this against ``eagle3.step`` run row by row with a KV cache).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax import model
from specjax.heads import eagle3

NOT_PROPOSED = 1 << 20  # the rank of a token a drafter cannot propose (outside the draft vocabulary, past the text)


def shift_left(x_BT: jax.Array, n: int) -> jax.Array:
    """x[:, n:] padded at the end with zeros to the same length (row t gets x[t+n])."""
    if n == 0:
        return x_BT
    pad = jnp.zeros((x_BT.shape[0], n) + x_BT.shape[2:], x_BT.dtype)
    return jnp.concatenate([x_BT[:, n:], pad], axis=1)


def ttt_attention(q_BTHd: jax.Array, k_steps: list[jax.Array], v_steps: list[jax.Array]) -> jax.Array:
    """Causal attention to step 0's keys plus each row's own keys from steps 1..j (float32 softmax)."""
    B, T, H, d = q_BTHd.shape
    G = k_steps[0].shape[2]
    q = q_BTHd.reshape(B, T, G, H // G, d)
    scale = 1.0 / jnp.sqrt(jnp.float32(d))
    s0 = jnp.einsum("btgrd,bsgd->bgrts", q, k_steps[0], preferred_element_type=jnp.float32) * scale
    causal_TS = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]
    s0 = jnp.where(causal_TS, s0, -jnp.inf)
    diag = [jnp.einsum("btgrd,btgd->bgrt", q, k, preferred_element_type=jnp.float32)[..., None] * scale
            for k in k_steps[1:]]
    p = jax.nn.softmax(jnp.concatenate([s0] + diag, axis=-1), axis=-1)
    o = jnp.einsum("bgrts,bsgd->btgrd", p[..., :T].astype(v_steps[0].dtype), v_steps[0],
                   preferred_element_type=jnp.float32)
    for i, v in enumerate(v_steps[1:]):
        p_i = jnp.transpose(p[..., T + i], (0, 3, 1, 2))  # [B, T, G, R]
        o = o + p_i[..., None] * v[:, :, :, None, :].astype(jnp.float32)
    return o.reshape(B, T, H, d).astype(q_BTHd.dtype)


def ttt_logits(params: dict, cfg: eagle3.Eagle3Config, embed_VD: jax.Array, tokens_BT: jax.Array,
               taps: tuple[jax.Array, ...], num_steps: int) -> list[jax.Array]:
    """Draft-vocabulary logits [B, T, N] of steps 0..num_steps-1 (step j, row t predicts x_{t+2+j})."""
    B, T = tokens_BT.shape
    pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    h_BTD = eagle3.fuse(params, taps)
    k_steps, v_steps, out = [], [], []
    for j in range(num_steps):
        emb_BTD = jnp.take(embed_VD, shift_left(tokens_BT, 1 + j), axis=0)
        x = eagle3.layer_input(params, cfg, emb_BTD, h_BTD)
        q_BTHd, k_BTGd, v_BTGd = eagle3.qkv(params, cfg, x, pos_BT + j)
        k_steps.append(k_BTGd)
        v_steps.append(v_BTGd)
        h_BTD = eagle3.finish(params, cfg, h_BTD, ttt_attention(q_BTHd, k_steps, v_steps))
        out.append(eagle3.logits(params, cfg, h_BTD))
    return out


def _unroll(tp: dict, cfg: eagle3.Eagle3Config, dp: dict, text_T, num_steps: int) -> list[jax.Array]:
    """``ttt_logits`` over one token sequence, with the target's features from ``tp``: [1, T, N] per step."""
    toks_1T = jnp.asarray(text_T, jnp.int32)[None]
    _, taps, _ = model.forward(tp, cfg.target, toks_1T, taps=cfg.taps)
    return ttt_logits(dp["params"], cfg, tp["embed"], toks_1T, taps, num_steps)


def greedy_drafts(tp: dict, cfg: eagle3.Eagle3Config, dp: dict, text_T, num_steps: int):
    """Target-vocabulary argmax drafts ``[num_steps, T]`` (numpy) of ``ttt_logits`` over one token
    sequence, with the target's features from ``tp`` and the head ``dp = {"params", "draft_ids"}``."""
    steps = _unroll(tp, cfg, dp, text_T, num_steps)
    return np.stack([np.asarray(jnp.take(dp["draft_ids"], jnp.argmax(s[0], -1))) for s in steps])


def chain_acceptance(drafts_JT, text_T, start: int, end: int):
    """``(cycles, accepted_J)``: what greedy chain decoding with a budget of ``end - start`` new tokens
    accepts, replayed offline. ``text_T`` is a prompt of length ``start`` and the target's greedy
    continuation, which may run past ``end``; step j's draft at row t is ``drafts_JT[j, t]`` (argmax
    of ``ttt_logits`` step j, a guess for ``text[t + 2 + j]``).

    Prefill emits ``text[start]``; a cycle whose last emitted token is ``text[L]`` reads the head's
    row L - 1 and accepts drafts while they match ``text[L + 1 ...]``, then the target's token.
    Drafts matching the continuation past ``end`` count, as the verifier (and vLLM) counts them
    before the budget cut. ``speculative_generate`` gives the same counts in float32 when the text
    covers ``end + J`` (``benchmarks/eagle3_consistency_probe.py``, ``tests/test_heads.py``)."""
    J, text = drafts_JT.shape[0], np.asarray(text_T)
    ranks_JT = np.full((J, len(text)), NOT_PROPOSED)  # rank 0 where the argmax draft is the true token
    for j in range(J):
        rows = np.arange(max(0, len(text) - 2 - j))
        ranks_JT[j, rows] = np.where(drafts_JT[j, rows] == text[rows + 2 + j], 0, NOT_PROPOSED)
    return tree_acceptance(ranks_JT, [(0,) * m for m in range(1, J + 1)], start, end)


def true_ranks(logits_per_step, text_T, to_column=lambda y: y) -> np.ndarray:
    """Ranks ``[J, T]`` (numpy): where ``text[t + 2 + j]`` stands in step j's logits at row t (``logits_per_step[j]``
    [T, N]; 0 = the argmax; ties rank with the token); ``to_column`` maps token ids to logit columns (-1: not
    proposable). ``NOT_PROPOSED`` past the text and for tokens the drafter cannot propose."""
    text = np.asarray(text_T)
    out = np.full((len(logits_per_step), len(text)), NOT_PROPOSED)
    for j, lg in enumerate(logits_per_step):
        rows = np.arange(max(0, len(text) - 2 - j))
        col, lg = to_column(text[rows + 2 + j]), np.asarray(lg)[rows]
        r = (lg > np.take_along_axis(lg, np.maximum(col, 0)[:, None], axis=1)).sum(axis=1)
        out[j, rows] = np.where(col < 0, NOT_PROPOSED, r)
    return out


def vocab_columns(vocab_size: int, ids_N=None):
    """``true_ranks``' ``to_column`` for logits over a reduced vocabulary ``ids_N`` (column i is token ``ids_N[i]``):
    token id -> column, -1 outside it; the identity when ``ids_N`` is None (logits over the whole vocabulary)."""
    if ids_N is None:
        return lambda y: y
    inv = np.full(vocab_size, -1)
    inv[np.asarray(ids_N)] = np.arange(len(ids_N))
    return lambda y: inv[y]


def draft_model_ranks(cfg, dp: dict, text_T, num_steps: int) -> np.ndarray:
    """``true_ranks`` for a draft model (``DraftModel``; ``cfg`` its ``ModelConfig``): along the accepted path it is
    fed the true tokens, so step j at row t is its logits at position t + 1 + j of one forward over ``text_T``. Over
    its draft vocabulary when it has one (``params["vocab_ids"]``)."""
    logits_TN = np.asarray(model.forward(dp, cfg, jnp.asarray(text_T, jnp.int32)[None])[0][0])
    return true_ranks([logits_TN[1 + j:] for j in range(num_steps)], text_T,
                      vocab_columns(cfg.vocab_size, dp.get("vocab_ids")))


def draft_ranks(tp: dict, cfg: eagle3.Eagle3Config, dp: dict, text_T, num_steps: int) -> np.ndarray:
    """``true_ranks`` of the head's unrolled steps over ``text_T``, in its draft vocabulary (the rank 0 draft is
    ``greedy_drafts``'); tokens outside the draft vocabulary are ``NOT_PROPOSED``."""
    return true_ranks([s[0] for s in _unroll(tp, cfg, dp, text_T, num_steps)], text_T,
                      vocab_columns(cfg.target.vocab_size, dp["draft_ids"]))


def tree_acceptance(ranks_JT, paths, start: int, end: int):
    """``(cycles, accepted_J)`` of greedy decoding with a static draft tree (a set of rank paths, see
    ``specjax.speculative.tree``), replayed offline: a cycle whose last token is ``text[L]`` accepts the longest
    prefix of the true tokens' ranks ``ranks_JT[:, L - 1]`` that is a tree path (``chain_acceptance`` is this
    with the chain's paths ``(0,), (0, 0), ...``; budget and counting as described there)."""
    paths = set(map(tuple, paths))
    J = ranks_JT.shape[0]
    cycles, acc = 0, np.zeros(J, int)
    L = start
    while L + 1 < end:
        cycles += 1
        n = 0
        while n < J and tuple(int(r) for r in ranks_JT[:n + 1, L - 1]) in paths:
            acc[n] += 1
            n += 1
        L += n + 1
    return cycles, acc
