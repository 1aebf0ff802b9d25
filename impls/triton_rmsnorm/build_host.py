"""python -m impls.triton_rmsnorm.build_host: build the C++ host path (host_path.py) once for
this torch, Python and source, into $RMSNORM_TRITON_HOST_DIR or ~/.cache/rmsnorm-triton/host/.
Then importing the package turns the path on (RMSNORM_TRITON_HOST=python keeps it off)."""

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
    print(
        f"built {path}; a process importing impls.triton_rmsnorm now serves calls with it "
        f"({host_path.ENV}=python keeps it off)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
