"""Record compiled Triton's approximate fp32 math on a Hopper GPU, for CPU mode to reproduce.

Run on a Hopper GPU (H100/H200) from the repository root:

    python tests/data/record_hopper_approx.py

It writes two compressed files, each with the device, versions, date and commit:

* ``kernels/data/hopper_mufu.npz``: the special-function unit's approximate reciprocal, square root,
  reciprocal square root and base-2 exponential (``rcp/sqrt/rsqrt/ex2.approx.ftz.f32``, read through
  inline PTX) over the inputs that determine every one of their results.  CPU mode looks results up
  here (:mod:`kernels._hopper_math`).
* ``tests/data/hopper_approx.npz``: fp32 ``x / y``, ``tl.sqrt``, ``tl.rsqrt``, ``tl.exp``, ``tl.exp2``,
  ``tl.log`` and ``tl.log2`` compiled, on adversarial inputs of every magnitude;
  ``tests/test_hopper_math.py`` replays them in CPU mode.
"""

import datetime
import pathlib
import subprocess
import sys

import numpy as np
import torch
import triton

from kernels import numerics_probe as probe

ROOT = pathlib.Path(__file__).resolve().parents[2]


def provenance() -> dict:
    major, minor = torch.cuda.get_device_capability()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return {
        "meta_device": np.array(torch.cuda.get_device_name()),
        "meta_capability": np.array(f"{major}.{minor}"),
        "meta_torch": np.array(torch.__version__),
        "meta_triton": np.array(triton.__version__),
        "meta_date": np.array(datetime.date.today().isoformat()),
        "meta_commit": np.array(commit or "unknown"),
    }


def main(out_dir: pathlib.Path = ROOT) -> None:
    if not torch.cuda.is_available():
        sys.exit("record_hopper_approx.py needs a CUDA GPU: it records what compiled Triton does")
    meta = provenance()
    tables = out_dir / "kernels" / "data" / "hopper_mufu.npz"
    samples = out_dir / "tests" / "data" / "hopper_approx.npz"
    tables.parent.mkdir(parents=True, exist_ok=True)
    samples.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(tables, **probe.run_mufu_tables("cuda"), **meta)
    np.savez_compressed(samples, **probe.run_approx("cuda"), **meta)
    for path in (tables, samples):
        print(f"wrote {path} ({path.stat().st_size} bytes; {meta['meta_device']}, triton {meta['meta_triton']})")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
