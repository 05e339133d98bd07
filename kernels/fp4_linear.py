"""A linear layer that trains in FP4: the NVFP4 training recipe, with its GEMMs emulated exactly on bf16
tensor cores.

Chapter 6 (training in FP4) and Lab 06 (question 5, the backward's operands).  Entry points:
:class:`FP4Recipe`, :class:`FP4Linear`, :func:`fp4_linear`, :func:`operands`, :func:`fp4_linear_reference`.

The three GEMMs of ``Y = X W^T + b``, each ``C = A B^T`` with both operands quantized along its K:

=========  ============  ========================================  ===================================  ====
GEMM       C             A                                         B                                    K
=========  ============  ========================================  ===================================  ====
forward    Y  (T, out)   X (T, in): 1x16 blocks                    W (out, in): 16x16 tiles             in
dgrad      dX (T, in)    dY (T, out): 1x16, stochastic rounding    W^T (in, out): the same 16x16 tiles  out
wgrad      dW (out, in)  dY^T (out, T): RHT, 1x16, stochastic      X^T (in, T): RHT, 1x16               T
=========  ============  ========================================  ===================================  ====

What each ingredient of the recipe is for (each can be switched off in :class:`FP4Recipe`, to measure it):

* **16x16 weight tiles** (``weight_tiles``): one E4M3 scale per 16x16 tile of ``W``, so that ``W`` and
  ``W^T`` quantize to the same values (a tile's amax does not care which way it is read), and the
  backward's dgrad differentiates the very weights the forward used.  With 1x16 blocks ``W^T`` is quantized
  again along ``out`` from the wide weight, and the two passes see different weights.
* **Stochastic rounding of the gradients** (``stochastic_rounding``): round to nearest is biased for any one
  value, and the bias of a gradient compounds over the steps; rounding up with probability equal to the
  distance makes every code an unbiased estimate.  Activations and weights keep round to nearest.
* **A Random Hadamard Transform of the wgrad operands** (``rht``): ``dY^T`` and ``X^T`` are rotated along
  their K (the tokens) by the same ``R = diag(signs) H / 4`` in blocks of 16, which leaves ``dY^T X``
  unchanged and spreads an outlier token over 16, so one token no longer sets a block's scale.
* **Each operand from its wide original**: ``dY^T`` and ``X^T`` are quantized again along the tokens from
  the bf16 / fp32 tensors, never made by transposing FP4 codes whose scales run along the other axis.
* **Sensitive layers stay wide**: :func:`swap_linears` leaves the layers it is told to keep (the output
  head, the last blocks) in bf16.

The format is NVFP4 (E2M1 in blocks of 16, E4M3 block scales, an fp32 tensor scale per tensor) or, for
comparison, MXFP4 (blocks of 32, E8M0 scales, no 16x16 tiles).  Hopper has no FP4 tensor cores, and the
recipe's numbers do not need them: an FP4 GEMM multiplies codes times block scales, which are exact in
bf16 (:func:`kernels.fp4.block_values`), sums the products in fp32 and applies the two tensor scales to the
sum.  A bf16 GEMM with an fp32 accumulator on those exact values does that; on Blackwell the tensor cores
read the codes and scales themselves (``tl.dot_scaled``), and the numbers differ only in the order of the
fp32 sum.  The quantizers are the Triton kernels of chapter 6: :func:`kernels.fp4.quantize_fp4` for
``X``, ``W`` and ``dY``, and :func:`kernels.fp4.quantize_fp4_t` for the wgrad operands, which transposes,
rotates and quantizes in one kernel, bit for bit the three passes (``t()``, ``hadamard_rotate``,
``quantize_fp4``) that :func:`fp4_linear_reference` runs.

:func:`fp4_linear_reference` is the same recipe in plain torch: the quantizers' references (bit for bit
the kernels', stochastic rounding's random bits included) and the GEMMs in float64.  The rotation is the
package's kernel there too: it is checked against its own float64 reference in ``tests/test_hadamard.py``,
and one rounding of difference in a rotated element could move an FP4 code by a whole step.
"""

