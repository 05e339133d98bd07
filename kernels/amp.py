"""Automatic mixed precision: a fused unscale-and-check kernel and a dynamic loss scaler on top of it.

Chapter 4 and Lab 04 (loss scaling).  Entry points: :func:`foreach_non_finite_check_and_unscale_`,
:func:`update_scale_`, :class:`DynamicLossScaler`.  The chapter's norms are in :mod:`kernels.norms`,
its model and training recipes in :mod:`kernels.charmodel`.

* :func:`foreach_non_finite_check_and_unscale_` multiplies every gradient of a list by ``inv_scale``
  in place and sets ``found_inf`` to 1.0 if any element was inf or NaN, in ONE Triton launch with no
  host synchronisation, whatever the mix of sizes and dtypes (fp32, fp16, bf16, fp64).  It gives the
  bits of ``torch._amp_foreach_non_finite_check_and_unscale_``: each element is widened to fp32 (fp64
  for fp64), multiplied once, rounded back to nearest-even; ``found_inf`` is only ever *set* to 1.0,
  never cleared, so one flag can collect several calls.  NaN stays NaN; its payload is whatever the
  device's conversion makes of it (torch itself differs here: on the CPU it turns every bf16 NaN into
  0x7FC0, CUDA's conversion gives 0x7FFF).
  :func:`foreach_non_finite_check_and_unscale_reference` is the same thing in plain PyTorch.
* :class:`DynamicLossScaler` makes the decisions of ``torch.amp.GradScaler`` (same scale sequence,
  same skipped steps, growth after ``growth_interval`` clean steps, same ``state_dict``) with the
  kernel above for its unscale, and :func:`update_scale_` (the controller) in device tensor
  operations, so no step waits on the host except the skip decision, as in torch.

How one launch reaches every tensor of a list: a *block table*.  The host cuts each tensor into
chunks of ``UNSCALE_CHUNK`` elements and writes one row per chunk into an int64 tensor,
``(address of the tensor, first element, element count, dtype code)``; program ``i`` reads row ``i``,
turns the address back into a typed pointer with ``.to(tl.pointer_type(...))`` and streams its chunk.
The table is built once per list of (address, size, dtype) and cached on the device, so a training
loop, whose gradients live at the same addresses every step, pays for it once.  Compiled Triton and
the CPU interpreter both accept integer-to-pointer casts (the interpreter's pointers are host
addresses), so the same kernel runs in both.
"""

import math
from collections import OrderedDict
from enum import Enum

import numpy as np
import torch
import triton
import triton.language as tl

from kernels.device import check_device

# -- tuning constants ---------------------------------------------------------------------------------

# Small programs, many of them: 4096 elements each (one table row), in four steps of 1024, chosen by a
# sweep over block, chunk and warp counts on an H200 (the amp_unscale benchmark records the speed).
UNSCALE_BLOCK = 1024  # elements per loop iteration of one program
UNSCALE_CHUNK = 4096  # elements per program (a multiple of UNSCALE_BLOCK): one table row
UNSCALE_WARPS = 8
TABLE_CACHE_SIZE = 16  # block tables kept per process


# -- 1. fused unscale + inf/NaN check ----------------------------------------------------------------

# dtype -> code in the block table.  The kernel branches on the code per program, so one launch
# serves a list of mixed dtypes.
CODE_FP32 = tl.constexpr(0)
CODE_FP16 = tl.constexpr(1)
CODE_BF16 = tl.constexpr(2)
CODE_FP64 = tl.constexpr(3)
_DTYPE_CODES = {
    torch.float32: CODE_FP32.value,
    torch.float16: CODE_FP16.value,
    torch.bfloat16: CODE_BF16.value,
    torch.float64: CODE_FP64.value,
}


