"""``python -m kernels.grade``: runs :func:`kernels.grade.command.main`, the grader's command line, and
the processes it starts the same way (``--child SPEC``, a submission's sandbox; ``--judge-server FD``,
the run's judges).  Nothing here to import.
"""

import sys

from kernels.grade.command import main

__all__ = []  # nothing to import: run it

if __name__ == "__main__":
    sys.exit(main())
