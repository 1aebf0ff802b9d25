"""Probe: have Inductor compile the eager RMSNorm (impls/eager.py) at a few shapes and print its
generated code, to read how torch.compile's kernels are shaped (perf log, v7).

Run from the repository root on a GPU; the code goes to stderr:
    TORCH_LOGS=output_code PYTHONPATH=. python experiments/inductor_dump.py 2> out.txt
"""

import sys

import torch

from impls.eager import rmsnorm_eager

SHAPES = [(512, 8192, False), (4096, 8192, False), (65536, 512, True), (262144, 128, True)]

for m, n, backward in SHAPES:
    torch._dynamo.reset()
    compiled = torch.compile(rmsnorm_eager, dynamic=False, fullgraph=True)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    print(f"===== SHAPE {m}x{n} bwd={backward}", file=sys.stderr, flush=True)
    y = compiled(x, w, 1e-6)
    if backward:
        y.backward(torch.randn_like(y))
    torch.cuda.synchronize()
