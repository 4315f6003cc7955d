"""The drafter protocol: ``init`` once after prefill, ``propose`` K tokens with their q, ``update``.

A drafter is a frozen (hashable) dataclass holding only static settings; it is a static argument
of the jitted loop. Weights travel separately as pytrees: ``tp`` (the target's params, which
self-speculative drafters reuse) and ``dp`` (the drafter's own params: a draft model, an exit head,
EAGLE/Medusa heads, or ``None``). All methods run inside the jit, once per cycle, on device.

Positions: the target cache holds every token before the last emitted one; ``ctx.lengths_B`` (L) is
the position of ``ctx.last_B``. A cycle feeds ``[last, d_1..d_K]`` at positions ``L..L+K`` to the
target, accepts ``n`` drafts and emits one more token, so the next cycle has ``L' = L + num_new``.

Heads (EAGLE-3, Medusa) declare the target hidden states they consume in ``taps`` (indices as in
``model.forward``): the loop computes them in the prefill and in every verify forward, and hands
them over in ``Prefill.taps`` ([B, T, D] per tap) and ``Verified.taps`` ([B, K+1, D] per tap, for
the fed tokens ``[last, d_1..d_K]``; the first ``num_new`` of them are now part of the context).
With a draft tree (``Drafter.tree``), ``propose`` returns the N nodes' tokens (tree order, q None) and
``Verified`` holds the fed tokens and taps along the accepted path, ``depth + 1`` rows: a chain's view (and in
``nodes_BK1`` the path's node indices, for a drafter whose own cache holds the nodes' rows).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specjax import sampling
from specjax.cache import KVCache
from specjax.config import ModelConfig
from specjax.heads import eagle3
from specjax.sampling import SamplingParams
from specjax.speculative.tree import Tree

_static = dict(static=True)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prefill:
    """What a drafter sees once, after the target's prefill."""
    tokens_BT: jax.Array  # int32: right-padded prompts
    lengths_B: jax.Array  # int32: prompt lengths (= position of the first generated token)
    history_BS: jax.Array  # int32: prompt + first generated token, by position; S = cache capacity
    taps: tuple[jax.Array, ...]  # target hidden states over the prompt, one [B, T, D] per drafter tap


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Context:
    """What a drafter sees at the start of each cycle."""
    history_BS: jax.Array  # int32: every token so far by position (slots > lengths_B are stale)
    lengths_B: jax.Array  # int32: L = target cache length = position of last_B
    last_B: jax.Array  # int32: the last emitted token (not yet in the target cache)
    key: jax.Array  # this cycle's drafting key
    sp: SamplingParams
    num_draft: int = dataclasses.field(metadata=_static, default=1)  # K

    @property
    def greedy(self) -> bool:
        """temperature == 0, fixed on the host (``SamplingParams.is_greedy``): a static Python bool."""
        return self.sp.is_greedy


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Proposal:
    tokens_BK: jax.Array  # int32 draft tokens d_1..d_K
    q_BKV: jax.Array | None  # float32 distributions they were drawn from; None = one-hot (deterministic)
    num_drafts_B: jax.Array | None = None  # int32 drafts proposed per row when a drafter stops early (slots past
    #                                        it are padding the verifier never accepts); None: all K


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Verified:
    """What a drafter sees after verification (for live and finished rows alike)."""
    fed_BK1: jax.Array  # int32 [last, d_1..d_K] as fed to the target at positions L..L+K
    taps: tuple[jax.Array, ...]  # target hidden states at those K+1 positions, one [B, K+1, D] per tap
    num_accepted_B: jax.Array  # int32 drafts accepted by the verifier (before EOS/budget cuts)
    num_new_B: jax.Array  # int32 tokens emitted this cycle (0 if finished); fed_BK1[:, :num_new] joined the context
    lengths_B: jax.Array  # int32 new L (old L + num_new)
    last_B: jax.Array  # int32 new last token (the bonus/correction, or an earlier one if cut)
    nodes_BK1: jax.Array | None = None  # trees: the accepted path's fed rows (root 0, its nodes; ``Verdict.nodes_BK1``)


