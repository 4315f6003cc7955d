"""Token shards with a manifest, the deterministic batch order, and the draft vocabulary.

A corpus folder holds ``shard_XXXXX.npz`` files (``tokens`` int32 [n, T], right-padded with 0;
``weight`` uint8 [n, T]: 1 where the target's distribution at that position — predicting the next
token — is trained on, i.e. over the response) and ``manifest.json`` (shapes, row counts, sha256 of
every shard, and free-form ``meta`` such as the generation settings and the eval-overlap check).
Batch ``i`` is a pure function of ``(i, batch_size, seed)``, so the data position of a run is just
its step count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from specjax.errors import CheckpointError
from specjax.files import atomic_write, atomic_write_text

FORMAT = "specjax-token-shards/1"


@dataclasses.dataclass(frozen=True)
class TokenDataset:
    tokens_NT: np.ndarray  # int32
    weight_NT: np.ndarray  # uint8 / float

    def __post_init__(self):
        if self.tokens_NT.shape != self.weight_NT.shape or self.tokens_NT.ndim != 2 or len(self.tokens_NT) == 0:
            raise ValueError(f"tokens {self.tokens_NT.shape} and weight {self.weight_NT.shape} must be equal, "
                             "non-empty [N, T] arrays")

    def __len__(self) -> int:
        return len(self.tokens_NT)

    @property
    def seq_len(self) -> int:
        return self.tokens_NT.shape[1]

    def indices(self, step: int, batch_size: int, seed: int) -> np.ndarray:
        """Rows of batch ``step``: consecutive slices of a fresh permutation per epoch."""
        n = len(self)
        flat = np.arange(step * batch_size, (step + 1) * batch_size)
        out = np.empty(batch_size, np.int64)
        for epoch in np.unique(flat // n):
            perm = np.random.default_rng([seed, int(epoch)]).permutation(n)
            sel = flat // n == epoch
            out[sel] = perm[flat[sel] % n]
        return out

    def batch(self, step: int, batch_size: int, seed: int) -> dict[str, np.ndarray]:
        return self.take(self.indices(step, batch_size, seed))

    def take(self, idx) -> dict[str, np.ndarray]:
        """The rows ``idx`` (indices or a slice) as a training batch: int32 tokens, float32 weights."""
        return {"tokens": self.tokens_NT[idx].astype(np.int32), "weight": self.weight_NT[idx].astype(np.float32)}

    def split(self, n_heldout: int, seed: int | None = None, *,
              by_prompt: bool = False) -> tuple["TokenDataset", "TokenDataset"]:
        """(train, heldout): the last ``n_heldout`` rows are held out, or with ``seed`` a random
        subset of rows (rows are stored grouped by kind and prompt length, so the tail is no sample).
        ``by_prompt`` (needs ``seed``): whole prompts are held out, in random order until at least
        ``n_heldout`` rows, so no trained row answers a held-out prompt (a prompt answered at two
        temperatures has two rows; a random row split would train on one and score the other)."""
        if not 0 < n_heldout < len(self):
            raise ValueError(f"n_heldout must be in [1, {len(self) - 1}], got {n_heldout}")
        if by_prompt:
            if seed is None:
                raise ValueError("split(by_prompt=True) needs a seed")
            _, group_N = np.unique(self.prompt_keys(), return_inverse=True)
            sizes = np.bincount(group_N)
            order = np.random.default_rng(seed).permutation(len(sizes))
            n_groups = int(np.searchsorted(np.cumsum(sizes[order]), n_heldout)) + 1
            if sizes[order[:n_groups]].sum() >= len(self):
                raise ValueError(f"holding out {n_heldout} rows by prompt would leave no training rows")
            held_mask = np.isin(group_N, order[:n_groups])
            keep, held = np.flatnonzero(~held_mask), np.flatnonzero(held_mask)
        else:
            k = len(self) - n_heldout
            order = np.arange(len(self)) if seed is None else np.random.default_rng(seed).permutation(len(self))
            keep, held = np.sort(order[:k]), np.sort(order[k:])
        return (TokenDataset(self.tokens_NT[keep], self.weight_NT[keep]),
                TokenDataset(self.tokens_NT[held], self.weight_NT[held]))

    def prompt_keys(self) -> list[bytes]:
        """One key per row: the bytes of its prompt (the tokens up to the first trained-on position's input)."""
        start_N = np.argmax(self.weight_NT > 0, axis=1)
        return [self.tokens_NT[i, :s + 1].tobytes() for i, s in enumerate(start_N)]


def pack_examples(examples: list[tuple[list[int], list[int]]], seq_len: int) -> TokenDataset:
    """(prompt ids, response ids) pairs -> right-padded rows; weight covers positions that predict
    a response token (prompt_len-1 .. len-2), truncated to ``seq_len``."""
    tokens = np.zeros((len(examples), seq_len), np.int32)
    weight = np.zeros((len(examples), seq_len), np.uint8)
    for i, (prompt, response) in enumerate(examples):
        if not prompt or not response:
            raise ValueError(f"example {i} has an empty prompt or response")
        row = (list(prompt) + list(response))[:seq_len]
        tokens[i, :len(row)] = row
        weight[i, len(prompt) - 1:len(row) - 1] = 1
    return TokenDataset(tokens, weight)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_shards(folder: str | os.PathLike, ds: TokenDataset, *, shard_rows: int = 4096,
                 meta: dict | None = None) -> Path:
    """Write ``ds`` as shards + ``manifest.json`` (written last, so a complete manifest means a complete corpus)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for s, a in enumerate(range(0, len(ds), shard_rows)):
        path = folder / f"shard_{s:05d}.npz"

        def write(tmp, a=a):
            with open(tmp, "wb") as f:
                np.savez(f, tokens=ds.tokens_NT[a:a + shard_rows], weight=ds.weight_NT[a:a + shard_rows])
        atomic_write(path, write)
        shards.append({"file": path.name, "rows": int(min(shard_rows, len(ds) - a)), "sha256": _sha256(path)})
    manifest = {"format": FORMAT, "seq_len": ds.seq_len, "num_examples": len(ds), "shards": shards, "meta": meta or {}}
    atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=1))
    return folder / "manifest.json"


def load_shards(folder: str | os.PathLike) -> tuple[TokenDataset, dict]:
    """Read a corpus folder, checking every shard's checksum against the manifest."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder} has no readable manifest.json ({e}); generate the corpus first") from e
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{folder}/manifest.json has format {manifest.get('format')!r}, expected {FORMAT!r}")
    toks, ws = [], []
    for sh in manifest["shards"]:
        path = folder / sh["file"]
        if not path.is_file() or _sha256(path) != sh["sha256"]:
            raise CheckpointError(f"shard {path} is missing or does not match its sha256 in the manifest")
        with np.load(path) as z:
            toks.append(z["tokens"])
            ws.append(z["weight"])
    return TokenDataset(np.concatenate(toks), np.concatenate(ws)), manifest


def response_token_counts(ds: TokenDataset, vocab_size: int) -> np.ndarray:
    """How often each token id is a trained-on next token (a response token)."""
    nxt = ds.tokens_NT[:, 1:][ds.weight_NT[:, :-1] > 0]
    return np.bincount(nxt, minlength=vocab_size)[:vocab_size]


def draft_vocab(counts_V: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` most frequent ids (ties: lower id first), sorted ascending (SpecForge's order)."""
    if not 0 < size <= len(counts_V):
        raise ValueError(f"draft vocabulary size {size} must be in [1, {len(counts_V)}]")
    order = np.lexsort((np.arange(len(counts_V)), -counts_V))
    return np.sort(order[:size]).astype(np.int32)