@triton.jit
def _unscale_chunk(ptr, count, inv_scale, WIDE: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr):
    """Unscale ``count`` elements at ``ptr`` in place, in ``WIDE`` arithmetic (fp32, or fp64 for fp64
    grads: torch's "opmath" type); 1 if any was inf or NaN, else 0."""
    if ALIGNED:  # the host checked that every tensor starts on 16 bytes: lets loads vectorise
        ptr = tl.multiple_of(ptr, 16)
    offs = tl.arange(0, BLOCK)
    bad = tl.zeros([BLOCK], dtype=tl.int32)  # lanes that saw an inf or NaN
    n_full = count // BLOCK
    # Full blocks without a mask (the mask's bound is only known at run time and would stop
    # the compiler from using 16-byte accesses); then one masked tail.
    for i in range(n_full):
        p = ptr + i * BLOCK + offs
        x = tl.load(p)
        wide = x.to(WIDE)
        bad = bad | ((wide != wide) | (tl.abs(wide) == float("inf"))).to(tl.int32)
        tl.store(p, (wide * inv_scale).to(x.dtype))
    rest = offs < count - n_full * BLOCK
    p = ptr + n_full * BLOCK + offs
    x = tl.load(p, mask=rest, other=0.0)
    wide = x.to(WIDE)
    bad = bad | ((wide != wide) | (tl.abs(wide) == float("inf"))).to(tl.int32)
    tl.store(p, (wide * inv_scale).to(x.dtype), mask=rest)
    return tl.max(bad, axis=0)


@triton.jit
def _unscale_kernel(table_ptr, found_inf_ptr, inv_scale_ptr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr):
    # table row: (address of the tensor, first element of this chunk, element count, dtype code)
    row = table_ptr + tl.program_id(0).to(tl.int64) * 4
    address = tl.load(row)
    start = tl.load(row + 1)
    count = tl.load(row + 2)
    code = tl.load(row + 3)
    inv_scale = tl.load(inv_scale_ptr)  # fp32, read on the device: no host sync
    if code == CODE_FP32:
        bad = _unscale_chunk(
            address.to(tl.pointer_type(tl.float32)) + start, count, inv_scale, tl.float32, ALIGNED, BLOCK
        )
    elif code == CODE_FP16:
        bad = _unscale_chunk(
            address.to(tl.pointer_type(tl.float16)) + start, count, inv_scale, tl.float32, ALIGNED, BLOCK
        )
    elif code == CODE_BF16:
        bad = _unscale_chunk(
            address.to(tl.pointer_type(tl.bfloat16)) + start, count, inv_scale, tl.float32, ALIGNED, BLOCK
        )
    else:  # CODE_FP64
        inv64 = inv_scale.to(tl.float64)  # torch multiplies fp64 grads in fp64
        bad = _unscale_chunk(address.to(tl.pointer_type(tl.float64)) + start, count, inv64, tl.float64, ALIGNED, BLOCK)
    # Only ever set, never cleared: concurrent programs all write the same 1.0, so no atomics.
    tl.store(found_inf_ptr, 1.0, mask=bad > 0)


