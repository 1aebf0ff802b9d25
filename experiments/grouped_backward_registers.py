"""Offline (no GPU): registers and spills ptxas gives the grouped backward
(gluon_kernels.rmsnorm_bwd_held_group_kernel) for sm_90a in each configuration of
launch.HELD_GROUP_BACKWARDS, with the launch's register cap (launch._register_cap) and
without it, over widths, dtypes and dh_out. Written for v28 (perf log): two programs of 8 warps
share an SM's 65536 registers only at 128 or fewer a thread; db5abee84ea2's launch, uncapped,
was refused ("too many blocks in cooperative launch") at 1048576 columns and with dh_out.

Needs Triton's NVIDIA backend (its ptxas); run from a repository root without TRITON_INTERPRET:
    PYTHONPATH=.:experiments python experiments/grouped_backward_registers.py
"""

import os
import re
import subprocess
import tempfile

import triton

from impls.triton_rmsnorm import gluon_kernels, launch
from tests import sm90_compile

WIDTHS = (24576, 32768, 65536, 131072, 262144, 524288, 1048576)
KINDS = (("bf16", False), ("bf16", True), ("fp16", False))


def _ptxas(ptx: str) -> tuple[int, int]:
    """(registers, spill bytes stored) of ptxas -v for sm_90a."""
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "k.ptx")
        with open(source, "w") as f:
            f.write(ptx)
        done = subprocess.run([os.path.join(tools, "ptxas"), "-arch=sm_90a", "-O3", "-v", source,
                               "-o", os.path.join(folder, "k.cubin")],
                              check=True, capture_output=True, text=True)  # fmt: skip
    registers = int(re.findall(r"Used (\d+) registers", done.stderr)[-1])
    spills = int(re.findall(r"(\d+) bytes spill stores", done.stderr)[-1])
    return registers, spills


def _ptx(config, n: int, x: str, has_dh: bool, capped: bool) -> str:
    group = launch.cdiv(n, config.slice_n)
    constexprs = {"N": n, "GROUP": group, "GROUP_PADDED": launch.held_group_words(group, config.warps),
                  "CHUNK": config.chunk, "CHUNKS": config.chunks, "RING": config.ring,
                  "HAS_DH_OUT": has_dh, "WARPS": config.warps,
                  "SPIN_LIMIT": launch.HELD_GROUP_SPIN_LIMIT}  # fmt: skip
    options = {"num_warps": config.warps}
    if capped:
        options.update(launch._register_cap(config.per_sm, config.warps))
    pointers = {**sm90_compile._held_backward_pointers(x), "SUMS": "i64"}
    return sm90_compile._ptx(gluon_kernels.rmsnorm_bwd_held_group_kernel, pointers, constexprs,
                             options, divisible=sm90_compile._BACKWARD_ROW_STRIDES)  # fmt: skip


def main() -> None:
    print(f"triton {triton.__version__}; registers (spill bytes) a thread, sm_90a")
    for config in launch.HELD_GROUP_BACKWARDS:
        cap = launch._register_cap(config.per_sm, config.warps)
        print(f"{config} cap {cap or 'none'}")
        for n in WIDTHS:
            cells = []
            for x, has_dh in KINDS:
                for capped in (False, True) if cap else (False,):
                    registers, spills = _ptxas(_ptx(config, n, x, has_dh, capped))
                    label = f"{x}{' dh' if has_dh else ''}{' capped' if capped else ''}"
                    cells.append(f"{label} {registers} ({spills})")
            print(f"  {n:8d}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
