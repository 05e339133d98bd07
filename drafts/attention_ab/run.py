"""On a GPU: main's attention kernels against this branch's, with SDPA beside them, interleaved in one run,
and the bits of the two versions compared.  Run from the repository root on this branch:

    git show main:kernels/attention.py > drafts/attention_ab/attention_main.py
    python drafts/attention_ab/run.py
"""

import importlib.util
import pathlib

import torch

import kernels
from kernels import attention as new
from kernels.bench import measure

spec = importlib.util.spec_from_file_location("attention_main", pathlib.Path(__file__).with_name("attention_main.py"))
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
if kernels.INTERPRETER:
    raise SystemExit("run this on a CUDA GPU")


def contenders(q, k, v, causal):
    return {
        "main bf16": lambda: old.flash_attention(q, k, v, causal),
        "SDPA": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "main fp8": lambda: old.flash_attention_fp8(q, k, v, causal),
        "branch fp8": lambda: new.flash_attention_fp8(q, k, v, causal),
    }


for bsz, heads, n, d in ((4, 16, 4096, 128), (1, 16, 16384, 128)):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(bsz, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    for causal in (False, True):
        same = torch.equal(old.flash_attention(q, k, v, causal), new.flash_attention(q, k, v, causal))
        same8 = torch.equal(old.flash_attention_fp8(q, k, v, causal), new.flash_attention_fp8(q, k, v, causal))
        flops = 4.0 * bsz * heads * n * n * d / (2 if causal else 1)
        shape = f"{bsz}x{heads}x{n}x{d}{' causal' if causal else ''}"
        ours = lambda q=q, k=k, v=v, c=causal: new.flash_attention(q, k, v, c)  # noqa: E731
        recs = measure("attention_ab", shape, "TFLOP/s", flops, ours, contenders(q, k, v, causal))
        print(
            f"{shape:<26} bits equal: bf16 {same}, fp8 {same8}; branch bf16 {recs[0]['ours']:6.1f} TFLOP/s; "
            + "; ".join(f"{r['baseline_name']} {r['baseline']:6.1f}" for r in recs),
            flush=True,
        )
