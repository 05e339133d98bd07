"""Chapter 4's kernels: the fused unscale + inf check over a model's worth of gradients, and the
mixed-precision RMSNorm forward and backward, against torch and a device copy."""

import torch

from kernels.bench import benchmark, cases, copy_baseline, measure

# ~200 gradients, sizes spread over three decades like a transformer's (norm weights, biases, big
# projection matrices), at least 1 GiB of fp32 in all: far beyond the 60 MB L2.
UNSCALE_TENSORS = 200
UNSCALE_MIN_BYTES = 1 << 30
RMSNORM_WIDTHS = (4096, 8192)
RMSNORM_INPUT_BYTES = 1 << 29  # 512 MiB of bf16 input: with the output, >= 1 GiB moved per call
DEVICE = "cuda"  # benchmarks time the GPU; a smoke test may point this elsewhere with tiny sizes


def _gradient_sizes(seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    # log-uniform between 4 Ki and 16 Mi elements, then scaled so the total reaches the target
    logs = torch.rand(UNSCALE_TENSORS, generator=g) * (24 - 12) + 12
    sizes = (2.0**logs).long()
    total = int(sizes.sum())
    factor = -(-UNSCALE_MIN_BYTES // 4 // total)  # ceil: at least the target
    return [int(s) * max(factor, 1) + int(i % 7) for i, s in enumerate(sizes)]  # awkward tails included


@benchmark("amp_unscale")
def _bench_amp_unscale():
    """``foreach_non_finite_check_and_unscale_`` on ~200 fp32 gradients in one launch, against torch's
    ``_amp_foreach_non_finite_check_and_unscale_`` (several multi-tensor launches) and a copy.
    Bytes: every gradient read once and written once (4 + 4 bytes per element).  inv_scale is 1.0 so
    that repeated calls leave the data as it is; the kernels read and write every element regardless."""
    from kernels import amp

    sizes = _gradient_sizes()
    grads = [torch.randn(n, device=DEVICE) for n in sizes]
    numel = sum(sizes)
    found = torch.zeros((), device=DEVICE)
    found_ref = torch.zeros((), device=DEVICE)
    inv = torch.tensor(1.0, device=DEVICE)
    # Check once, on copies, with a real inv_scale and one inf, before timing.
    check = [g[:100_003].clone() for g in grads]
    check_ref = [c.clone() for c in check]
    victim = len(check) // 3
    check[victim][123] = check_ref[victim][123] = float("inf")
    half = torch.tensor(2.0**-16, device=DEVICE)
    amp.foreach_non_finite_check_and_unscale_(check, found, half)
    torch._amp_foreach_non_finite_check_and_unscale_(check_ref, found_ref, half)
    if (
        found.item() != 1.0
        or found_ref.item() != 1.0
        or not all(torch.equal(a, b) for a, b in zip(check, check_ref, strict=True))
    ):
        raise AssertionError("amp_unscale: the kernel disagrees with torch's unscale; not timing a wrong kernel")
    del check, check_ref
    found.zero_()
    nbytes = numel * 4 * 2
    baselines = {
        "torch._amp_foreach_non_finite_check_and_unscale_": (
            lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found_ref, inv)
        ),
        "device copy": copy_baseline(nbytes, device=DEVICE),
    }
    shape = f"{len(sizes)} tensors, {numel} fp32"
    return measure(
        "amp_unscale",
        shape,
        "GB/s",
        nbytes,
        lambda: amp.foreach_non_finite_check_and_unscale_(grads, found, inv),
        baselines,
    )


def _rms_inputs(n: int):
    m = RMSNORM_INPUT_BYTES // (n * 2)
    x = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16)
    return m, x, w


def _check_rows(got, x, w, eps, what):
    from kernels import norms
    from kernels.testing import compare

    rows = slice(0, 257)
    result = compare(got[rows], norms.rmsnorm_reference(x[rows], w, eps), atol=1e-6, rtol=2.0**-8, name=what)
    if not result.ok:
        raise AssertionError(f"{what}: the kernel disagrees with the fp32 reference; not timing it\n{result}")


