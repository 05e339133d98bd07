"""Fresh inputs for the labs' hidden tests.

A lab's public test runs its check on a fixed input set that a student sees pass in the notebook.  A
hidden test (``solutions/hidden_tests/``, run only by the batch grader's judge) runs the same check on
inputs drawn here from a seed and at a size that only the hidden test's source states, so a function
fitted to the public inputs (a table of their answers, a length hard-coded from them, a shape assumed)
fails it while a right one passes.  The draws are deterministic: one seed, one input set, everywhere.
"""

import numpy as np

from kernels.checks import InputSet


def fresh_fp32(seed: int, n: int) -> InputSet:
    """``n`` fp32 bit patterns drawn from ``seed``: about half uniform over all 2^32 patterns, a quarter
    exact ties (low 16 bits 0x8000) and a quarter their neighbours (0x7FFF, 0x8001) under random upper
    halves, so that rounding is decided often; in a shuffled order, labelled by group."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = np.random.default_rng(seed)
    upper = rng.integers(0, 1 << 16, size=n, dtype=np.uint64).astype(np.uint32) << 16
    kind = rng.integers(0, 4, size=n)  # 0, 1: random; 2: tie; 3: a neighbour of a tie
    random_low = rng.integers(0, 1 << 16, size=n)
    neighbour = rng.choice(np.array([0x7FFF, 0x8001]), size=n)
    low = np.where(kind == 2, 0x8000, np.where(kind == 3, neighbour, random_low)).astype(np.uint32)
    labels = np.array(["random", "random", "tie", "neighbour"])[kind]
    counts = {g: int((labels == g).sum()) for g in ("random", "tie", "neighbour") if (labels == g).any()}
    return InputSet(upper | low, labels, counts)


__all__ = ["fresh_fp32"]