import math
from dataclasses import dataclass

import torch

from kernels import fp4
from kernels.hadamard import hadamard_rotate, random_signs

RHT_BLOCK = fp4.RHT_BLOCK  # the recipe's rotation: 16x16 Hadamard blocks along the wgrad's K
ROLES = ("x", "w", "dy", "wt", "dyt", "xt")  # the six operands: forward (x, w), dgrad (dy, wt), wgrad (dyt, xt)


@dataclass(frozen=True)
class FP4Recipe:
    """The FP4 training recipe and its ablations.  ``fmt`` "nvfp4" (default) or "mxfp4";
    ``weight_tiles`` 16x16 weight tiles (NVFP4 only; off: 1x16 blocks, ``W^T`` quantized again);
    ``stochastic_rounding`` of the gradient operands; ``rht`` the Random Hadamard Transform of the wgrad
    operands; ``seed`` for the rotation's signs and the stochastic rounding.  ``reference`` quantizes with
    the plain-torch references, bit for bit the kernels' (``tests/test_fp4_linear.py``), for training runs
    in CPU mode, where the interpreter takes seconds for every tensor the kernels quantize."""

    fmt: str = "nvfp4"
    weight_tiles: bool = True
    stochastic_rounding: bool = True
    rht: bool = True
    seed: int = 0
    reference: bool = False

    def __post_init__(self):
        if self.fmt not in fp4.FORMATS:
            raise ValueError(f"fmt must be one of {list(fp4.FORMATS)}, got {self.fmt!r}")
        if self.weight_tiles and self.fmt != "nvfp4":
            raise ValueError("weight_tiles (16x16 tiles) is NVFP4's; use FP4Recipe('mxfp4', weight_tiles=False)")
        for name in ("weight_tiles", "stochastic_rounding", "rht", "reference"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**20:
            raise ValueError(f"seed must be an int in [0, 2^20), got {self.seed!r}")

    @property
    def block(self) -> int:
        return fp4.FORMATS[self.fmt]

    def step_seeds(self, step: int) -> tuple:
        """The stochastic-rounding seeds of step ``step``: (dgrad's dY, wgrad's dY^T), distinct per step."""
        base = (self.seed * 1_000_003 + 2 * step) % (2**31 - 1)
        return base, base + 1


# -- the operands ---------------------------------------------------------------------------------


def _rotated(t: torch.Tensor, recipe: FP4Recipe) -> torch.Tensor:
    if not recipe.rht:
        return t
    return hadamard_rotate(t, RHT_BLOCK, random_signs(RHT_BLOCK, recipe.seed, t.device))


def _quantize(t, recipe: FP4Recipe, tiles: bool = False, seed=None, reference: bool = False) -> fp4.FP4Tensor:
    kw = {"stochastic_rounding": seed is not None, "seed": 0 if seed is None else seed}
    if tiles:
        kw["block_2d"] = True
    if reference or recipe.reference:
        return fp4.quantize_fp4_reference(t.contiguous(), recipe.fmt, **kw)
    return fp4.quantize_fp4(t.contiguous(), recipe.fmt, **kw)


def _quantize_t(t2, recipe: FP4Recipe, seed=None, reference: bool = False) -> fp4.FP4Tensor:
    """A wgrad operand: ``t2^T`` (rotated along the tokens if the recipe rotates), quantized along the
    tokens, in one kernel (:func:`kernels.fp4.quantize_fp4_t`) or by the references."""
    if reference or recipe.reference:
        return _quantize(_rotated(t2.t().contiguous(), recipe), recipe, seed=seed, reference=True)
    signs = random_signs(RHT_BLOCK, recipe.seed, t2.device) if recipe.rht else None
    sr = {"stochastic_rounding": seed is not None, "seed": 0 if seed is None else seed}
    return fp4.quantize_fp4_t(t2, recipe.fmt, signs, **sr)


def _transpose_tiles(q: fp4.FP4Tensor) -> fp4.FP4Tensor:
    """The 16x16-tiled quantization of ``W`` read as ``W^T``'s: codes transposed, the tile scales put on
    ``W^T``'s rows (the same tile's scale, whichever way it is read), the same tensor scale."""
    rows, k = q.q.shape[0], q.q.shape[1] * 2
    codes = fp4.unpack(q.q).reshape(rows, k).t().contiguous()
    tile = q.s.view(torch.uint8)[::16]  # (rows / 16, k / 16): one scale per tile
    s = tile.t().repeat_interleave(16, 0)[:k].contiguous().view(torch.float8_e4m3fn)
    return fp4.FP4Tensor(fp4.pack(codes), s, q.tensor_scale, q.fmt)


def operands(x2, weight, dy2, recipe: FP4Recipe, step: int = 0, reference: bool = False) -> dict:
    """The six quantized operands of one training step (:data:`ROLES`), from the wide ``x2`` ``(T, in)``,
    ``weight`` ``(out, in)`` and ``dy2`` ``(T, out)``: the kernels' (default) or the references'."""
    sd, sdt = recipe.step_seeds(step) if recipe.stochastic_rounding else (None, None)
    q = {"x": _quantize(x2, recipe, reference=reference)}
    q["w"] = _quantize(weight, recipe, tiles=recipe.weight_tiles, reference=reference)
    q["dy"] = _quantize(dy2, recipe, seed=sd, reference=reference)
    if recipe.weight_tiles:
        q["wt"] = _transpose_tiles(q["w"])
    else:
        q["wt"] = _quantize(weight.t(), recipe, reference=reference)
    q["dyt"] = _quantize_t(dy2, recipe, seed=sdt, reference=reference)
    q["xt"] = _quantize_t(x2, recipe, reference=reference)
    return q


# -- the GEMM ---------------------------------------------------------------------------------------


def fp4_gemm(qa: fp4.FP4Tensor, qb: fp4.FP4Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """``A B^T`` of two FP4 operands quantized along K: exact block values on bf16 tensor cores, fp32
    accumulation (cuBLAS on the GPU), the tensor scales (NVFP4) applied to the fp32 sum, one rounding."""
    if qa.fmt != qb.fmt:
        raise ValueError(f"both operands must be in one format, got {qa.fmt} and {qb.fmt}")
    a, b = fp4.block_values(qa), fp4.block_values(qb)
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"the operands' K differ: {tuple(a.shape)} and {tuple(b.shape)}")
    if a.device.type == "cuda":
        acc = torch.mm(a, b.t(), out_dtype=torch.float32)
    else:  # no bf16 GEMM with an fp32 result on the CPU: the same exact products, summed in fp32
        acc = a.float() @ b.float().t()
    if qa.fmt == "nvfp4":
        acc = acc * qa.tensor_scale.float() * qb.tensor_scale.float()
    return acc.to(out_dtype)


def _block_values_reference(q: fp4.FP4Tensor) -> torch.Tensor:
    if q.fmt == "nvfp4":
        q = q._replace(tensor_scale=torch.ones_like(q.tensor_scale))
    return fp4.dequantize_fp4_reference(q).double()


def _gemm_reference(qa, qb) -> torch.Tensor:
    """:func:`fp4_gemm` in float64, not rounded: the exact sum of the exact products, times the scales."""
    c = _block_values_reference(qa) @ _block_values_reference(qb).t()
    if qa.fmt == "nvfp4":
        c = c * qa.tensor_scale.double() * qb.tensor_scale.double()
    return c


# -- the autograd Function and the module -------------------------------------------------------------


def _check_features(in_f: int, out_f: int, recipe) -> None:
    if not isinstance(recipe, FP4Recipe):
        raise TypeError(f"recipe must be an FP4Recipe, got {type(recipe).__name__}")
    bs = recipe.block
    if in_f % bs or out_f % bs:
        raise ValueError(f"in_features and out_features must be multiples of {bs} ({recipe.fmt}), got {in_f}, {out_f}")
    if recipe.weight_tiles and out_f % 16:
        raise ValueError(f"16x16 weight tiles need out_features to be a multiple of 16, got {out_f}")


def _check_args(x, weight, bias, recipe):
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in fp4.INPUT_DTYPES:
            raise TypeError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be (out_features, in_features), got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x has shape {tuple(x.shape)}; its last dimension must be in_features={weight.shape[1]}")
    out_f, in_f = weight.shape
    _check_features(in_f, out_f, recipe)
    need = max(recipe.block, RHT_BLOCK if recipe.rht else 1)
    tokens = x.numel() // in_f
    if tokens % need:
        raise ValueError(f"the tokens (x's leading dimensions, {tokens}) must be a multiple of {need}: the "
                         "wgrad quantizes along them")  # fmt: skip
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != out_f):
        raise ValueError(f"bias must have shape ({out_f},), got {tuple(bias.shape)}")