@benchmark("amp_rmsnorm_fwd")
def _bench_amp_rmsnorm_fwd():
    """RMSNorm forward, bf16 rows of 4096 and 8192: x read, y written (2 + 2 bytes per element), the
    fp32 rstd written (4 bytes per row), the weight read once."""
    from kernels import norms

    records, eps = [], 1e-6
    for n in cases(RMSNORM_WIDTHS):
        m, x, w = _rms_inputs(n)
        y, _ = norms.rmsnorm_forward(x, w, eps)
        _check_rows(y, x, w, eps, f"amp_rmsnorm_fwd {m}x{n}")
        del y
        nbytes = m * n * (2 + 2) + m * 4 + n * 2
        baselines = {
            "torch rms_norm": lambda x=x, w=w, n=n: torch.nn.functional.rms_norm(x, (n,), w, eps),
            "device copy": copy_baseline(nbytes, device=DEVICE),
        }
        records += measure(
            "amp_rmsnorm_fwd",
            f"{m}x{n} bf16",
            "GB/s",
            nbytes,
            lambda x=x, w=w: norms.rmsnorm_forward(x, w, eps),
            baselines,
        )
        del x, w
    return records


@benchmark("amp_rmsnorm_bwd")
def _bench_amp_rmsnorm_bwd():
    """RMSNorm backward, bf16 rows of 4096 and 8192: dy and x read, dx written (3 x 2 bytes per
    element), rstd read (4 bytes per row), weight read and dW written once; the fp32 partial dW sums
    (programs x N x 4 bytes, a few MB) are not counted.  Second baseline: autograd through torch's
    rms_norm (its backward only, the forward graph kept)."""
    from kernels import norms
    from kernels.testing import compare

    records, eps = [], 1e-6
    for n in cases(RMSNORM_WIDTHS):
        m, x, w = _rms_inputs(n)
        dy = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
        _, rstd = norms.rmsnorm_forward(x, w, eps)
        dx, dw = norms.rmsnorm_backward(dy, x, w, rstd)
        rows = slice(0, 257)
        xr, wr = x[rows].double().requires_grad_(), w.double().requires_grad_()
        ref = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps) * wr
        (dxr,) = torch.autograd.grad(ref, (xr,), dy[rows].double())
        result = compare(dx[rows], dxr, atol=1e-4, rtol=2.0**-8, name=f"amp_rmsnorm_bwd dx {m}x{n}")
        dw_ref = (dy.float() * (x.float() * rstd[:, None])).sum(0)
        result_w = compare(dw, dw_ref, atol=1e-2, rtol=2.0**-7, name=f"amp_rmsnorm_bwd dw {m}x{n}")
        if not (result.ok and result_w.ok):
            raise AssertionError(f"amp_rmsnorm_bwd: wrong gradients; not timing them\n{result}\n{result_w}")
        del dx, dw, dw_ref
        x_leaf, w_leaf = x.clone().requires_grad_(), w.clone().requires_grad_()
        y_torch = torch.nn.functional.rms_norm(x_leaf, (n,), w_leaf, eps)
        nbytes = m * n * (2 + 2 + 2) + m * 4 + n * 2 * 2
        baselines = {
            "torch rms_norm backward": (
                lambda y=y_torch, xl=x_leaf, wl=w_leaf, dy=dy: torch.autograd.grad(y, (xl, wl), dy, retain_graph=True)
            ),
            "device copy": copy_baseline(nbytes, device=DEVICE),
        }
        records += measure(
            "amp_rmsnorm_bwd",
            f"{m}x{n} bf16",
            "GB/s",
            nbytes,
            lambda dy=dy, x=x, w=w, rstd=rstd: norms.rmsnorm_backward(dy, x, w, rstd),
            baselines,
        )
        del x, w, dy, rstd, x_leaf, w_leaf, y_torch
    return records


__all__ = [
    "DEVICE",
    "RMSNORM_INPUT_BYTES",
    "RMSNORM_WIDTHS",
    "UNSCALE_MIN_BYTES",
    "UNSCALE_TENSORS",
]
