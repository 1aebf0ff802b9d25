"""Probe: the first call's path choice inside harness.compare, after two wide runs (6e0569859fab
with one pass, b42215a857e5 with two) kept the two-step backward at 64x1048576 bf16 (~169 µs)
while fresh processes calling the product alone chose the grouped one (144 µs against 171;
`...-271ee64b6e0d-measured-path-choice-*.txt`) and fp16 chose it in the same runs.

tuning.fastest is wrapped as in measured_path_choice.py (every multi-candidate choice prints its
candidates' device times), then harness.compare's main runs with the arguments given (the
results file under the output path given first).

Prediction: with every backend and the wide run's shapes before it, the harness's bf16 choice
at 64x1048576 times the grouped backward slower than the fresh processes did; with triton alone
it does not.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/harness_path_choice.py out.jsonl --shape 64x1048576 --dtypes bf16
"""

import sys

from measured_path_choice import _recording

from harness import compare
from impls.triton_rmsnorm import tuning

if __name__ == "__main__":
    tuning.fastest = _recording(tuning.fastest)
    sys.exit(compare.main(["--out", sys.argv[1], *sys.argv[2:]]))
