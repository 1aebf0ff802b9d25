"""The thin Llama that harness.ddp_step trains, and the norms it is built with.

The model is written in plain PyTorch (tokens -> embedding -> blocks of RMSNorm, causal
attention through SDPA with rotary embeddings, RMSNorm, SwiGLU MLP -> RMSNorm -> head). Its
residual stream is wide (ModelConfig.hidden, the norm's N; ddp_step's --hidden) and its
attention and MLP narrow, so that N = 32768 (where 16-bit rows take the grouped held-row paths)
fits on one GPU with its optimizer.

NORMS names the two norms a model is built with: ours (impls.triton_rmsnorm.RMSNorm, imported
when a model is built with it, so after main sets TRITON_INTERPRET) and stock
(torch.nn.RMSNorm). build_model initializes in fp32 from a seed, whichever the norm (neither
draws from the RNG); make_tokens draws each rank's fixed batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 4096
    layers: int = 2
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    ffn: int = 1024
    vocab: int = 1024
    seq: int = 256
    eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive int, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads: expected a multiple of kv_heads={self.kv_heads}, got {self.heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim: expected an even number (rotary), got {self.head_dim}")


NormFactory = Callable[[int, float], nn.Module]


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on [B, heads, S, D] in fp32, back to x's dtype."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, (b, s, _) = self.c, x.shape
        q = self.q(x).view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, c.head_dim, 2, device=x.device) / c.head_dim))
        angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv_freq)
        q, k = _rotary(q, angles.cos(), angles.sin()), _rotary(k, angles.cos(), angles.sin())
        if c.kv_heads != c.heads:
            k = k.repeat_interleave(c.heads // c.kv_heads, dim=1)
            v = v.repeat_interleave(c.heads // c.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, c.heads * c.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(c.hidden, c.ffn, bias=False)
        self.up = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c: ModelConfig, norm: NormFactory) -> None:
        super().__init__()
        self.attn_norm, self.attn = norm(c.hidden, c.eps), Attention(c)
        self.mlp_norm, self.mlp = norm(c.hidden, c.eps), SwiGLU(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.mlp_norm(h))


class TinyLlama(nn.Module):
    """Pre-norm Llama blocks; loss() is next-token cross entropy (in fp32)."""

    def __init__(self, c: ModelConfig, norm: NormFactory) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(Block(c, norm) for _ in range(c.layers))
        self.norm = norm(c.hidden, c.eps)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


def ours_norm(n: int, eps: float) -> nn.Module:
    from impls.triton_rmsnorm import RMSNorm  # triton is imported here, after TRITON_INTERPRET

    return RMSNorm(n, eps=eps)


def stock_norm(n: int, eps: float) -> nn.Module:
    return nn.RMSNorm(n, eps=eps)


NORMS: dict[str, NormFactory] = {"ours": ours_norm, "stock": stock_norm}


def is_norm(module: nn.Module) -> bool:
    from impls.triton_rmsnorm import RMSNorm

    return isinstance(module, (RMSNorm, nn.RMSNorm))


def build_model(
    c: ModelConfig, norm: NormFactory, dtype: torch.dtype, device: torch.device, seed: int
) -> TinyLlama:
    """Initialized in fp32 from `seed` on `device` (so every run starts from the same values,
    whichever norm it has: neither norm draws from the RNG), then cast to dtype."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = TinyLlama(c, norm)
    return model.to(dtype)


def make_tokens(c: ModelConfig, batch: int, seed: int, rank: int, device) -> torch.Tensor:
    """A fixed batch per rank (drawn on the CPU): the steps fit it, so the loss falls."""
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randint(0, c.vocab, (batch, c.seq), generator=gen).to(device)
