"""Where and with what a result was measured: GPU, versions, commit, date."""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import os
import platform
import subprocess

import torch

_PACKAGES = ("torch", "triton", "liger-kernel", "quack-kernels", "nvidia-cutlass-dsl", "apex",
             "flashinfer-python", "nvidia-cudnn-frontend", "fla-core", "cuda-tile",
             "apache-tvm-ffi", "transformer-engine", "vllm", "sgl-kernel")  # fmt: skip


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


#: What a resumed run (harness.compare --resume, harness.fp8_bench --resume) must share with
#: the run it continues: the tree, the software, the GPU and its driver.
SAME_RUN = (
    "commit",
    "dirty",
    "versions",
    "gpu",
    "driver",
    "cuda",
    "triton_autotune",
    "triton_host_path",
    "dispatch_table",  # a table changed between the parts of a run would mix two dispatches
)


def run_differences(stored: dict, here: dict, extra: tuple = ()) -> str:
    """'' when the two provenance records agree on SAME_RUN and extra (a harness's own keys),
    else what differs, in words."""
    return ", ".join(f"{k} {stored.get(k)!r} there, {here.get(k)!r} here"
                     for k in (*SAME_RUN, *extra) if stored.get(k) != here.get(k))  # fmt: skip


def _host_path() -> str:
    """'cpp' where the C++ host path serves our calls in this process, else 'python'."""
    from impls.triton_rmsnorm import host_path

    return host_path.current()


def collect() -> dict:
    info: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # A copy whose .git is missing or stale (the GPU machine's) names its commit in the
        # environment, which wins over git.
        "commit": os.environ.get("RMSNORM_BENCH_COMMIT") or _git("rev-parse", "--short=12", "HEAD"),
        # Unknown (None) when the commit comes from the environment: that copy's git cannot tell.
        "dirty": None
        if os.environ.get("RMSNORM_BENCH_COMMIT")
        else bool(_git("status", "--porcelain", "--untracked-files=no")),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in _PACKAGES},
        "cuda": torch.version.cuda,
        # Our kernels' launch configs: the dispatch table (the product; heuristic where it has
        # no entry), or the quick-check heuristic only (RMSNORM_TRITON_AUTOTUNE=0).
        "triton_autotune": os.environ.get("RMSNORM_TRITON_AUTOTUNE", "1") != "0",
        "triton_runtime_tuning": os.environ.get("RMSNORM_TRITON_TUNE", "0") == "1",
        # Whether our calls' host side ran in C++ (impls/triton_rmsnorm/host_path.py, opt-in).
        "triton_host_path": _host_path(),
    }
    info["versions"]["torch"] = torch.__version__
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["gpu"] = props.name
        info["sm_count"] = props.multi_processor_count
        info["l2_bytes"] = int(getattr(props, "L2_cache_size", 0))
        info["memory_bytes"] = int(props.total_memory)
        info["driver"] = _nvidia_smi("driver_version")
        info["torch_rms_norm"] = rms_norm_dispatch()
        info["dispatch_table"] = _dispatch_table(props.name)
    else:
        info["gpu"] = None
        info["note"] = (
            "no CUDA device: Triton ran through its interpreter; times are not performance numbers"
        )
    return info


def _dispatch_table(gpu_name: str) -> dict | None:
    """The committed dispatch table our op reads on this GPU: its file and sha256 (None: no
    table, the heuristic serves every call)."""
    from impls.triton_rmsnorm import dispatch_table

    return table_record(dispatch_table.committed_table_path(gpu_name), b'"direction"')


def table_record(path, entry_marker: bytes | None = None) -> dict | None:
    """A committed table's file name and sha256 (its first 16 hex digits) for a run's
    provenance, with its entry count where entry_marker names the bytes each entry holds once;
    None where there is no such file."""
    if not path.exists():
        return None
    data = path.read_bytes()
    record = {"file": path.name, "sha256": hashlib.sha256(data).hexdigest()[:16]}
    if entry_marker is not None:
        record["entries"] = data.count(entry_marker)
    return record


def _nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


#: Kernel-name fragments of the CuTe DSL / QuACK kernels newer torch may route F.rms_norm to.
_CUTE_MARKERS = ("cutlass", "cute", "quack", "rmsnorm_fwd", "rmsnorm_bwd")


def route_of(kernels: list[str]) -> str:
    """What F.rms_norm ran, from the CUDA kernel names one call launched."""
    if not kernels:
        return "no CUDA kernel seen"
    lowered = [k.lower() for k in kernels]
    if any(m in k for k in lowered for m in _CUTE_MARKERS):
        return "CuTe DSL (QuACK via torch._native)"
    if any("rms" in k or "layer_norm" in k or "layernorm" in k for k in lowered):
        return "aten fused CUDA kernels"
    return "composite ops (no fused norm kernel)"


def rms_norm_dispatch() -> dict:
    """What torch.nn.functional.rms_norm dispatched to here: whether this torch has the
    torch._native override layer (newer releases route aten's fused RMSNorm to a bundled QuACK
    when a matching nvidia-cutlass-dsl is installed; TORCH_DISABLE_NATIVE_JIT=1 turns that
    off), and the CUDA kernels torch.profiler saw for one forward and one backward call."""
    info: dict = {"TORCH_DISABLE_NATIVE_JIT": os.environ.get("TORCH_DISABLE_NATIVE_JIT")}
    try:
        from torch._native import common_utils

        info["torch_native"] = True
        info["native_jit_disabled"] = bool(common_utils.check_native_jit_disabled())
    except Exception:  # older torch: no override layer
        info["torch_native"] = False
    try:
        from torch.profiler import ProfilerActivity, profile

        x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for phase in ("fwd", "bwd"):
            for _ in range(2):  # the second call is the one seen (a first call may compile)
                y = torch.nn.functional.rms_norm(x, (4096,), w, 1e-5)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    if phase == "fwd":
                        torch.nn.functional.rms_norm(x, (4096,), w, 1e-5)
                    else:
                        torch.autograd.grad(y, (x, w), torch.ones_like(y))
                    torch.cuda.synchronize()
            names = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
            info[f"kernels_{phase}"] = names
            info[f"route_{phase}"] = route_of(names)
    except Exception as exc:  # a record, never a reason to lose the run
        info["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return info
