"""Probe (issue 30, item 5): how much of the host cost a call would a C++ host path remove?

Our forward + backward costs 1.18-2.45x torch.nn.functional.rms_norm's host time a call
(harness.host_cost); the layers measured (probes/2026-12-02-4a1227f11028-host-breakdown.txt)
leave Triton's launcher, the Python autograd.Function and the allocations. Before building a C++
host path into the product, this probe builds its floor: a C++ torch::autograd::Function whose
forward and backward allocate their outputs with ATen and launch the very kernels our op's
replays launch (the cached CUfunction, its grid, warps, shared memory, PDL and parameters, read
from the op's recorded replays at the same shape) through cuLaunchKernelEx. Same kernels, same
arguments: the outputs must be bitwise ours (checked first; a mismatch means the parameters were
packed wrong, and the shape's timing is skipped).

Per shape and dtype, host µs a call (harness.costs.host_us_busy: calls queued behind a long GPU
sleep), in one process: torch's F.rms_norm, ours, and the C++ node, each under torch.no_grad
(the forward alone) and as forward + torch.autograd.grad (harness.host_cost.calls). The C++
node covers contiguous [M, N] rows on the single-tile paths only (its launches are fixed at
registration: one shape at a time).

Run on the GPU machine (needs nvcc and the CUDA headers for torch.utils.cpp_extension; ~40 s to
build once):
    PYTHONPATH=. python experiments/host_cpp_node.py out.json [MxN ...]
"""

from __future__ import annotations

import json
import sys

import torch

from harness.costs import host_us_busy
from harness.host_cost import calls
from impls import get_backend
from impls.triton_rmsnorm import kernels, replays
from impls.triton_rmsnorm.backward_launch import (
    _single_tile_backward_args,
    _two_role_backward_args,
)
from impls.triton_rmsnorm.forward_launch import _single_tile_forward_args

EPS = 1e-6
SHAPES = [(64, 4096), (1024, 8192), (2048, 4096), (8192, 4096)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

typedef CUresult (*LaunchEx)(const CUlaunchConfig*, CUfunction, void**, void**);

typedef CUresult (*CtxGetCurrent)(CUcontext*);
typedef CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice);
typedef CUresult (*CtxSetCurrent)(CUcontext);

void* driver_symbol(const char* name) {
  static void* handle = dlopen("libcuda.so.1", RTLD_LAZY);
  TORCH_CHECK(handle != nullptr, "cannot open libcuda.so.1");
  void* symbol = dlsym(handle, name);
  TORCH_CHECK(symbol != nullptr, "libcuda.so.1 has no ", name);
  return symbol;
}

LaunchEx launch_ex() {
  static LaunchEx fn = reinterpret_cast<LaunchEx>(driver_symbol("cuLaunchKernelEx"));
  return fn;
}

// As Triton's launcher does at every launch: a driver context current on this thread (the
// autograd engine's device thread may have none), the device's primary one.
void ensure_context(int device) {
  static auto get = reinterpret_cast<CtxGetCurrent>(driver_symbol("cuCtxGetCurrent"));
  static auto retain = reinterpret_cast<PrimaryCtxRetain>(driver_symbol("cuDevicePrimaryCtxRetain"));
  static auto set = reinterpret_cast<CtxSetCurrent>(driver_symbol("cuCtxSetCurrent"));
  CUcontext context = nullptr;
  TORCH_CHECK(get(&context) == CUDA_SUCCESS, "cuCtxGetCurrent failed");
  if (context == nullptr) {
    TORCH_CHECK(retain(&context, device) == CUDA_SUCCESS, "cuDevicePrimaryCtxRetain failed");
    TORCH_CHECK(set(context) == CUDA_SUCCESS, "cuCtxSetCurrent failed");
  }
}

// A parameter: a tensor's pointer (kind 'p', slot into the call's tensors) or a value
// (kind 'i' int32, 'l' int64, 'f' fp32 bits, 'b' int8).
struct Param { char kind; int64_t slot; int64_t value; };

struct Launch {
  CUfunction fn = nullptr;
  unsigned grid = 0, warps = 0, ctas = 1, shared = 0;
  bool pdl = false;
  std::vector<Param> params;
};

std::map<std::string, Launch> launches;
int64_t partial_rows = 0;  // the backward's dw partials: [partial_rows, N] fp32 (0: none)
std::vector<int64_t> registered_shape;  // the launches are fixed for x of this shape