class FP4LinearFunction(torch.autograd.Function):
    """``x @ weight.T + bias`` with the three GEMMs in FP4 (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe: FP4Recipe, step: int):
        x2 = x.reshape(-1, x.shape[-1])
        qx = _quantize(x2, recipe)
        qw = _quantize(weight, recipe, tiles=recipe.weight_tiles)
        y = fp4_gemm(qx, qw, x.dtype)
        if bias is not None:
            y = (y.float() + bias.float()).to(y.dtype)
        ctx.save_for_backward(x2, weight)
        ctx.qw, ctx.recipe, ctx.step, ctx.shape, ctx.has_bias = qw, recipe, step, x.shape, bias is not None
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        r = ctx.recipe
        dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()
        sd, sdt = r.step_seeds(ctx.step) if r.stochastic_rounding else (None, None)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:  # dX = dY (W^T)^T
            qwt = _transpose_tiles(ctx.qw) if r.weight_tiles else _quantize(weight.t(), r)
            dx = fp4_gemm(_quantize(dy2, r, seed=sd), qwt, x2.dtype).reshape(ctx.shape)
        if ctx.needs_input_grad[1]:  # dW = dY^T (X^T)^T, both rotated along the tokens
            qdyt = _quantize_t(dy2, r, seed=sdt)
            qxt = _quantize_t(x2, r)
            dw = fp4_gemm(qdyt, qxt, weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0)
        return dx, dw, db, None, None


def fp4_linear(x, weight, bias=None, recipe: FP4Recipe = FP4Recipe(), step: int = 0) -> torch.Tensor:
    """Functional form of :class:`FP4Linear`; ``step`` picks the stochastic rounding's seeds.  Under
    autocast the input is cast to the autocast dtype, as autocast casts a linear layer's, and the layer's
    own arithmetic (fp32 sums, the scales) runs with autocast off."""
    _check_args(x, weight, bias, recipe)
    kind = x.device.type
    if not torch.is_autocast_enabled(kind):
        return FP4LinearFunction.apply(x, weight, bias, recipe, step)
    x = x.to(torch.get_autocast_dtype(kind))
    with torch.autocast(kind, enabled=False):
        return FP4LinearFunction.apply(x, weight, bias, recipe, step)


def fp4_linear_reference(x, weight, dy, recipe: FP4Recipe = FP4Recipe(), bias=None, step: int = 0) -> tuple:
    """``(y, dx, dw, db)`` of :func:`fp4_linear` for the output gradient ``dy``, in plain torch and float64,
    not rounded: the quantizers' references (the kernels' codes, bit for bit), then the exact sums of the
    exact products times the scales.  The layer's results differ from these by its fp32 accumulation and
    its one rounding to each output's dtype."""
    _check_args(x, weight, bias, recipe)
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    q = operands(x2, weight, dy2, recipe, step, reference=True)
    y = _gemm_reference(q["x"], q["w"])
    if bias is not None:
        y = y + bias.double()
    return (
        y.reshape(*x.shape[:-1], weight.shape[0]),
        _gemm_reference(q["dy"], q["wt"]).reshape(x.shape),
        _gemm_reference(q["dyt"], q["xt"]),
        None if bias is None else dy2.double().sum(0),
    )


