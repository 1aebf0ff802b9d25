"""Shape presets for harness.compare: (M, N) pairs, M rows of hidden size N, and per-head views.

A preset entry is an (M, N) tuple, or a :class:`HeadView`: the per-head QK-norm input, a strided
[tokens, heads, head_dim] view of a packed QKV projection. A HeadView unpacks as (M, N) with
M = tokens * heads and N = head_dim, so the byte model counts the logical bytes (the rows the
norm reads and writes), never the QKV buffer around them.
"""

from __future__ import annotations

import re


class HeadView(tuple):
    """q = qkv[:, :heads * head_dim].view(tokens, heads, head_dim), qkv a contiguous
    [tokens, (heads + 2 * kv_heads) * head_dim] projection: rows of head_dim contiguous elements,
    head stride head_dim, token stride the packed width. Unpacks as (M, N)."""

    tokens: int
    heads: int
    head_dim: int
    kv_heads: int

    def __new__(cls, tokens: int, heads: int, head_dim: int, kv_heads: int) -> HeadView:
        for name, value in (("tokens", tokens), ("heads", heads), ("head_dim", head_dim),
                            ("kv_heads", kv_heads)):  # fmt: skip
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        view = super().__new__(cls, (tokens * heads, head_dim))
        view.tokens, view.heads, view.head_dim, view.kv_heads = tokens, heads, head_dim, kv_heads
        return view

    @property
    def packed_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def dims(self) -> tuple[int, int, int]:
        return (self.tokens, self.heads, self.head_dim)

    def label(self) -> str:
        return f"{self.tokens}x{self.heads}x{self.head_dim}/qkv{self.packed_width}"

    def __repr__(self) -> str:
        return f"HeadView({self.tokens}, {self.heads}, {self.head_dim}, {self.kv_heads})"

    # A view is not the contiguous (M, N) case with the same numbers: compare the layout too.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeadView) and (self.dims, self.kv_heads) == (
            other.dims, other.kv_heads)  # fmt: skip

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(("HeadView", self.dims, self.kv_heads))

    def __reduce__(self):
        return (HeadView, (self.tokens, self.heads, self.head_dim, self.kv_heads))


Shape = tuple[int, int]


def shape_label(shape: Shape) -> str:
    """'MxN', or a HeadView's 'TxHxD/qkvW' (what result rows name the case by)."""
    return shape.label() if isinstance(shape, HeadView) else f"{shape[0]}x{shape[1]}"


#: Hidden sizes of current model families, from each model's config.json ("hidden_size").
#: Gemma's norms compute x_hat * (1 + w): the flashinfer-gemma row is that form.
MODELS: dict[str, int] = {
    "Llama-3.2-1B": 2048,
    "Llama-3.2-3B": 3072,
    "Llama-3-8B / Qwen3-8B": 4096,
    "Llama-3-70B / Qwen2.5-72B": 8192,
    "Llama-3.1-405B": 16384,
    "Qwen2.5-7B": 3584,
    "Qwen3-4B": 2560,
    "Qwen3-14B / Mistral-Nemo-12B": 5120,
    "Qwen3-32B": 5120,
    "Mistral-7B / Mixtral-8x7B": 4096,
    "Mixtral-8x22B": 6144,
    "Gemma-2-9B (offset form)": 3584,
    "Gemma-2-27B (offset form)": 4608,
    "Gemma-3-12B (offset form)": 3840,
    "Gemma-3-27B (offset form)": 5376,
    "DeepSeek-V3 / R1": 7168,
    "GPT-OSS-120B / 20B": 2880,
}
#: Rows per call across serving and training: a decode step, a prefill chunk, a training batch.
MODEL_ROWS = (1, 2048, 16384)

#: (heads, kv_heads, head_dim) of per-head QK-norm (query heads; the key norm is the same op on
#: kv_heads): Qwen3-8B (32, 8, 128), Qwen3-32B (64, 8, 128), Qwen3-14B (40, 8, 128),
#: Gemma-3-4B (8, 4, 256); and (32, 8, 64), a 64-wide head layout (Llama-3.2-1B's attention
#: shape) named by no QK-norm model here. No two share (tokens * heads, head_dim): the tables
#: key cases by (M, N, dtype).
QK_HEADS = ((32, 8, 128), (64, 8, 128), (40, 8, 128), (8, 4, 256), (32, 8, 64))
QK_TOKENS = (16, 4096)


