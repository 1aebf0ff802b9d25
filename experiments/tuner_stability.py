"""Probe: the product's device-only GB/s and tuned config at the sweep shapes, to run in two
processes and compare their picks (perf log, v7).

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/tuner_stability.py
"""

import sys

import torch

from impls.triton_rmsnorm import launch

sys.path.insert(0, "experiments")
import backward_config_sweep as bs  # noqa: E402
import forward_config_sweep as fs  # noqa: E402

stream = torch.cuda.Stream()
for m, n in fs.SHAPES:
    us = fs.device_us(fs.product, m, n, torch.bfloat16, stream)
    print(f"fwd {m:6d}x{n:5d} {2 * m * n * 2 / 1e3 / us:5.0f} GB/s {launch.take_launch_configs()}")
for m, n in bs.SHAPES:
    us = bs.device_us(bs.product, m, n, torch.bfloat16, stream)
    print(f"bwd {m:6d}x{n:5d} {3 * m * n * 2 / 1e3 / us:5.0f} GB/s {launch.take_launch_configs()}")