void check_registered(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous() && w.is_contiguous(),
              "the probe's node takes contiguous 2-D CUDA x");
  TORCH_CHECK(x.sizes().vec() == registered_shape, "x's shape is not the registered one");
}

void run(const std::string& name, const std::vector<at::Tensor>& tensors) {
  const Launch& L = launches.at(name);
  ensure_context(tensors[0].get_device());
  const size_t n = L.params.size();
  std::vector<uint64_t> storage(n + 2, 0);
  std::vector<void*> pointers(n + 2);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = L.params[k];
    switch (p.kind) {
      case 'p': storage[k] = reinterpret_cast<uint64_t>(tensors[p.slot].data_ptr()); break;
      case 'i': { int32_t v = static_cast<int32_t>(p.value); std::memcpy(&storage[k], &v, 4); break; }
      case 'f': { uint32_t v = static_cast<uint32_t>(p.value); std::memcpy(&storage[k], &v, 4); break; }
      case 'b': { int8_t v = static_cast<int8_t>(p.value); std::memcpy(&storage[k], &v, 1); break; }
      case 'u': { uint8_t v = static_cast<uint8_t>(p.value); std::memcpy(&storage[k], &v, 1); break; }
      default: storage[k] = static_cast<uint64_t>(p.value);
    }
    pointers[k] = &storage[k];
  }
  pointers[n] = &storage[n];          // global scratch: none
  pointers[n + 1] = &storage[n + 1];  // profile scratch: none
  CUlaunchAttribute attrs[1];
  CUlaunchConfig config;
  std::memset(&config, 0, sizeof(config));
  config.gridDimX = L.grid * L.ctas;
  config.gridDimY = 1;
  config.gridDimZ = 1;
  config.blockDimX = 32 * L.warps;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = L.shared;
  config.hStream = c10::cuda::getCurrentCUDAStream(tensors[0].get_device()).stream();
  config.attrs = attrs;
  config.numAttrs = 0;
  if (L.pdl) {
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[0].value.programmaticStreamSerializationAllowed = 1;
    config.numAttrs = 1;
  }
  CUresult result = launch_ex()(&config, L.fn, pointers.data(), nullptr);
  TORCH_CHECK(result == CUDA_SUCCESS, "cuLaunchKernelEx failed for ", name, ": ", int(result));
}

}  // namespace

void set_launch(const std::string& name, int64_t fn, int64_t grid, int64_t warps, int64_t ctas,
                int64_t shared, bool pdl, const std::string& kinds,
                const std::vector<int64_t>& slots, const std::vector<int64_t>& values) {
  Launch L;
  L.fn = reinterpret_cast<CUfunction>(fn);
  L.grid = grid; L.warps = warps; L.ctas = ctas; L.shared = shared; L.pdl = pdl;
  for (size_t k = 0; k < kinds.size(); ++k) L.params.push_back({kinds[k], slots[k], values[k]});
  launches[name] = L;
}

void clear_launches(int64_t rows_of_partials, const std::vector<int64_t>& shape) {
  launches.clear();
  partial_rows = rows_of_partials;
  registered_shape = shape;
}

// the forward: tensors (x, w, y, rstd); nograd writes no rstd (its kernel's RSTD is y)
at::Tensor forward_nograd(const at::Tensor& x, const at::Tensor& w) {
  check_registered(x, w);
  at::Tensor y = at::empty_like(x);
  run("fwd_nograd", {x, w, y, y});
  return y;
}

