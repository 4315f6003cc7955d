"""Frozen model configuration for Llama-family decoders (Llama 2/3.x, SmolLM2, Qwen2/2.5).

Shape letters used across specjax: B batch, T new tokens, S cache slots, D model width,
H query heads, G kv heads, d head dim, F ffn width, V vocab, L layers, K draft tokens.
"""

from __future__ import annotations

import dataclasses

COMPUTE_DTYPES = ("param", "float32")


def check_compute_dtype(compute_dtype) -> str:
    """``compute_dtype`` if it is one of ``COMPUTE_DTYPES``, else a ValueError that lists them."""
    if compute_dtype not in COMPUTE_DTYPES:
        names = ", ".join(map(repr, COMPUTE_DTYPES))
        raise ValueError(f"unknown compute_dtype {compute_dtype!r}; expected one of {names} ('param': matmul "
                         "operands in the weight dtype, fast; 'float32': float32 operands with the weights upcast "
                         "inside each product, slower, for bf16 verify/decode agreement)")
    return compute_dtype


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (``rope_type: llama3`` in HF configs)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        if self.factor <= 0 or self.low_freq_factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"invalid llama3 rope scaling {self}: need factor > 0 and high_freq_factor > low_freq_factor > 0")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder. Weights may be float32 or bfloat16 (the params' dtype, not a
    field); the residual stream and every matmul's accumulation and output are float32 regardless.

    ``compute_dtype`` sets the dtype of the matmul *operands* (activations, q, attention probabilities):
      ``"param"``   (default) operands in the weight dtype: with bf16 weights the float32 activations
                    are rounded to bf16 before each matmul and run as bf16 matmuls (fastest).
      ``"float32"`` float32 operands: the stored weights keep their dtype (same params, same memory)
                    and are upcast inside each product, at ``Precision.HIGHEST`` (no TF32); the KV
                    cache is float32 (``cache.init_cache``) and the reference attention keeps q,
                    scores and probabilities in float32; the bf16 Pallas attention kernels are not used. A verify
                    forward (K+1 tokens) and a decode step (1 token) then differ only by float32
                    rounding, so bf16 greedy speculative output keeps AR's tokens far more often.
                    Slower (float32 matmuls). With float32 weights the same as "param" up to matmul
                    precision (bitwise on CPU; a GPU may run "param" float32 matmuls in TF32).
    Applies to the target's forward (``model.forward``, hence also the layer-skip drafter); a draft
    model follows its own ``ModelConfig``; EAGLE-3 and Medusa heads ignore it ("param" numerics):
    drafters' numerics do not affect exactness.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    head_dim: int = 0  # 0 -> d_model // n_heads
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    max_seq_len: int = 2048
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    arch: str = "llama"
    compute_dtype: str = "param"  # "param" | "float32": matmul operand dtype (see the class docstring)

    def __post_init__(self):
        if self.head_dim == 0:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; give head_dim")
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads} (GQA)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.arch not in ("llama", "qwen2"):
            raise ValueError(f"unknown arch {self.arch!r}; expected 'llama' or 'qwen2'")
        check_compute_dtype(self.compute_dtype)
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        D, F, V, L = self.d_model, self.ffn_dim, self.vocab_size, self.n_layers
        per_layer = D * (self.q_dim + 2 * self.kv_dim) + self.q_dim * D + 3 * D * F + 2 * D
        if self.qkv_bias:
            per_layer += self.q_dim + 2 * self.kv_dim
        return V * D * (1 if self.tie_embeddings else 2) + L * per_layer + D


def llama3_8b_shape(max_seq_len: int = 2048) -> ModelConfig:
    """The Llama-3-8B shape (used with random weights in benchmarks)."""
    return ModelConfig(
        vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
        rope_theta=500000.0, norm_eps=1e-5, max_seq_len=max_seq_len,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192), eos_token_ids=(128001,),
    )


def tiny(arch: str = "llama", **kw) -> ModelConfig:
    """A tiny config for tests and notebooks."""
    base = dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                max_seq_len=512, eos_token_ids=(2,), bos_token_id=1, arch=arch, qkv_bias=arch == "qwen2")
    base.update(kw)
    return ModelConfig(**base)
