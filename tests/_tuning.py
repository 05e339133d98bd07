"""Kernel tests on a GPU run each autotuned GEMM with one launch configuration; each configuration has
tests of its own.

On a GPU, ``triton.autotune`` compiles and times every configuration of its list the first time it meets
a new specialization (dtypes, constexprs such as the scaling and the epilogue, alignment) or a new shape.
A test that checks what a kernel computes, across dozens of specializations and shapes, would pay for
every configuration of every one of them (the epilogue tests alone compiled some 500 kernels) while
checking only the fastest.  So those tests pin each GEMM to its smallest tile (:func:`one_config`), which
fits every specialization, and ``tests/test_tuning_configs.py`` checks every configuration of every list
on shapes that give each tile several programs' work.  In CPU mode the kernels run one fixed interpreter
configuration and never tune, so nothing is pinned.
"""

import contextlib

import pytest

import kernels
from kernels import fp8_gemm, int8

# Each autotuned GEMM that the tests pin, and the launchers that keep a configuration per shape.
TUNED = {
    "fp8 grouped": (fp8_gemm._fp8_gemm_tuned, (fp8_gemm._LAUNCH_GROUPED,)),
    "fp8 persistent": (fp8_gemm._fp8_gemm_persistent_tuned, (fp8_gemm._LAUNCH_PERSISTENT,)),
    "int8 w8a8": (int8._w8a8_tuned, ()),
}


def smallest(configs):
    """The configuration with the smallest output tile (then the fewest stages and warps): the one whose
    shared memory fits every specialization."""
    return min(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], c.num_stages, c.num_warps))


def _forget(tuners, launchers):
    for tuner in tuners:
        tuner.cache.clear()
    for launcher in launchers:
        launcher._cache.clear()


@contextlib.contextmanager
def one_config(pins=None):
    """Within the block, each autotuned kernel in ``pins`` ({name in :data:`TUNED`: configuration}; by
    default every one at its :func:`smallest`) runs that configuration alone, untimed; on leaving, its list
    is back and what was tuned or launched meanwhile is forgotten.  Does nothing in CPU mode."""
    if kernels.INTERPRETER:
        yield
        return
    if pins is None:
        pins = {name: smallest(tuner.configs) for name, (tuner, _) in TUNED.items()}
    tuners = [TUNED[name][0] for name in pins]
    launchers = [launcher for name in pins for launcher in TUNED[name][1]]
    saved = [(tuner, tuner.configs) for tuner in tuners]
    _forget(tuners, launchers)
    for name, config in pins.items():
        TUNED[name][0].configs = [config]
    try:
        yield
    finally:
        for tuner, configs in saved:
            tuner.configs = configs
        _forget(tuners, launchers)


@pytest.fixture
def one_gemm_config():
    """:func:`one_config` with every GEMM at its smallest tile, for a test (``pytestmark =
    pytest.mark.usefixtures("one_gemm_config")`` in a module that imports it)."""
    with one_config():
        yield
