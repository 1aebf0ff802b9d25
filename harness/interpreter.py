"""The Triton interpreter on machines without CUDA: turned on before triton is imported.

Without CUDA the Triton kernels run on CPU tensors through Triton's interpreter, which reads
TRITON_INTERPRET when triton is first imported. The tests (tests/conftest.py) and
harness.compare call :func:`use_interpreter_without_cuda` before anything imports triton.

Triton 3.6's interpreter fails under numpy >= 2.4 ("only 0-dimensional arrays can be converted
to Python scalars": numpy 2.4 stopped converting 1-element arrays to scalars; fixed in Triton
3.7, triton-lang/triton#9172). PyTorch 2.10-2.11's CUDA wheels pin triton 3.6.0, so a machine
holding one of those with a newer numpy gets a clear error here, naming the fix, instead of a
failure deep inside a kernel.
"""

from __future__ import annotations

import importlib.metadata
import os
import re

#: First Triton release whose interpreter runs under numpy >= 2.4.
INTERPRETER_NUMPY_FIXED_IN = (3, 7)
#: First numpy release that breaks older interpreters.
NUMPY_BREAKS_FROM = (2, 4)


def _release(package: str) -> tuple[int, ...] | None:
    try:
        text = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def interpreter_problem(
    triton: tuple[int, ...] | None, numpy: tuple[int, ...] | None
) -> str | None:
    """Why this triton and numpy cannot run the interpreter together, or None."""
    if triton is None or numpy is None:
        return None
    if triton < INTERPRETER_NUMPY_FIXED_IN and numpy >= NUMPY_BREAKS_FROM:
        have = f"triton {'.'.join(map(str, triton))} with numpy {'.'.join(map(str, numpy))}"
        return (
            f"{have}: Triton's CPU interpreter before 3.7 fails under numpy >= 2.4; "
            "install 'triton>=3.7' (pip install -e \".[cpu]\") or 'numpy<2.4'"
        )
    return None


def installed_problem() -> str | None:
    """interpreter_problem() of the installed triton and numpy (read without importing them)."""
    return interpreter_problem(_release("triton"), _release("numpy"))


def use_interpreter_without_cuda(check: bool = True) -> bool:
    """True when CUDA is available; else set TRITON_INTERPRET=1 (unless set) and return False.

    With check, raises RuntimeError when the installed triton and numpy cannot run the
    interpreter.
    """
    import torch

    if torch.cuda.is_available():
        return True
    os.environ.setdefault("TRITON_INTERPRET", "1")
    problem = installed_problem() if os.environ["TRITON_INTERPRET"] == "1" else None
    if check and problem:
        raise RuntimeError(problem)
    return False