class FP4Linear(torch.nn.Linear):
    """``nn.Linear`` that trains with :func:`fp4_linear`: same constructor, parameters and state_dict,
    plus a ``recipe``.  Each forward in training mode advances ``step``, so every step's stochastic
    rounding draws new bits (reproducibly: the recipe's seed and the step decide them)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, recipe=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.recipe = FP4Recipe() if recipe is None else recipe
        _check_features(in_features, out_features, self.recipe)
        self.step = 0

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, recipe=None) -> "FP4Linear":
        """An FP4Linear sharing ``linear``'s parameters (no copy)."""
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, "meta", w.dtype, recipe)
        layer.weight, layer.bias = linear.weight, linear.bias
        return layer

    def forward(self, x):
        y = fp4_linear(x, self.weight, self.bias, self.recipe, self.step)
        if self.training and torch.is_grad_enabled():
            self.step += 1
        return y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"


def swap_linears(model: torch.nn.Module, recipe: FP4Recipe | None = None, keep=()) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) with an :class:`FP4Linear` sharing its
    parameters, except those whose qualified names are in ``keep`` (the recipe's sensitive layers, kept
    in bf16).  A name in ``keep`` that is not a linear layer of ``model`` is an error."""
    names = {name for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    unknown = sorted(set(keep) - names)
    if unknown:
        raise ValueError(f"keep names {unknown}, which are not nn.Linear layers of the model: {sorted(names)}")
    for name in sorted(names - set(keep)):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, FP4Linear.from_linear(getattr(parent, child), recipe))
    return model


# -- training runs ----------------------------------------------------------------------------------


def sensitive_layers(model) -> tuple:
    """The qualified names of the linear layers of chapter 4's character model that the recipe keeps in
    bf16: the output head and the four linear layers of the last transformer block (the recipe keeps the
    last blocks of a large model wide; this model has four blocks)."""
    i = len(model.blocks) - 1
    return ("head",) + tuple(f"blocks.{i}.{name}" for name in ("qkv", "proj", "up", "down"))


def prepare(model, recipe=None, keep_sensitive: bool = True) -> None:
    """Swap ``model``'s linear layers, in place, for FP4 ones by ``recipe`` (an :class:`FP4Recipe`), for
    chapter 5's FP8 layer (a :class:`kernels.fp8_linear.FP8Recipe`), or for none (None, bf16).  The
    :func:`sensitive_layers` stay as they are unless ``keep_sensitive`` is False."""
    from kernels import fp8_linear

    if not (recipe is None or isinstance(recipe, (FP4Recipe, fp8_linear.FP8Recipe))):
        raise TypeError(f"recipe must be an FP4Recipe, an FP8Recipe or None, got {type(recipe).__name__}")
    keep = sensitive_layers(model) if keep_sensitive else ()
    if isinstance(recipe, FP4Recipe):
        swap_linears(model, recipe, keep=keep)
    elif recipe is not None:
        fp8_linear.swap_linears(model, recipe, skip=lambda name, m: name in keep, min_features=0)


def train(recipe=None, keep_sensitive: bool = True, **kw) -> dict:
    """:func:`kernels.charmodel.train` of chapter 4's character model under bf16 autocast, with its linear
    layers swapped by :func:`prepare` (``recipe``, ``keep_sensitive``).  ``kw`` goes to ``charmodel.train``."""
    from kernels import charmodel, fp8_linear

    if not (recipe is None or isinstance(recipe, (FP4Recipe, fp8_linear.FP8Recipe))):
        raise TypeError(f"recipe must be an FP4Recipe, an FP8Recipe or None, got {type(recipe).__name__}")
    return charmodel.train("bf16", prepare=lambda model: prepare(model, recipe, keep_sensitive), **kw)


# The seed's rule for a low-precision run against its bf16 twin: within 1% of bf16's final loss is the
# recipe working; more than 3% means something is quantized that should not be (a sensitive layer, an
# operand along the wrong axis, a missing ingredient).
GOOD_GAP, BAD_GAP = 0.01, 0.03


def _above(loss: float, limit: float) -> bool:
    return not math.isfinite(loss) or loss > limit


def diverged_at(losses, steps, limit: float) -> int | None:
    """The logged step from which the loss stays above ``limit`` (e.g. the loss of a uniform guess,
    ln(vocabulary)) or not finite to the end of the run; None if the run ends below it.  A run that
    climbs above ``limit`` and comes back has spiked (:func:`spikes`), not diverged; a run that never
    gets below it never trained, and diverged at its first step."""
    losses, steps = list(losses), list(steps)
    if len(losses) != len(steps):
        raise ValueError(
            f"losses and steps must have one entry each per logged step, got {len(losses)} and {len(steps)}"
        )
    at = None
    for step, loss in zip(reversed(steps), reversed(losses), strict=True):
        if not _above(loss, limit):
            break
        at = step
    return at


def spikes(losses, steps, limit: float) -> list:
    """The logged steps whose loss rose above ``limit`` (or was not finite) after an earlier loss had been
    below it, and from which the run came back below it: losses that a low-precision step blew up for a
    moment.  A model may start a little above a uniform guess; those first losses are not spikes."""
    end = diverged_at(losses, steps, limit)
    found, trained = [], False
    for step, loss in zip(steps, losses, strict=True):
        if end is not None and step >= end:
            break
        if _above(loss, limit):
            if trained:
                found.append(step)
        else:
            trained = True
    return found


def verdicts(runs: dict, base: str, limit: float, tail: int = 5) -> list:
    """One row per run of ``runs`` (name -> :func:`train`'s dict): ``(name, final loss, gap to the run
    named base, verdict, diverged at)``.  The final loss is the mean of the last ``tail`` logged losses
    (one is noisy); the verdict applies :data:`GOOD_GAP` and :data:`BAD_GAP`: "within 1%", "1-3%" or
    "over 3%" ("below <base>" for a run that ended more than 1% lower than the base), and "diverged"
    when :func:`diverged_at` finds a step (a run that spiked and came back is judged by its final loss;
    :func:`spikes` finds its spikes)."""
    if base not in runs:
        raise ValueError(f"base {base!r} is not one of the runs {list(runs)}")

    def final(run):
        return sum(run["loss"][-tail:]) / len(run["loss"][-tail:])

    ref = final(runs[base])
    rows = []
    for name, run in runs.items():
        at = diverged_at(run["loss"], run["steps"], limit)
        loss = final(run)
        gap = loss / ref - 1 if math.isfinite(loss) else math.inf
        if at is not None:
            verdict = "diverged"
        elif gap < -GOOD_GAP:  # the rule judges losses above the base; this one ended clearly below it
            verdict = f"below {base}"
        elif gap <= GOOD_GAP:
            verdict = "within 1%"
        elif gap <= BAD_GAP:
            verdict = "1-3%"
        else:
            verdict = "over 3%"
        rows.append((name, loss, gap, verdict, at))
    return rows


__all__ = [
    "BAD_GAP",
    "FP4Linear",
    "FP4LinearFunction",
    "FP4Recipe",
    "GOOD_GAP",
    "RHT_BLOCK",
    "ROLES",
    "fp4_gemm",
    "fp4_linear",
    "diverged_at",
    "fp4_linear_reference",
    "operands",
    "prepare",
    "sensitive_layers",
    "spikes",
    "swap_linears",
    "train",
    "verdicts",
]
