"""Offline (no GPU): the grouped and held-row backwards' SASS for sm_90a, bf16 against fp16,
at this tree's gluon_kernels: lines of cuobjdump's listing and the instructions that convert
16-bit values (HADD2, SHF, PRMT, IMAD, LOP3). Written for v26 (perf log): before it, Triton
converted each bf16 value alone; with it, two a register (gluon_common._upcast_pairs).

Needs Triton's NVIDIA backend (its ptxas and cuobjdump); run from a repository root without
TRITON_INTERPRET, once in each tree to compare (e.g. `git worktree add /tmp/before 1ee943a`):
    PYTHONPATH=.:experiments python experiments/upcast_sass_counts.py
"""

import collections
import os
import re
import subprocess
import tempfile

import triton

from tests import sm90_compile

CASES = [("held_group_bwd", 1048576), ("held_group_bwd", 262144), ("held_row_bwd", 32768)]
COUNTED = ("HADD2", "SHF", "PRMT", "IMAD", "LOP3")


def _sass(ptx: str) -> str:
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as folder:
        source, binary = os.path.join(folder, "k.ptx"), os.path.join(folder, "k.cubin")
        with open(source, "w") as f:
            f.write(ptx)
        subprocess.run([os.path.join(tools, "ptxas"), "-arch=sm_90a", "-O3", source, "-o", binary],
                       check=True)  # fmt: skip
        return subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", binary], check=True,
                              capture_output=True, text=True).stdout  # fmt: skip


def main() -> None:
    print(f"triton {triton.__version__}")
    for kernel, n in CASES:
        for x in ("bf16", "fp16"):
            case = {"kernel": kernel, "x": x, "block_n": n, "extra": False}
            if kernel == "held_row_bwd":
                case["warps"] = 16
            sass = _sass(sm90_compile.compile_ptx(case))
            ops = collections.Counter(
                m.group(1).split(".")[0]
                for m in re.finditer(r"^\s+/\*[0-9a-f]+\*/\s+([A-Z0-9_.]+)", sass, re.M)
            )
            cells = "  ".join(f"{op} {ops[op]}" for op in COUNTED)
            print(f"{kernel} N={n} {x}: {len(sass.splitlines())} lines  {cells}", flush=True)


if __name__ == "__main__":
    main()
