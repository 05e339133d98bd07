"""``python -m kernels.bench [NAME ...]``: see :mod:`kernels.bench.command`."""

import sys

from kernels.bench.command import main

__all__ = []

if __name__ == "__main__":
    sys.exit(main())
