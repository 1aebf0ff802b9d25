"""Probe: host cost per layer of our op at 512x2048 bf16, each timed back to back on the host clock.
Run on a CUDA machine from the repository root: PYTHONPATH=. python experiments/host_layers.py"""

import time

import torch
from triton.runtime.driver import driver

from impls.triton_rmsnorm import direct, function, kernels, launch, replays
from impls.triton_rmsnorm.function import rmsnorm

x = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.ones(2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
dy = torch.randn_like(x)
xd = x.detach()
y0 = rmsnorm(x, w)
torch.cuda.synchronize()


def timed(label, f, n=3000):
    for _ in range(200):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"{label:48s} {(t1 - t) / n * 1e6:7.2f} us/call", flush=True)


y = torch.empty_like(xd)
rstd = torch.empty(512, device="cuda", dtype=torch.float32)
strides = (xd.stride(0), y.stride(0), xd.stride(0), xd.stride(0))
args = (xd, w.detach(), y, rstd, xd, xd, strides, 1e-6, 0.0, False)
wd = w.detach()
timed("rmsnorm (grad mode)", lambda: rmsnorm(x, w))
with torch.no_grad():
    timed("rmsnorm (no_grad)", lambda: rmsnorm(x, w))
timed("launch.rmsnorm_forward", lambda: launch.rmsnorm_forward(xd, wd, 1e-6))
timed("_forward_single_tile (preallocated)", lambda: launch._forward_single_tile(*args))
m, n = 512, 2048
cfg = launch._heuristic_config("rmsnorm_fwd_kernel", 2048) if not launch.autotuning() else None
print("autotuning", launch.autotuning(), flush=True)
timed("validate_inputs", lambda: function.validate_inputs(x, w, 1e-6, 0.0, None))
timed("torch.empty y", lambda: torch.empty((512, 2048), dtype=torch.bfloat16, device=xd.device))
timed("torch.empty rstd", lambda: torch.empty((512,), dtype=torch.float32, device=xd.device))
timed("torch.empty_like", lambda: torch.empty_like(xd))
timed("x.new_empty((m,n))", lambda: xd.new_empty((512, 2048)))
timed("x.new_empty((m,), f32)", lambda: xd.new_empty((512,), dtype=torch.float32))
timed("fwd replay key", lambda: launch._forward_replay_key(xd, wd, None))
print("replays", len(replays.recorded()), "replayed launches", direct.replayed_launches, flush=True)


def ondev():
    with launch._on_device(xd):
        pass


timed("_on_device enter/exit", ondev)
timed("torch.cuda.current_device", lambda: torch.cuda.current_device())
timed("torch._C._cuda_getDevice", lambda: torch._C._cuda_getDevice())
# direct launch internals
key = next(k for k in direct._COMPILED if k[0] is kernels.rmsnorm_fwd_kernel)
compiled = direct._COMPILED[key]
meta = dict(key[2:-1])
print("meta", meta, flush=True)
kargs = (xd, wd, y, rstd, xd, xd, *strides, m, n, 1e-6, 0.0, m.bit_length())
grid = lambda meta: (launch.cdiv(m, meta["BLOCK_M"]),)
timed("direct.launch", lambda: direct.launch(kernels.rmsnorm_fwd_kernel, grid, kargs, meta, 0))
stream = driver.active.get_current_stream(0)
rest = [meta[name] for name in kernels.rmsnorm_fwd_kernel.arg_names[len(kargs) :]]
g0 = launch.cdiv(m, meta["BLOCK_M"])
timed(
    "compiled.run",
    lambda: compiled.run(
        g0,
        1,
        1,
        stream,
        compiled.function,
        compiled.packed_metadata,
        None,
        None,
        None,
        *kargs,
        *rest,
    ),
)
timed("get_current_stream", lambda: driver.active.get_current_stream(0))
keyer = direct._KEYERS[(kernels.rmsnorm_fwd_kernel, len(kargs))]
timed("keyer", lambda: keyer(*kargs))
timed("_tritons_path_required", lambda: direct._tritons_path_required(kernels.rmsnorm_fwd_kernel))
# backward
yy = rmsnorm(x, w)
timed(
    "autograd.grad (fwd kept)",
    lambda: torch.autograd.grad(yy, (x, w), dy, retain_graph=True),
    n=2000,
)
_, rs, _ = launch.rmsnorm_forward(xd, wd, 1e-6)
timed("launch.rmsnorm_backward", lambda: launch.rmsnorm_backward(dy, xd, wd, rs), n=2000)
timed("torch.zeros_like(w)", lambda: torch.empty_like(wd))
timed("rmsnorm fwd+grad", lambda: torch.autograd.grad(rmsnorm(x, w), (x, w), dy), n=2000)
timed("torch.rms_norm fwd (C++)", lambda: torch.rms_norm(x, (2048,), w, 1e-6))