def _dense(t: torch.Tensor) -> bool:
    """True if ``t``'s elements fill ``numel`` consecutive slots from ``data_ptr()`` in some order
    (contiguous, or any permutation of dimensions of a contiguous tensor): an elementwise in-place op
    can then run over that memory as one flat array."""
    if t.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted((s, st) for s, st in zip(t.shape, t.stride(), strict=True) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


_TABLES: OrderedDict = OrderedDict()


def _block_table(spans: list, chunk: int, device) -> torch.Tensor:
    """The (num_blocks, 4) int64 block table for ``spans`` = [(address, numel, dtype code)], cached."""
    key = (str(device), chunk, tuple(spans))
    table = _TABLES.get(key)
    if table is not None:
        _TABLES.move_to_end(key)
        return table
    address = np.array([s[0] for s in spans], dtype=np.int64)
    numel = np.array([s[1] for s in spans], dtype=np.int64)
    code = np.array([s[2] for s in spans], dtype=np.int64)
    blocks = (numel + chunk - 1) // chunk  # chunks per tensor
    owner = np.repeat(np.arange(len(spans)), blocks)  # (num_blocks,) tensor index of each chunk
    first = np.concatenate([[0], np.cumsum(blocks)[:-1]])
    start = (np.arange(owner.size) - first[owner]) * chunk  # element offset of each chunk
    count = np.minimum(numel[owner] - start, chunk)
    rows = np.stack([address[owner], start, count, code[owner]], axis=1)  # (num_blocks, 4)
    table = torch.from_numpy(np.ascontiguousarray(rows)).to(device)
    _TABLES[key] = table
    if len(_TABLES) > TABLE_CACHE_SIZE:
        _TABLES.popitem(last=False)
    return table


def _check_scalar(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32 or t.numel() != 1:
        raise TypeError(f"{name} must be a 1-element float32 tensor, got {t.dtype} with {t.numel()} elements")


def foreach_non_finite_check_and_unscale_(grads, found_inf: torch.Tensor, inv_scale: torch.Tensor, *, chunk=None):
    """``grads[i] *= inv_scale`` in place for every tensor, and ``found_inf = 1.0`` if any element of
    any of them (before scaling) is inf or NaN; one kernel launch, no host synchronisation.

    Same contract as ``torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)``:
    ``found_inf`` and ``inv_scale`` are 1-element float32 tensors on the grads' device; ``found_inf``
    is set, never reset.  ``chunk`` (elements per program, a multiple of 8) overrides
    ``UNSCALE_CHUNK``.
    """
    if isinstance(grads, torch.Tensor) or not isinstance(grads, list | tuple):
        raise TypeError(f"grads must be a list or tuple of tensors, got {type(grads).__name__}")
    _check_scalar(found_inf, "found_inf")
    _check_scalar(inv_scale, "inv_scale")
    chunk = UNSCALE_CHUNK if chunk is None else int(chunk)
    if chunk <= 0 or chunk % 8:
        raise ValueError(f"chunk must be a positive multiple of 8 (16-byte aligned chunks), got {chunk}")
    spans, dense_copies = [], []
    for i, g in enumerate(grads):
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"grads[{i}] must be a torch.Tensor, got {type(g).__name__}")
        if g.dtype not in _DTYPE_CODES:
            raise TypeError(f"grads[{i}] has dtype {g.dtype}; expected one of float32, float16, bfloat16, float64")
        if g.device != found_inf.device or g.device != inv_scale.device:
            raise ValueError(
                f"grads[{i}] is on {g.device} but found_inf is on {found_inf.device} and inv_scale on "
                f"{inv_scale.device}: all must share one device"
            )
        if g.is_sparse:
            raise TypeError(f"grads[{i}] is sparse; pass its values (coalesce() first)")
        if g.numel() == 0:
            continue
        if not _dense(g):  # strided views with gaps: unscale a dense copy, write it back afterwards
            dense = g.contiguous()
            dense_copies.append((g, dense))
            g = dense
        spans.append((g.data_ptr(), g.numel(), _DTYPE_CODES[g.dtype]))
    if not spans:
        return
    check_device(found_inf, "found_inf")
    table = _block_table(spans, chunk, found_inf.device)
    aligned = all(address % 16 == 0 for address, _, _ in spans)
    block = min(UNSCALE_BLOCK, triton.next_power_of_2(chunk))
    _unscale_kernel[(table.shape[0],)](
        table, found_inf, inv_scale, ALIGNED=aligned, BLOCK=block, num_warps=UNSCALE_WARPS
    )
    for g, dense in dense_copies:
        g.copy_(dense)


def foreach_non_finite_check_and_unscale_reference(grads, found_inf: torch.Tensor, inv_scale: torch.Tensor):
    """The same in plain PyTorch, one tensor at a time (and a host sync per tensor)."""
    for g in grads:
        wide = g.double() if g.dtype == torch.float64 else g.float()
        if not torch.isfinite(wide).all():
            found_inf.fill_(1.0)
        g.copy_(wide * (inv_scale.double() if g.dtype == torch.float64 else inv_scale))


# -- 2. the dynamic loss scaler --------------------------------------------------------------------


def update_scale_(scale, growth_tracker, found_inf, growth_factor: float, backoff_factor: float, growth_interval: int):
    """The growth/backoff controller, in place, on the device, as ``torch._amp_update_scale_``:

    * ``found_inf`` non-zero (NaN counts as non-zero): ``scale *= backoff_factor``, tracker = 0;
    * otherwise the tracker counts one more clean step; when it reaches ``growth_interval`` the
      scale grows by ``growth_factor`` (kept only if finite) and the tracker restarts at 0.

    The products are formed in fp64 and rounded once to fp32, like torch's.
    """
    found = found_inf.reshape(()) != 0
    wide = scale.double()
    backed = (wide * backoff_factor).float()
    grown = (wide * growth_factor).float()
    clean = growth_tracker + 1
    grow_now = clean == growth_interval
    new_scale = torch.where(found, backed, torch.where(grow_now & torch.isfinite(grown), grown, scale))
    new_tracker = torch.where(found | grow_now, torch.zeros_like(clean), clean)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)