def _model_shapes() -> list[Shape]:
    widths = sorted(set(MODELS.values()))
    return [(m, n) for n in widths for m in MODEL_ROWS]


PRESETS: dict[str, tuple[str, list[Shape]]] = {
    "seed": (
        "the seed's sweep: N in {2048, 4096, 8192} x M in {512, 1024, 2048, 4096}",
        [(m, n) for n in (2048, 4096, 8192) for m in (512, 1024, 2048, 4096)],
    ),
    "narrow": (
        "many narrow rows, as in per-head QK-norm: N in {128, 512, 1024}, M*N = 32M",
        [(2**25 // n, n) for n in (128, 512, 1024)],
    ),
    "large": (
        "large inputs, M*N >= 128M: N = 4096 and 8192",
        [(32768, 4096), (16384, 8192), (65536, 8192)],
    ),
    "odd": (
        "odd hidden sizes of real models: N in {3584, 4095, 5120, 7168}, M = 8192",
        [(8192, n) for n in (3584, 4095, 5120, 7168)],
    ),
    "wide": (
        "wide rows, N from 16384 to 1048576, M*N = 64M",
        [(2**26 // n, n) for n in (16384, 32768, 65536, 131072, 262144, 1048576)],
    ),
    "decode": (
        "decode steps, where launch latency and host cost decide: M in {1, 16, 64, 256} x "
        "N in {2048, 4096, 8192}",
        [(m, n) for n in (2048, 4096, 8192) for m in (1, 16, 64, 256)],
    ),
    "qk-norm": (
        "per-head QK-norm on strided [tokens, heads, head_dim] views of a packed QKV projection: "
        "head_dim 64, 128, 256, 8-64 heads, 16 and 4096 tokens (no copy is made; a "
        "backend that copies pays it in its time)",
        [HeadView(t, h, d, kv) for h, kv, d in QK_HEADS for t in QK_TOKENS],
    ),
    "models": (
        "hidden sizes of current model families, M in {1, 2048, 16384}: "
        + ", ".join(f"{name} {n}" for name, n in MODELS.items()),
        _model_shapes(),
    ),
    "cpu": (
        "a small sweep for machines without CUDA (interpreter: not performance numbers)",
        [(64, 512), (128, 1000)],
    ),
}


_HEAD_VIEW = re.compile(r"^(\d+)x(\d+)x(\d+)/qkv(\d+)$")


def parse_shape(text: str) -> Shape:
    """'4096x8192' -> (4096, 8192); '4096x32x128/qkv6144' -> a HeadView (its packed width must
    be (heads + 2 * kv_heads) * head_dim); a clear error otherwise."""
    view = _HEAD_VIEW.match(text.strip().lower())
    if view:
        t, h, d, width = (int(g) for g in view.groups())
        kv, rest = divmod(width // d - h, 2) if width % d == 0 else (0, 1)
        if rest or kv <= 0:
            raise ValueError(
                f"shape: packed width {width} is not (heads + 2 * kv_heads) * head_dim with "
                f"heads={h}, head_dim={d} in {text!r}"
            )
        return HeadView(t, h, d, kv)
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"shape: expected MxN such as 4096x8192, got {text!r}")
    m, n = (int(p) for p in parts)
    if m <= 0 or n <= 0:
        raise ValueError(f"shape: M and N must be positive, got {text!r}")
    return m, n


def resolve(presets: list[str], explicit: list[str]) -> list[Shape]:
    """Shapes of the named presets, then explicit shapes, without duplicates, in order."""
    shapes: list[Shape] = []
    for name in presets:
        if name not in PRESETS:
            raise ValueError(f"preset: unknown {name!r}; known: {', '.join(PRESETS)}")
        shapes.extend(PRESETS[name][1])
    shapes.extend(parse_shape(s) for s in explicit)
    return list(dict.fromkeys(shapes))