@dataclasses.dataclass(frozen=True)
class Drafter:
    """Base class; subclasses override ``propose`` and, if they keep state, ``init``/``update``."""
    taps: ClassVar[tuple[int, ...]] = ()  # target hidden states consumed (a property may compute them)
    name: ClassVar[str] = "drafter"  # the CLI's --method name
    max_draft: ClassVar[int | None] = None  # largest K supported (None: any), e.g. Medusa's head count

    @property
    def tree(self) -> Tree | None:
        """The static draft tree; drafters that draft trees (draft model, EAGLE-3, Medusa) have it as a field (None: a
        chain)."""
        return None

    def validate(self, cfg: ModelConfig, dp: Any, num_draft: int) -> None:
        """Host-side checks before compiling; raise ValueError saying what is wrong."""
        if self.tree is not None:
            if num_draft != self.tree.num_nodes:
                raise ValueError(f"with a draft tree, num_draft is its node count {self.tree.num_nodes}, "
                                 f"got {num_draft}")
            if self.max_draft is not None and self.tree.depth > self.max_draft:
                raise ValueError(f"{self.name} drafts at most {self.max_draft} tokens deep, got a tree of depth "
                                 f"{self.tree.depth}")
            return
        if self.max_draft is not None and num_draft > self.max_draft:
            raise ValueError(f"{self.name} proposes at most {self.max_draft} tokens per cycle, "
                             f"got num_draft={num_draft}")

    def init(self, tp: dict, dp: Any, pre: Prefill, cfg: ModelConfig) -> Any:
        """Drafter state after prefill (any pytree; ``()`` when stateless)."""
        return ()

    def propose(self, tp: dict, dp: Any, state: Any, ctx: Context, target_cache: KVCache,
                cfg: ModelConfig) -> tuple[Proposal, Any, KVCache]:
        """K draft tokens and their q (with a tree: its N nodes' tokens in the tree's order, q None).
        ``target_cache`` is threaded through so self-speculative
        drafters can write their layers' K/V in place (the verify forward overwrites positions
        L..L+K); others return it unchanged. Its ``lengths_B`` must come back unchanged."""
        raise NotImplementedError

    def update(self, tp: dict, dp: Any, state: Any, ver: Verified) -> Any:
        return state


def row_at(x_BTD: jax.Array, i_B: jax.Array) -> jax.Array:
    """Row ``i_B[b]`` of each sequence's ``[T, D]`` block -> ``[B, D]`` (e.g. the hidden state of the
    last accepted token)."""
    return jnp.take_along_axis(x_BTD, i_B[:, None, None], axis=1)[:, 0]


def confidence(logits_BV: jax.Array, tok_B: jax.Array, q_BV: jax.Array | None) -> jax.Array:
    """The drafter's probability of the token it drafted, float32 [B]: q(token) when sampling (``q_BV``, over the
    target's vocabulary), else softmax(logits) at the argmax (greedy; over the logits' own vocabulary, e.g. a
    reduced draft vocabulary). What ``min_confidence`` (stop drafting below it) compares against."""
    if q_BV is not None:
        return jnp.take_along_axis(q_BV, tok_B[:, None], axis=-1)[:, 0]
    l_BV = logits_BV.astype(jnp.float32)
    return jnp.exp(jnp.max(l_BV, axis=-1) - jax.nn.logsumexp(l_BV, axis=-1))


def tree_children(tree: Tree, logits_BnN: jax.Array, d: int) -> jax.Array:
    """Logit columns [B, n_d] of the tree's nodes at depth d >= 1: node i is rank ``tree.ranks[i]`` of its parent's
    row in ``logits_BnN``, the drafter's logits at the nodes of depth d - 1 (at depth 1: one row, the root's). Where
    the depth takes only rank 0 this is an argmax (XLA's top-k kernel cost ~3.8 us a call on an H200,
    benchmarks/NOTES.md item 45); both take the lowest column among ties."""
    lo, hi = tree.level(d)
    plo = tree.level(d - 1)[0] if d > 1 else 0
    if tree.top_k(d) == 1:
        return jnp.argmax(logits_BnN, axis=-1)[:, tree.parent[lo:hi] - plo].astype(jnp.int32)
    top_BnR = jax.lax.top_k(logits_BnN, tree.top_k(d))[1]
    return top_BnR[:, tree.parent[lo:hi] - plo, tree.ranks[lo:hi]]


def check_min_confidence(drafter: Drafter) -> None:
    """Host-side check of a drafter's ``min_confidence`` field (drafters with an adaptive chain)."""
    c = drafter.min_confidence
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 <= c < 1.0:
        raise ValueError(f"{drafter.name}: min_confidence (stop drafting once the drafter's probability of its token "
                         f"is below it) must be a number in [0, 1), 0 = always draft K; got {c!r}")


def draw(key: jax.Array, logits_BV: jax.Array, sp: SamplingParams, ids_N: jax.Array | None = None,
         vocab_size: int | None = None) -> tuple[jax.Array, jax.Array | None]:
    """Sample a draft token and return the distribution q it was drawn from ([B], [B, V]).

    q uses ``sampling.probs`` (the same temperature/top-k/top-p as the target's p). When greedy
    (``sp.is_greedy``), the token is the argmax and q is ``None`` (one-hot), so no sort or softmax over V is done.
    With ``ids_N`` the logits are over a reduced draft vocabulary [B, N] (row i is target token ``ids_N[i]``): the
    token is mapped back to the target's ``vocab_size`` tokens, and q is zero outside the draft vocabulary.
    """
    if ids_N is not None:
        if sp.is_greedy:
            return jnp.take(ids_N, jnp.argmax(logits_BV, axis=-1)).astype(jnp.int32), None
        logits_BV = eagle3.to_target_vocab(logits_BV, ids_N, vocab_size)
    if sp.is_greedy:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32), None
    q_BV = sampling.probs(logits_BV, sp)
    return sampling.sample_from_probs(key, q_BV), q_BV
