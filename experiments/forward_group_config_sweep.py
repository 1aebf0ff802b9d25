"""Probe: the grouped forward's configuration (slice, ring, programs an SM, warps) at the wide
preset's widths past 65536, after `...-476e7722a907-forward-group-below-held-row-ab.txt`.

That probe found the group 1.05-1.15x v16's held row at 512x131072, and two configurations
ahead of v21's at 131072 and 262144: 4096-column slices, RING 3, 6 an SM, 4 warps (bf16
1.073x and 1.031x the product, against v21's 1.048x and 1.009x) and 8192, RING 3, 3 an SM.
Here more slots in flight per SM (smaller slices, deeper rings) and the 1M width, whose group
count the slice sets (128 programs a row at 8192, 256 at 4096, 512 at 2048).

Prediction: 4096/RING 3/6 an SM within 1% of the best at every width; 2048-column slices lose
at 1M (512 programs a row, 2 groups of 32 rows: the fill and drain of a group's first and last
rows weigh more) and at 131072 tie.

Same method as forward_group_below_held_row_ab.py (whose main runs it). From the repository root:
    PYTHONPATH=.:experiments python experiments/forward_group_config_sweep.py out.json
"""

import sys

import torch
from forward_group_below_held_row_ab import main

SHAPES = [
    (512, 131072, torch.bfloat16),
    (512, 131072, torch.float16),
    (256, 262144, torch.bfloat16),
    (256, 262144, torch.float16),
    (64, 1048576, torch.bfloat16),
    (64, 1048576, torch.float16),
]
# (slice, ring, programs an SM, warps)
CONFIGS = [
    (8192, 2, 4, 8),  # the product's (v21)
    (8192, 3, 3, 8),
    (4096, 2, 7, 4),
    (4096, 3, 6, 4),
    (4096, 3, 6, 8),
    (4096, 4, 5, 4),
    (4096, 5, 4, 4),
    (2048, 3, 10, 4),
    (2048, 3, 10, 2),
    (2048, 4, 8, 4),
    (2048, 6, 6, 4),
]

if __name__ == "__main__":
    main(sys.argv[1], SHAPES, CONFIGS)