class Node : public torch::autograd::Function<Node> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w) {
    check_registered(x, w);
    at::Tensor y = at::empty_like(x);
    at::Tensor rstd = at::empty({x.size(0)}, x.options().dtype(at::kFloat));
    run("fwd", {x, w, y, rstd});
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& rstd = saved[2];
    at::Tensor dy = grads[0].is_contiguous() ? grads[0] : grads[0].contiguous();
    at::Tensor dx = at::empty_like(x);
    at::Tensor dw = at::empty_like(w);
    // tensors (dy, x, w, rstd, dx, partials, dw)
    if (partial_rows == 0) {
      run("bwd0", {dy, x, w, rstd, dx, dw, dw});
    } else {
      at::Tensor partials = at::empty({partial_rows, x.size(1)}, x.options().dtype(at::kFloat));
      run("bwd0", {dy, x, w, rstd, dx, partials, dw});
      run("bwd1", {dy, x, w, rstd, dx, partials, dw});
    }
    return {dx, dw};
  }
};

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w) { return Node::apply(x, w); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_launch", &set_launch);
  m.def("clear_launches", &clear_launches);
  m.def("forward_nograd", &forward_nograd);
  m.def("rmsnorm", &rmsnorm);
}
"""


def build():
    from torch.utils.cpp_extension import load_inline

    return load_inline("rmsnorm_cpp_node_probe", cpp_sources=[CPP], with_cuda=True,
                       extra_cflags=["-O2"], verbose=False)  # fmt: skip


def _params(replay, args: tuple, slot_of: dict) -> tuple[str, list, list]:
    """(kinds, slots, values) of a replay's compiled kernel for these runtime arguments, in the
    order Triton's launcher passes them (the signature's non-constexpr parameters)."""
    signature = list(replay.compiled.src.signature.values())
    full = (*args, *replay.tail)
    if len(full) != len(signature):
        raise ValueError(f"{replay.kernel.fn.__name__}: {len(full)} arguments, signature "
                         f"{len(signature)}")  # fmt: skip
    kinds, slots, values = [], [], []
    for arg, ty in zip(full, signature, strict=True):
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            kinds.append("p"), slots.append(slot_of[id(arg)]), values.append(0)
        elif ty in ("fp32", "f32"):
            bits = torch.tensor([float(arg)], dtype=torch.float32).view(torch.int32).item()
            kinds.append("f"), slots.append(0), values.append(bits & 0xFFFFFFFF)
        elif ty == "i32":
            kinds.append("i"), slots.append(0), values.append(int(arg))
        elif ty in ("i64", "u64"):  # (a u64 of 2**63 or more passes as its signed bits)
            value = int(arg) & 0xFFFFFFFFFFFFFFFF
            kinds.append("l"), slots.append(0), values.append(value - (value >> 63 << 64))
        elif ty in ("i1", "i8"):
            kinds.append("b"), slots.append(0), values.append(int(arg))
        elif ty in ("u1", "u8"):
            kinds.append("u"), slots.append(0), values.append(int(arg))
        else:
            raise ValueError(f"{replay.kernel.fn.__name__}: parameter type {ty} not handled")
    return "".join(kinds), slots, values


def _register(ext, name: str, replay, args: tuple, slot_of: dict) -> None:
    kinds, slots, values = _params(replay, args, slot_of)
    meta = replay.compiled.metadata
    unsupported = {
        "global scratch": getattr(meta, "global_scratch_size", 0) or 0,
        "profile scratch": getattr(meta, "profile_scratch_size", 0) or 0,
        "cooperative launch": bool(getattr(meta, "launch_cooperative_grid", False)),
        "clusters": getattr(meta, "num_ctas", 1) != 1,
        "a 2-D or 3-D grid": tuple(replay.grid[1:]) != (1, 1),
    }
    refused = [what for what, needed in unsupported.items() if needed]
    if refused:
        raise RuntimeError(f"{replay.kernel.fn.__name__}: the probe's launch lacks {refused}")
    ext.set_launch(name, int(replay.compiled.function), int(replay.grid[0]), int(meta.num_warps),
                   int(getattr(meta, "num_ctas", 1)), int(meta.shared),
                   bool(getattr(meta, "launch_pdl", False)), kinds, slots, values)  # fmt: skip


def _recorded(prefix: str, shape) -> list:
    return [
        (k, v) for k, v in replays.recorded().items() if k[0] == prefix and tuple(k[1]) == shape
    ]


#: Where _forward_replay_key keeps keep_rstd (False: the forward writes no rstd).
_KEEP_RSTD = 6


def register(ext, ours, x, w, dy) -> None:
    """Our op's replays at x's shape, recorded by calls of it (a forward + backward and a
    no-grad forward), registered with the C++ node. Raises where a call was not replayed (not
    the single-tile paths)."""
    replays.forget()
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    torch.autograd.grad(ours(xg, wg, EPS), (xg, wg), dy)
    with torch.no_grad():
        ours(x, w, EPS)
    torch.cuda.synchronize()
    m, n = x.shape
    forwards, backwards = _recorded("fwd", (m, n)), _recorded("bwd", (m, n))
    if len(forwards) != 2 or len(backwards) != 1:
        raise RuntimeError(f"{m}x{n}: {len(forwards)} forward and {len(backwards)} backward "
                           "replays recorded (expected 2 and 1: the single-tile paths)")  # fmt: skip
    y, rstd = torch.empty_like(x), torch.empty(m, device=x.device)
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    (_, (launches, _configs, (programs, rows_per_program, _two_level))) = backwards[0]
    two_role = launches[0].kernel is kernels.rmsnorm_bwd_two_role_kernel
    ext.clear_launches(0 if two_role else programs, [m, n])
    for key, ((replay,), _configs, _extra) in forwards:
        keep_rstd = key[_KEEP_RSTD]
        rstd_arg = rstd if keep_rstd else y  # the kernel's RSTD is y where it writes none
        args = _single_tile_forward_args(x, w, y, rstd_arg, x, x, (n, n, n, n), EPS, 0.0)
        slot_of = {id(x): 0, id(w): 1, id(y): 2, id(rstd_arg): 3 if keep_rstd else 2}
        _register(ext, "fwd" if keep_rstd else "fwd_nograd", replay, args, slot_of)
    slot_of = {id(dy): 0, id(x): 1, id(w): 2, id(rstd): 3, id(dx): 4, id(dw): 6}
    if two_role:
        args = _two_role_backward_args(dy, x, w, rstd, 0.0, dx, dy, dw, programs, rows_per_program)
        _register(ext, "bwd0", launches[0], args, slot_of)
        return
    partials = torch.empty(programs, n, device=x.device)
    slot_of[id(partials)] = 5
    args = _single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partials, rows_per_program)
    _register(ext, "bwd0", launches[0], args, slot_of)
    _register(ext, "bwd1", launches[1], (partials, dw, programs, n), slot_of)


def same_bits(ext, ours, x, w, dy) -> dict:
    """Differing elements between the C++ node's outputs and ours (0 everywhere: the same
    launches)."""
    xa, wa = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    xb, wb = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ya = ours(xa, wa, EPS)
    dxa, dwa = torch.autograd.grad(ya, (xa, wa), dy)
    yb = ext.rmsnorm(xb, wb)
    dxb, dwb = torch.autograd.grad(yb, (xb, wb), dy)
    with torch.no_grad():
        yc, yn = ours(x, w, EPS), ext.forward_nograd(x, w)
    torch.cuda.synchronize()
    return {name: int((a != b).sum()) for name, a, b in
            (("y", ya, yb), ("dx", dxa, dxb), ("dw", dwa, dwb), ("y nograd", yc, yn))}  # fmt: skip


def main(out_path: str, shapes) -> None:
    ext = build()
    ours, torch_op = get_backend("triton").build(), get_backend("torch").build()
    rows = []
    for dtype_name, dtype in DTYPES.items():
        for m, n in shapes:
            gen = torch.Generator().manual_seed(n * 131 + m)
            x = torch.randn(m, n, generator=gen).to("cuda", dtype)
            w = (1 + 0.1 * torch.randn(n, generator=gen)).to("cuda", dtype)
            dy = torch.randn(m, n, generator=gen).to("cuda", dtype)
            row = {"dtype": dtype_name, "m": m, "n": n}
            try:
                register(ext, ours, x, w, dy)
                row["differ"] = same_bits(ext, ours, x, w, dy)
            except Exception as error:  # this shape's paths are not the single tile's, say
                row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                rows.append(row)
                print(row, flush=True)
                _save(out_path, rows)
                continue
            backends = {"torch": torch_op, "ours": ours,
                        "cpp": lambda a, b, eps: ext.rmsnorm(a, b) if torch.is_grad_enabled()
                        else ext.forward_nograd(a, b)}  # fmt: skip
            if any(row["differ"].values()):
                backends.pop("cpp")  # wrong parameters: nothing to time
            for name, fn in backends.items():
                for mode, call in calls(fn, x, w, dy, EPS).items():
                    row[f"{name} {mode} us"] = host_us_busy(call)["host_us"]
            for mode in ("nograd", "fwd_bwd"):
                for name in ("ours", "cpp"):
                    if f"{name} {mode} us" in row:
                        row[f"{name}/torch {mode}"] = (
                            row[f"{name} {mode} us"] / row[f"torch {mode} us"]
                        )
            rows.append(row)
            print(
                {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True
            )
            _save(out_path, rows)


def _save(out_path: str, rows: list) -> None:
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    chosen = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2:]] or SHAPES
    main(sys.argv[1], chosen)
