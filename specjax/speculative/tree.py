"""Static draft trees: which drafts one verify forward scores, as a set of rank paths.

A node is the tuple of ranks that leads to it from the root (the last emitted token): ``(0,)`` is the
drafter's top token after the root, ``(1,)`` its second, ``(0, 2)`` the third token the drafter proposes
after ``(0,)``. A tree is a prefix-closed set of such paths (Medusa's "choices", SpecInfer's token tree);
the chain of K is ``(0,), (0, 0), ...``. Nodes are kept in breadth-first order (by depth, then path),
so a parent always comes before its children and the nodes of one depth are contiguous.

Index 0 of every table below is the root; node i (1..N) is ``paths[i - 1]``. Everything is numpy,
built once on the host: a ``Tree`` is hashable and a static argument of the jitted loop.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np

MAX_NODES = 127  # a verify forward runs N + 1 rows


@dataclasses.dataclass(frozen=True)
class Tree:
    paths: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        try:
            paths = tuple(tuple(int(r) for r in p) for p in self.paths)
        except (TypeError, ValueError):
            raise ValueError(f"a tree is a sequence of rank paths such as [[0], [1], [0, 0]], got {self.paths!r}")
        if not 1 <= len(paths) <= MAX_NODES:
            raise ValueError(f"a tree needs 1..{MAX_NODES} nodes, got {len(paths)}")
        if len(set(paths)) != len(paths):
            raise ValueError("a tree's paths must be distinct")
        for p in paths:
            if not p or min(p) < 0:
                raise ValueError(f"each path is a non-empty tuple of ranks >= 0, got {p}")
            if len(p) > 1 and p[:-1] not in paths:
                raise ValueError(f"the tree is not prefix-closed: {p} is in it but its parent {p[:-1]} is not")
        object.__setattr__(self, "paths", tuple(sorted(paths, key=lambda p: (len(p), p))))

    @classmethod
    def chain(cls, k: int) -> "Tree":
        return cls(tuple((0,) * m for m in range(1, k + 1)))

    @classmethod
    def load(cls, path: str | Path, size: int | None = None, drafter: str | None = None) -> "Tree":
        """A tree from JSON: a list of paths, or ``{drafter: {size: paths}}`` as the shipped ``trees.json``."""
        data = json.loads(Path(path).read_text())
        if isinstance(data, dict):
            if drafter not in data or str(size) not in data[drafter]:
                have = {k: sorted(v, key=int) for k, v in data.items() if k != "meta"}
                raise ValueError(f"{path} has no {size}-node tree for {drafter}; it has {have}")
            data = data[drafter][str(size)]
        return cls(tuple(map(tuple, data)))

    @property
    def num_nodes(self) -> int:
        """N: draft tokens per cycle (the verify forward runs N + 1 rows, the root first)."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        """The longest path: the most drafts one cycle can accept."""
        return max(map(len, self.paths))

    @functools.cached_property
    def _index(self) -> dict:
        return {p: i + 1 for i, p in enumerate(self.paths)}

    @functools.cached_property
    def parent(self) -> np.ndarray:
        """int32 [N + 1]: the parent's index (the root's is 0, itself)."""
        return np.array([0] + [self._index.get(p[:-1], 0) for p in self.paths], np.int32)

    @functools.cached_property
    def depths(self) -> np.ndarray:
        """int32 [N + 1]: 0 for the root."""
        return np.array([0] + [len(p) for p in self.paths], np.int32)

    @functools.cached_property
    def ranks(self) -> np.ndarray:
        """int32 [N + 1]: each node's rank among its parent's proposals (the root's: 0)."""
        return np.array([0] + [p[-1] for p in self.paths], np.int32)

    @functools.cached_property
    def ancestors(self) -> np.ndarray:
        """bool [N + 1, N + 1]: ``[i, j]`` when j is i or an ancestor of i (the attention mask of the rows)."""
        a = np.eye(self.num_nodes + 1, dtype=bool)
        for i in range(1, self.num_nodes + 1):
            a[i] |= a[self.parent[i]]
        return a

    @functools.cached_property
    def path_to(self) -> np.ndarray:
        """int32 [N + 1, depth + 1]: ``[i, d]`` the ancestor of node i at depth d (i itself past its depth)."""
        out = np.zeros((self.num_nodes + 1, self.depth + 1), np.int32)
        for i in range(self.num_nodes + 1):
            chain, j = [], i
            while j:
                chain.append(j)
                j = self.parent[j]
            chain = [0] + chain[::-1]
            out[i] = chain + [i] * (self.depth + 1 - len(chain))
        return out

    @functools.cached_property
    def children(self) -> np.ndarray:
        """int32 [N + 1, M]: each node's children by rank, -1 padded (M = the most children of a node)."""
        kids = [[] for _ in range(self.num_nodes + 1)]
        for i in range(1, self.num_nodes + 1):
            kids[self.parent[i]].append(i)  # paths are sorted, so children come by rank
        M = max(map(len, kids))
        return np.array([k + [-1] * (M - len(k)) for k in kids], np.int32)

    def level(self, d: int) -> tuple[int, int]:
        """Node indices ``[lo, hi)`` at depth d >= 1 (contiguous: breadth-first order)."""
        idx = np.flatnonzero(self.depths == d)
        return int(idx[0]), int(idx[-1]) + 1

    def top_k(self, d: int) -> int:
        """How many proposals the nodes at depth d - 1 need: the largest rank at depth d, plus one."""
        lo, hi = self.level(d)
        return int(self.ranks[lo:hi].max()) + 1

    def is_chain(self) -> bool:
        return self == Tree.chain(self.num_nodes)

    def __repr__(self) -> str:
        return f"Tree({self.num_nodes} nodes, depth {self.depth})"