class _Stage(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


class DynamicLossScaler:
    """Dynamic loss scaling with the decisions of ``torch.amp.GradScaler``.

    The loss scale ``S`` multiplies the loss (:meth:`scale`), so every gradient comes out ``S`` times
    too large; :meth:`unscale_` multiplies them by ``1/S`` (fp64 reciprocal rounded to fp32, as
    torch) with :func:`foreach_non_finite_check_and_unscale_` and records whether any was inf/NaN;
    :meth:`step` skips ``optimizer.step()`` if one was; :meth:`update` backs ``S`` off after an
    overflow and grows it after ``growth_interval`` clean steps.  Per iteration::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)          # before anything that reads gradient values
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        scaler.step(optimizer)              # skipped if an inf/NaN was found
        scaler.update()

    Sparse gradients (``nn.Embedding(sparse=True)``) are unscaled through their values, as torch does.
    An optimizer that unscales inside its own step (``torch.optim.Adam(fused=True)``: one with
    ``_step_supports_amp_scaling``) is handed ``grad_scale`` and ``found_inf`` instead, as GradScaler
    hands them, so it divides by ``S`` exactly as it would under GradScaler.
    Misuse raises ``RuntimeError`` with the step that is missing (``unscale_()`` before ``scale()``,
    say), where GradScaler uses ``assert`` for some of these (an ``AssertionError``, gone under
    ``python -O``); the decisions, the scale and the ``state_dict`` are GradScaler's.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ):
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1.0, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if not (isinstance(growth_interval, int) and growth_interval >= 1):
            raise ValueError(f"growth_interval must be a positive int, got {growth_interval!r}")
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ValueError(f"init_scale must be positive and finite, got {init_scale}")
        self._enabled = enabled
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._scale = None  # fp32 0-dim tensor on the loss's device, created by the first scale()
        self._growth_tracker = None  # int32 0-dim tensor: consecutive clean steps
        self._per_optimizer = {}  # id(optimizer) -> {"stage": _Stage, "found_inf": {device: tensor}}

    def is_enabled(self) -> bool:
        return self._enabled

    def _state(self, optimizer):
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _Stage.READY, "found_inf": {}})

    def _need_scale(self, what: str):
        if self._scale is None:
            raise RuntimeError(f"{what}() before scale(): call scaler.scale(loss).backward() first")

    def scale(self, outputs):
        """``outputs * S`` (a tensor, or a list/tuple of them, nested)."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=outputs.device)
                self._growth_tracker = torch.full(
                    (), self._init_growth_tracker, dtype=torch.int32, device=outputs.device
                )
            return outputs * self._scale.to(outputs.device)
        if isinstance(outputs, list | tuple):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"outputs must be a tensor or a list/tuple of tensors, got {type(outputs).__name__}")

    def unscale_(self, optimizer) -> None:
        """Divide the optimizer's gradients by ``S`` in place and record inf/NaN; once per step."""
        if not self._enabled:
            return
        self._need_scale("unscale_")
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step() (call update() at the end of every iteration).")
        inv_scale = self._scale.double().reciprocal().float()  # reciprocal in fp64, as torch
        state["found_inf"] = self._unscale_grads(optimizer, inv_scale)
        state["stage"] = _Stage.UNSCALED

    def _unscale_grads(self, optimizer, inv_scale: torch.Tensor, allow_fp16: bool = False) -> dict:
        """Multiply every gradient of ``optimizer`` by ``inv_scale``; {device: found_inf}.  fp16
        gradients only where nothing is divided (``allow_fp16``: the fused optimizer's inf check)."""
        per_device = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.dtype == torch.float16 and not allow_fp16:
                    raise ValueError(
                        "Attempting to unscale FP16 gradients: the parameters are fp16, so there are no "
                        "fp32 master weights to apply the update to (keep the parameters in fp32)."
                    )
                # A sparse gradient (nn.Embedding(sparse=True)) is unscaled through its values, as
                # GradScaler does: the same numbers, and an inf among them is found the same way.
                grad = p.grad._values() if p.grad.is_sparse else p.grad
                per_device.setdefault(grad.device, []).append(grad)
        found = {}
        with torch.no_grad():
            for dev, grads in per_device.items():
                found[dev] = torch.zeros((), dtype=torch.float32, device=dev)
                foreach_non_finite_check_and_unscale_(grads, found[dev], inv_scale.to(dev))
        return found

    def step(self, optimizer, *args, **kwargs):
        """``unscale_`` if not done yet, then ``optimizer.step()`` unless an inf/NaN was found.
        Returns what ``optimizer.step`` returned, or None when the step was skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not supported with a loss scaler.")
        self._need_scale("step")
        state = self._state(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError(
                "step() has already been called since the last update() (call update() at the end of every iteration)."
            )
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._fused_step(optimizer, state, args, kwargs)
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        if not state["found_inf"]:
            raise RuntimeError("No inf checks were recorded for this optimizer (it has no gradients).")
        result = None
        # The one host sync of a step, as in torch: whether to call optimizer.step() at all.
        if not sum(v.item() for v in state["found_inf"].values()):
            result = optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return result

    def _fused_step(self, optimizer, state, args, kwargs):
        """An optimizer that unscales in its own kernel (``Adam(fused=True)`` and the like): as
        GradScaler, it gets ``grad_scale`` (S, unless ``unscale_()`` already ran) and ``found_inf`` as
        attributes and is stepped without a host sync; it divides by S and skips the update itself."""
        if state["stage"] is _Stage.READY:  # only look for inf/NaN: the optimizer divides by S
            state["found_inf"] = self._unscale_grads(optimizer, torch.ones_like(self._scale), allow_fp16=True)
        if not state["found_inf"]:
            raise RuntimeError("No inf checks were recorded for this optimizer (it has no gradients).")
        found = [f.to(self._scale.device) for f in state["found_inf"].values()]
        found_inf = found[0]
        for f in found[1:]:
            found_inf = found_inf + f
        if state["stage"] is _Stage.UNSCALED:
            optimizer.grad_scale = getattr(optimizer, "grad_scale", None)
        else:
            optimizer.grad_scale = self._scale * getattr(optimizer, "grad_scale", 1)
        optimizer.found_inf = found_inf
        try:
            result = optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale
            del optimizer.found_inf
        state["stage"] = _Stage.STEPPED
        return result

    def update(self, new_scale=None) -> None:
        """Back off after an overflow or grow after ``growth_interval`` clean steps (or set
        ``new_scale``), then forget this iteration's inf checks."""
        if not self._enabled:
            return
        self._need_scale("update")
        if new_scale is not None:
            if isinstance(new_scale, float):
                self._scale.fill_(new_scale)
            elif isinstance(new_scale, torch.Tensor) and new_scale.numel() == 1 and not new_scale.requires_grad:
                self._scale.copy_(new_scale.reshape(()))
            else:
                raise TypeError("new_scale must be a float or a 1-element tensor that does not require grad")
        else:
            found = [f.to(self._scale.device) for s in self._per_optimizer.values() for f in s["found_inf"].values()]
            if not found:
                raise RuntimeError("No inf checks were recorded prior to update().")
            combined = found[0]
            for f in found[1:]:
                combined = combined + f
            update_scale_(
                self._scale,
                self._growth_tracker,
                combined,
                self._growth_factor,
                self._backoff_factor,
                self._growth_interval,
            )
        self._per_optimizer = {}

    def get_scale(self) -> float:
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def found_inf(self, optimizer) -> bool:
        """Whether this iteration's unscale of ``optimizer`` found an inf/NaN (a host sync)."""
        return any(bool(f.item()) for f in self._state(optimizer)["found_inf"].values())

    def state_dict(self) -> dict:
        """The keys and values of ``torch.amp.GradScaler.state_dict()``; either loads the other's."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self.get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("state_dict is empty: it was saved from a disabled scaler")
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(state_dict)
        if missing:
            raise ValueError(f"state_dict lacks {sorted(missing)}")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._scale is not None:
            self._scale.fill_(self._init_scale)
            self._growth_tracker.fill_(self._init_growth_tracker)


__all__ = [
    "CODE_BF16",
    "CODE_FP16",
    "CODE_FP32",
    "CODE_FP64",
    "DynamicLossScaler",
    "foreach_non_finite_check_and_unscale_",
    "foreach_non_finite_check_and_unscale_reference",
    "update_scale_",
]
