"""Record what compiled Triton does on a real GPU, as test data for CPU mode.

Run on a Hopper GPU (H100/H200) from the repository root:

    python tests/data/record_hopper_numerics.py tests/data/hopper_numerics.npz

It converts an adversarial set of inputs with ``x.to(dtype)`` in compiled Triton, runs bf16/fp16
elementwise arithmetic and ``tl.dot`` on every low-precision operand type, and stores inputs,
output bit patterns and provenance in one compressed ``.npz``.  ``tests/test_interpreter.py`` then
runs the same kernels in CPU mode and demands the same bits.
"""

import datetime
import subprocess
import sys

import numpy as np
import torch
import triton

from kernels import numerics_probe as probe


def main(path):
    if not torch.cuda.is_available():
        sys.exit("record_hopper_numerics.py needs a CUDA GPU: it records what compiled Triton does")
    major, minor = torch.cuda.get_device_capability()
    failures = []
    out = probe.run_all("cuda", on_error=lambda name, exc: failures.append(f"{name}: {exc!r}"))
    for line in failures:
        print("FAILED", line[:500])
    out["meta_failures"] = np.array(failures, dtype=str)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out["meta_device"] = np.array(torch.cuda.get_device_name())
    out["meta_capability"] = np.array(f"{major}.{minor}")
    out["meta_torch"] = np.array(torch.__version__)
    out["meta_triton"] = np.array(triton.__version__)
    out["meta_date"] = np.array(datetime.date.today().isoformat())
    out["meta_commit"] = np.array(commit or "unknown")
    np.savez_compressed(path, **out)
    print(
        f"wrote {len(out)} arrays to {path} ({torch.cuda.get_device_name()}, sm_{major}{minor}, "
        f"torch {torch.__version__}, triton {triton.__version__})"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/hopper_numerics.npz")
