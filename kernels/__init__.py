"""Low-precision GPU kernels in Triton, with plain-PyTorch references beside them.

Importing this package picks how Triton runs.  With a CUDA GPU, kernels compile as usual.  Without
one, Triton switches to its CPU interpreter, which :mod:`kernels._interpreter` corrects so that casts,
low-precision arithmetic and ``tl.dot`` give what compiled Triton gives on a Hopper GPU.  Set
``KERNELS_INTERPRET=1`` to force the interpreter on a GPU machine (``0`` to forbid it).

Chapter map: for each chapter, its labs, the kernel modules the labs build towards, the labs' checks
(``kernels.checks``), the tests (``tests/``) and the benchmark module (``kernels.bench``; run them by
name with ``python -m kernels.bench``).

* Chapter 1, formats.  Labs 00 (bf16 rounding) and 01 (formats encoder).  Kernels: ``bf16``,
  ``formats``.  Checks: ``lab00``, ``lab01``.  Tests: ``test_bf16``, ``test_formats``,
  ``test_checks_lab00``, ``test_checks_lab01``.  Benchmarks: ``formats``.
* Chapter 2, scaling.  Lab 02 (quantizers).  Kernels: ``quantize``.  Checks: ``lab02``.  Tests:
  ``test_quantize``, ``test_checks_lab02``.  Benchmarks: ``scaling``.
* Chapter 3, hazards.  Lab 03 (diagnostics).  Kernels: ``hazards``, ``stochastic``, ``accumulate``.
  Checks: ``lab03``.  Tests: ``test_hazards``, ``test_stochastic``, ``test_accumulate``,
  ``test_checks_lab03``.  Benchmarks: ``hazards``.
* Chapter 4, automatic mixed precision.  Lab 04 (loss scaling).  Kernels: ``amp``, ``norms``,
  ``charmodel``.  Checks: ``lab04``.  Tests: ``test_amp``, ``test_norms``, ``test_charmodel``,
  ``test_checks_lab04``.  Benchmarks: ``amp``.
* Chapter 5, FP8 training.  Lab 05 (FP8 GEMM).  Kernels: ``fp8_gemm``, ``fp8_linear``, ``fp8_ops``,
  ``launch``, ``finetune``.  Checks: ``lab05``.  Tests: ``test_fp8_gemm``, ``test_fp8_linear``,
  ``test_fp8_ops``, ``test_finetune``, ``test_checks_lab05``.  Benchmarks: ``fp8``.
* Chapter 6, FP4.  Lab 06 (FP4 weight-only).  Kernels: ``fp4``, ``w4a16``, ``w4a16_mma``, ``hadamard``,
  ``fp4_linear``, ``fp4_training``.  Checks: ``lab06``.  Tests: ``test_fp4``, ``test_w4a16``,
  ``test_hadamard``, ``test_fp4_linear``, ``test_fp4_training``, ``test_checks_lab06``.  Benchmarks:
  ``fp4``.
* Chapter 7, inference in low precision.  Lab 07 (INT8 GEMM and FP8 attention).  Kernels:
  ``int8``, ``int4``, ``attention``.  Checks: ``lab07``.  Tests: ``test_int8``, ``test_int4``,
  ``test_attention``, ``test_checks_lab07``.  Benchmarks: ``inference``.
* Appendix A, CPU mode.  No lab.  Kernels: ``_interpreter``, ``_hopper_math``, ``hopper_mma``,
  ``_jit_rules``.  No checks.  Tests: ``test_interpreter``, ``test_hopper_math``, ``test_hopper_mma``,
  ``test_jit_rules``.  No benchmarks.

Beside them: :mod:`kernels.device` (where tensors go, what the machine runs natively),
:mod:`kernels.testing` (comparisons, bit checks, input sets), :mod:`kernels.numerics_probe` (what the
recordings of ``tests/data`` measure), :mod:`kernels.diagrams` (the chapters' drawn figures), and the
tooling: ``kernels.grade`` (the batch grader), ``kernels.bench`` (speed, with ``kernels.bench.profiles``
for Nsight Compute), ``kernels.authoring`` (labs and recorded outputs) and ``kernels.gpu_lane`` (every
test and notebook on a GPU).
"""

from pathlib import Path

from kernels import _mode

INTERPRETER = _mode.select()
ROOT = Path(__file__).resolve().parent.parent  # the checkout: book/, labs/, solutions/, tests/

__all__ = ["INTERPRETER", "ROOT"]
