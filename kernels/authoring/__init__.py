"""The book's authoring tools: how the notebooks in ``book/``, ``solutions/`` and ``labs/`` are made.

* :mod:`kernels.authoring.record` runs a notebook on a GPU and stores its outputs with a provenance
  cell (``python -m kernels.authoring.record``); the code hash it writes is what
  ``tests/test_provenance.py`` and the GPU lane compare.
* :mod:`kernels.authoring.labgen` generates each lab from its solution notebook with otter-grader
  (``python -m kernels.authoring.labgen [--check]``).

Neither is imported by the chapters' kernels.
"""

__all__ = []
