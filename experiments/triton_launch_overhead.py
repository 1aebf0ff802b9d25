"""Probe: host microseconds per Triton launch on the H200 (see the .md beside it). Run on a
CUDA machine: python experiments/triton_launch_overhead.py"""

import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import compute_cache_key


@triton.jit
def k(
    X,
    Y,
    W,
    RSTD,
    R,
    RO,
    B,
    sx,
    sy,
    sr,
    sro,
    N,
    M,
    eps,
    off,
    a,
    b,
    HAS_RES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_N)
    m = c < N
    x = tl.load(X + row * sx + c, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(R + row * sr + c, mask=m, other=0.0).to(tl.float32)
        tl.store(RO + row * sro + c, x, mask=m)
    r = 1 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    tl.store(RSTD + row, r)
    w = tl.load(W + c, mask=m).to(tl.float32) + off
    tl.store(Y + row * sy + c, (x * r * w).to(Y.dtype.element_ty), mask=m)


M_, N_ = 64, 4096
d = "cuda"
x = torch.randn(M_, N_, device=d, dtype=torch.bfloat16)
y = torch.empty_like(x)
w = torch.ones(N_, device=d, dtype=torch.bfloat16)
rs = torch.empty(M_, device=d)
r = torch.randn_like(x)
ro = torch.empty_like(x)
bb = torch.empty(1, device=d)
args = [x, y, w, rs, r, ro, bb, N_, N_, N_, N_, N_, M_, 1e-6, 0.0, 3, 5]
kw = dict(HAS_RES=True, BLOCK_N=N_, BLOCK_M=1, num_warps=8, num_stages=1)
g = (M_,)


def bench(name, f, n=3000):
    for _ in range(200):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(
        f"{name:42s} {(t1 - t) / n * 1e6:7.2f} us/call (incl final sync {(t2 - t) / n * 1e6:7.2f})",
        flush=True,
    )


print(triton.__version__, torch.__version__, "enter_hook=", knobs.runtime.launch_enter_hook)
ck = k[g](*args, **kw)
print(
    "kernel:",
    type(ck).__name__,
    "n_regs",
    ck.n_regs,
    "shared",
    ck.metadata.shared,
    "scratch",
    ck.metadata.global_scratch_size,
)
bench("F.rms_norm", lambda: F.rms_norm(x, (N_,), w, 1e-6))
bench("kernel[grid](...) full JIT path", lambda: k[g](*args, **kw))
dev = driver.active.get_current_device()
st = driver.active.get_current_stream(dev)
kc, kkc, tgt, be, binder = k.device_caches[dev]
bench("get_current_device", lambda: driver.active.get_current_device())
bench("get_current_stream", lambda: driver.active.get_current_stream(dev))
bench("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream)
bench("binder", lambda: binder(*args, **kw))
ba, sp, op = binder(*args, **kw)
bench("compute_cache_key", lambda: compute_cache_key(kkc, sp, op))
bench("launch_metadata", lambda: ck.launch_metadata(g, st, *ba.values()))
bv = list(ba.values())
bench(
    "ck.run direct (tensors)",
    lambda: ck.run(M_, 1, 1, st, ck.function, ck.packed_metadata, None, None, None, *bv),
)
bi = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in bv]
bench(
    "ck.run direct (int ptrs)",
    lambda: ck.run(M_, 1, 1, st, ck.function, ck.packed_metadata, None, None, None, *bi),
)
run = ck[(M_, 1, 1)]
bench("CompiledKernel[grid](*args) runner", lambda: run(*bv))
bench("x.data_ptr() x7", lambda: [t.data_ptr() for t in bv[:7]])


def cached():
    s = driver.active.get_current_stream(dev)
    ck.run(M_, 1, 1, s, ck.function, ck.packed_metadata, None, None, None, *bv)


bench("cached: get_stream + ck.run", cached)
