"""Probe: where does the forward lose to its peers at 2048 and 16384 rows of the models preset?

The models preset in bf16 at dd71229acd5f (before PDL) put ours at 0.87-0.96 of the fastest
peer at most M = 2048 widths (FlashInfer, cuDNN) and at 0.90-0.96 at 16384 x 3584-4096 (QuACK,
Liger's CuTe DSL, Liger). The table already holds those widths, so each shape asks three things,
device-only, by the product tuner's timer (tuning._median_ms: a CUDA graph of back-to-back calls
over rotating inputs past the L2), all in one process, interleaved, the best of three passes:
- "ours": a default call (the table's configuration, PDL on since daf88e170367);
- "ours, no pdl": the same call with programmatic dependent launch off (the launch's share);
- "cfg ...": the single-tile forward forced at every configuration of the tuner's space for this
  call (launch._candidates), through dispatch.override: is any configuration near the peers?
  (whether its y is bitwise the default call's is recorded: a configuration that changes the
  reduction tree changes the bits, and the table keeps one tree per width);
- the peers that lead there, from the registry (flashinfer, flashinfer-nopdl, cudnn, quack,
  liger-cutedsl, liger, compile), where they are installed, as the harness builds them.

Run from the repository root on the H200, the peers' environment sourced (keep its PYTHONPATH:
a bare PYTHONPATH=. hides the peers, as in the first two runs):
    PYTHONPATH=.:experiments:$PYTHONPATH python experiments/forward_mid_m_gap.py out.json [bf16|fp16] [MxN,...]

(the shapes default to SHAPES)
"""

import json
import sys

import torch
import triton
from ab_timing import SINGLE_TILE_FORWARD, time_runs

from impls import get_backend
from impls.triton_rmsnorm import common, dispatch, launch, tuning
from impls.triton_rmsnorm.forward_launch import _single_tile_forward_args

EPS = 1e-6
SHAPES = [(2048, 4096), (2048, 5376), (2048, 8192), (16384, 4096), (2048, 2560), (2048, 4608)]
PEERS = ("flashinfer", "flashinfer-nopdl", "cudnn", "quack", "liger-cutedsl", "liger", "compile")


def _peer_runs(x, w) -> dict:
    runs = {}
    for name in PEERS:
        try:
            backend = get_backend(name)
            reason = backend.skip_reason(tuple(x.shape), x.dtype, "cuda")
            if reason is not None:
                print(name, reason[:160], flush=True)
                continue
            fn = backend.build()
            fn(x, w, EPS)  # compile / JIT outside the timing
            runs[name] = lambda a, fn=fn: fn(a[0], a[1], EPS)
        except Exception as error:
            print(name, type(error).__name__, str(error)[:160], flush=True)
    return runs


def _forced(config: dict, pdl: bool = True):
    """A call of the single-tile forward forced at config (dispatch.override: no replay, so the
    launch is made at every call), with programmatic dependent launch on or off."""
    forced = {SINGLE_TILE_FORWARD: config}

    def run(a):
        saved = common._pdl_switches
        if not pdl:
            common._pdl_switches = lambda index: {}
        try:
            with dispatch.override(forward="single_tile", forward_configs=forced):
                return launch.rmsnorm_forward(a[0], a[1], EPS)
        finally:
            common._pdl_switches = saved

    return run


def main(out_path: str, dtype_name: str, shapes=SHAPES) -> None:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows = []
    for m, n in shapes:
        x = torch.randn(m, n, dtype=dtype).cuda()
        w = torch.randn(n, dtype=dtype).cuda()
        launch.take_launch_configs()
        reference = launch.rmsnorm_forward(x, w, EPS)[0]
        table = launch.take_launch_configs().get(SINGLE_TILE_FORWARD)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        args = _single_tile_forward_args(x, w, y, rstd, x, x, (n, n, n, n), EPS, 0.0)
        constexprs = {"BLOCK_N": launch.block_size(n), "HAS_RESIDUAL": False,
                      "ROWS_CONTIGUOUS": True}  # fmt: skip
        candidates = launch._candidates(SINGLE_TILE_FORWARD, args, constexprs)

        runs = {
            "ours": lambda a: launch.rmsnorm_forward(a[0], a[1], EPS),
            "ours, no pdl": _forced(table, pdl=False),
        }
        same = {}
        for config in candidates:
            name = "cfg " + ",".join(f"{k}={v}" for k, v in config.items())
            try:
                y = _forced(config)((x, w))[0]
                ran = launch.take_launch_configs().get(SINGLE_TILE_FORWARD)
                if ran != config:
                    print(name, "ran as", ran, flush=True)
                    continue
                same[name] = bool(torch.equal(y, reference))
                runs[name] = _forced(config)
            except Exception as error:
                print(name, type(error).__name__, str(error)[:160], flush=True)
        runs.update(_peer_runs(x, w))
        arg_sets = tuning.rotating_arguments((x, w), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream, passes=3)
        peers = {k: v for k, v in times.items() if k in PEERS}
        best_peer = min(peers.items(), key=lambda kv: kv[1]) if peers else (None, float("nan"))
        best_cfg = min(((v, k) for k, v in times.items() if k.startswith("cfg ")), default=None)
        print(
            f"{m}x{n} {dtype_name}: ours {times['ours']:.2f} (no pdl {times['ours, no pdl']:.2f})"
            f" table {table}; best cfg {best_cfg}; best peer {best_peer}",
            flush=True,
        )
        rows.append({"m": m, "n": n, "dtype": dtype_name, "table": table, "us": times,
                     "same_bits": same})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "torch": torch.__version__, "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    chosen = SHAPES
    if len(sys.argv) > 3:
        chosen = [tuple(int(v) for v in s.split("x")) for s in sys.argv[3].split(",")]
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "bf16", chosen)
