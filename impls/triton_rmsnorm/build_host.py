"""python -m impls.triton_rmsnorm.build_host: build the C++ host path (host_path.py) once for
this torch, Python and source, into $RMSNORM_TRITON_HOST_DIR or ~/.cache/rmsnorm-triton/host/.
Then RMSNORM_TRITON_HOST=cpp serves calls with it."""

from __future__ import annotations

import argparse
import sys

from . import host_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m impls.triton_rmsnorm.build_host",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    args = parser.parse_args(argv)
    path = host_path.build(verbose=args.verbose)
    print(f"built {path}; set {host_path.ENV}=cpp to serve calls with it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
