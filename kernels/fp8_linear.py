"""An FP8 linear layer that trains: the three GEMMs of ``nn.Linear`` in FP8, the rest in bf16/fp32.

Chapter 5 and Lab 05 (FP8 GEMM).  Entry points: :class:`FP8Linear`, :func:`fp8_linear`,
:func:`swap_linears`, :func:`fp8_linear_reference`.

Forward and backward of ``Y = X W^T + b`` (``X`` ``(T, in)``, ``W`` ``(out, in)``) are three GEMMs, each
run by :func:`kernels.fp8_gemm.fp8_gemm` as ``C = A B^T`` with both operands K-major:

=========  ==============  =====================  =====================  ========
GEMM       C               A (format)             B (format)             K
=========  ==============  =====================  =====================  ========
forward    Y  (T, out)     X     (T, in)   e4m3   W     (out, in)  e4m3  in
dgrad      dX (T, in)      dY    (T, out)  e5m2   W^T   (in, out)  e4m3  out
wgrad      dW (out, in)    dY^T  (out, T)  e5m2   X^T   (in, T)    e4m3  T
=========  ==============  =====================  =====================  ========

The HYBRID recipe: activations and weights in E4M3 (precision), gradients in E5M2 (range).  Every
operand is quantized along its GEMM's K dimension, so the transposed operands (``W^T``, ``dY^T``,
``X^T``) are quantized again *from the wide (bf16/fp32) original*, never made by transposing FP8
codes: with per-row or per-block scales, transposed codes would carry scales that vary along K.  With
one scale per tensor the two agree bit for bit (same S, same elements), so that recipe quantizes each
operand in one kernel launch that computes its amax, S, its codes and its transpose's codes
(:func:`kernels.quantize.quantize_tensor_fused`; :func:`tensor_operand`), and the backward keeps the
transposes (1 byte per element), where a separate transpose would read and write the codes again: a
step is six launches (three quantizers, three GEMMs).  Per row, the transposed operands' scales are the
wide tensor's column maxima, and one launch writes their codes transposed
(:func:`kernels.quantize.quantize_columns_transposed`; :func:`transposed_operand`).

Where FP8 pays: the casts cost memory passes and every launch costs host time, so a narrow layer runs
faster in bf16; :func:`swap_linears` leaves layers narrower than :data:`MIN_FEATURES` in bf16 unless
told otherwise.

Scaling (:class:`FP8Recipe`): ``granularity`` "tensor" (default), "row" (one scale per row of each
operand) or "block" (1x128 for A operands, 128x128 for B operands, with fp32 promotion).  With
"tensor", ``scaling`` is "current" (default: each tensor's own amax, one extra read) or "delayed" (the
scale comes from an amax history of earlier steps, :class:`kernels.quantize.DelayedScaling`, one object
per tensor role ``x``, ``w``, ``dy``; the layer's ``fp8_state_dict`` holds the histories).

What stays wide: the bias and its gradient (fp32 sum), the master weight (its dtype is yours), and
everything outside this layer (embeddings, output head, norms, softmax, loss, optimizer state).
:class:`MarkovLM` is a small real model for training runs: a fixed random Markov source whose entropy
is the best loss any model can reach.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import fp8_ops as ops
from kernels import quantize as Q
from kernels.device import default_device
from kernels.fp8_gemm import fp8_gemm_reference

GRANULARITIES = ("tensor", "row", "block")
SCALINGS = ("current", "delayed")
ALIGN = 16  # FP8 GEMMs (cuBLAS, TMA) want every dimension of the weight a multiple of 16


@dataclass(frozen=True)
class FP8Recipe:
    """How an :class:`FP8Linear` quantizes.  ``fwd_fmt`` is the format of X and W, ``grad_fmt`` of dY:
    e4m3 / e5m2 is the HYBRID recipe.  Delayed scaling only for ``granularity="tensor"``."""

    granularity: str = "tensor"
    scaling: str = "current"
    history_len: int = 16
    margin: int = 0
    algo: str = "max"
    fwd_fmt: str = "e4m3"
    grad_fmt: str = "e5m2"

    def __post_init__(self):
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {list(GRANULARITIES)}, got {self.granularity!r}")
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {list(SCALINGS)}, got {self.scaling!r}")
        if self.scaling == "delayed" and self.granularity != "tensor":
            raise ValueError("scaling='delayed' keeps one amax history per tensor: use granularity='tensor'")
        for name in ("fwd_fmt", "grad_fmt"):
            if getattr(self, name) not in Q.FP8_FORMATS:
                raise ValueError(f"{name} must be one of {list(Q.FP8_FORMATS)}, got {getattr(self, name)!r}")
        if self.fwd_fmt == "e5m2":
            raise ValueError(
                "fwd_fmt must be 'e4m3': X and W are quantized to fwd_fmt, so the forward GEMM (X W^T) would "
                "multiply two e5m2 operands, and so would both backward GEMMs with e5m2 gradients; an FP8 GEMM "
                "takes one e4m3 operand at least (kernels.fp8_gemm, like cuBLAS, refuses e5m2 x e5m2)"
            )


# -- quantizing one operand ---------------------------------------------------------------------------

_GEMM_SCALING = {"tensor": "tensor", "row": "row", "block": "block"}


def delayed_scale(state: Q.DelayedScaling, x: torch.Tensor) -> torch.Tensor:
    """The scale of delayed scaling, with a cold start: while the history is empty (first step) the
    scale is the current one, so step 1 neither saturates activations nor flushes gradients to zero.
    Records ``x``'s amax in the history."""
    amax, history = ops.tensor_amax(x), state.amax_history
    # state.scale(), through the operator that keeps S's bits under torch.compile
    past = history.max() if state.algo == "max" else history[0]
    scales = ops.scale_from_amax(torch.stack([past, amax]) * 2.0**state.margin, state.fmt)
    s = torch.where(history.max() > 0, scales[0], scales[1])
    state.update(amax)
    return s


def tensor_operand(x: torch.Tensor, fmt: str, state=None, transpose: bool = False) -> tuple:
    """Per-tensor codes of a matrix ``x`` ``(rows, K)`` and, with ``transpose``, of ``x.T`` in the same
    pass: ``(Quantized(q, S), qt or None)``.  ``state``: a DelayedScaling (its scale, and ``x``'s amax
    into its history); None: current scaling, one launch for amax, S and codes."""
    s = delayed_scale(state, x) if state is not None else None
    if transpose:
        return ops.quantize_tensor_and_transpose(x, fmt, s)
    if s is None:
        return ops.quantize_tensor(x, fmt), None
    return Q.Quantized(ops.quantize_tensor_with_scale(x, s, fmt), s), None


def quantize_operand(x: torch.Tensor, role: str, fmt: str, granularity: str, scale=None, state=None) -> Q.Quantized:
    """Quantize a K-major GEMM operand ``x`` ``(rows, K)``.  ``role`` "a" or "b" picks the block shape
    for ``granularity="block"`` (1x128 for A, 128x128 for B).  ``scale``: reuse a known per-tensor S
    (the transposed copy of a tensor already quantized); ``state``: a DelayedScaling for its history."""
    if granularity == "tensor":
        if scale is not None:
            return Q.Quantized(ops.quantize_tensor_with_scale(x, scale, fmt), scale)
        return tensor_operand(x, fmt, state)[0]
    if granularity == "row":
        return ops.quantize_groups(x, "row", fmt)
    return ops.quantize_groups(x, "1x128" if role == "a" else "128x128", fmt)


def transposed_operand(x: torch.Tensor, role: str, fmt: str, granularity: str) -> Q.Quantized:
    """:func:`quantize_operand` of ``x.T`` from the wide ``x`` ``(rows, K)``.  Per row, the scales of
    ``x.T``'s rows are ``x``'s column maxima, and one pass writes the codes transposed
    (:func:`kernels.quantize.quantize_columns_transposed`) instead of transposing ``x`` in its wide
    format first; per block, ``x.T`` is materialized and quantized."""
    if granularity == "row":
        return ops.quantize_columns_transposed(x, fmt)
    return quantize_operand(x.t().contiguous(), role, fmt, granularity)


def _gemm(qa: Q.Quantized, qb: Q.Quantized, granularity: str, out_dtype) -> torch.Tensor:
    return ops.fp8_gemm_quantized(qa, qb, _GEMM_SCALING[granularity], out_dtype)


def _out_dtype(dtype) -> torch.dtype:
    return dtype if dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16


# -- the autograd Function ----------------------------------------------------------------------------


class FP8LinearFunction(torch.autograd.Function):
    """``x @ weight.T + bias`` with the three GEMMs in FP8 (see the module docstring).

    ``states`` is None (current scaling) or a dict of DelayedScaling objects for "x", "w" and "dy"."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe: FP8Recipe, states):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (T, in)
        g = recipe.granularity
        st = states or {}
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if g == "tensor":
            # One S per tensor: X^T's and W^T's codes are the forward's codes transposed, exactly what
            # quantizing the wide transposes with the same S gives, so one pass writes both (only the
            # transposes the backward will use) and the backward keeps them (1 byte each).
            qx, qxt = tensor_operand(x2, recipe.fwd_fmt, st.get("x"), transpose=need_dw)
            qw, qwt = tensor_operand(weight, recipe.fwd_fmt, st.get("w"), transpose=need_dx)
            ctx.save_for_backward(qxt, qwt, qx.s, qw.s)
        else:
            # Scales along rows or blocks: the backward quantizes X^T and W^T again along their own K.
            qx = quantize_operand(x2, "a", recipe.fwd_fmt, g)
            qw = quantize_operand(weight, "b", recipe.fwd_fmt, g)
            ctx.save_for_backward(x2, weight, None, None)
        y = _gemm(qx, qw, g, _out_dtype(x.dtype))  # (T, out)
        if bias is not None:
            y = (y.float() + bias.float()).to(y.dtype)
        ctx.recipe, ctx.states, ctx.shape, ctx.has_bias = recipe, states, shape, bias is not None
        ctx.dtypes = (x.dtype, weight.dtype)
        return y.reshape(*shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x_saved, w_saved, sx, sw = ctx.saved_tensors
        r, g = ctx.recipe, ctx.recipe.granularity
        x_dtype, w_dtype = ctx.dtypes
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()  # (T, out)
        dx = dw = db = None
        if g == "tensor":  # the saved tensors are the codes of X^T and W^T
            qdy, qdyt = tensor_operand(dy2, r.grad_fmt, (ctx.states or {}).get("dy"), transpose=need_dw)
            if need_dx:  # dX = dY (W^T)^T: B operand W^T (in, out)
                dx = _gemm(qdy, Q.Quantized(w_saved, sw), g, _out_dtype(x_dtype)).reshape(ctx.shape)
            if need_dw:  # dW = dY^T (X^T)^T: A operand dY^T (out, T), B operand X^T (in, T)
                dw = _gemm(Q.Quantized(qdyt, qdy.s), Q.Quantized(x_saved, sx), g, _out_dtype(w_dtype))
        else:  # each transposed operand quantized again from the wide original, along its own K
            qdy = quantize_operand(dy2, "a", r.grad_fmt, g)
            if need_dx:
                qwt = transposed_operand(w_saved, "b", r.fwd_fmt, g)  # W^T (in, out)
                dx = _gemm(qdy, qwt, g, _out_dtype(x_dtype)).reshape(ctx.shape)
            if need_dw:
                qdyt = transposed_operand(dy2, "a", r.grad_fmt, g)  # dY^T (out, T)
                qxt = transposed_operand(x_saved, "b", r.fwd_fmt, g)  # X^T (in, T)
                dw = _gemm(qdyt, qxt, g, _out_dtype(w_dtype))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0)  # fp32: a bf16 sum over thousands of tokens loses ~3 digits
        return dx, dw, db, None, None


def fp8_linear(x, weight, bias=None, recipe: FP8Recipe = FP8Recipe(), states=None) -> torch.Tensor:
    """Functional form of :class:`FP8Linear`."""
    _check_linear_args(x, weight, bias)
    return FP8LinearFunction.apply(x, weight, bias, recipe, states)


def _check_linear_args(x, weight, bias):
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be (out_features, in_features), got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x has shape {tuple(x.shape)}; its last dimension must be in_features={weight.shape[1]}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


# -- the nn.Module ----------------------------------------------------------------------------------


class FP8Linear(torch.nn.Linear):
    """``nn.Linear`` with its three GEMMs in FP8: same constructor, parameters and state_dict, plus a
    ``recipe`` (:class:`FP8Recipe`).  ``in_features`` and ``out_features`` must be multiples of 16
    (keep odd-sized layers in bf16).  With delayed scaling the amax histories are buffers of the
    in ``state_dict`` (``amax_history_x``, ``_w``, ``_dy``), so checkpoints keep them."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, recipe=None):
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if v % ALIGN:
                raise ValueError(f"{name}={v} is not a multiple of {ALIGN}: FP8 GEMMs need aligned dimensions")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = recipe if recipe is not None else FP8Recipe()
        if not isinstance(self.recipe, FP8Recipe):
            raise TypeError(f"recipe must be an FP8Recipe, got {type(self.recipe).__name__}")
        self.states = None
        if self.recipe.scaling == "delayed":
            r = self.recipe
            dev = self.weight.device
            self.states = {
                role: Q.DelayedScaling(r.history_len, r.margin, r.algo, fmt, device=dev)
                for role, fmt in (("x", r.fwd_fmt), ("w", r.fwd_fmt), ("dy", r.grad_fmt))
            }

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, recipe=None) -> "FP8Linear":
        """An FP8Linear sharing ``linear``'s parameters (no copy)."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, "meta", recipe=recipe)
        new.weight, new.bias = linear.weight, linear.bias
        for s in (new.states or {}).values():
            s.amax_history = torch.zeros_like(s.amax_history, device=linear.weight.device)
        return new

    def forward(self, x):
        return fp8_linear(x, self.weight, self.bias, self.recipe, self.states)

    # With delayed scaling the histories join the state_dict as "amax_history_{x,w,dy}"; with current
    # scaling the state_dict is exactly nn.Linear's.
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for role, state in (self.states or {}).items():
            destination[f"{prefix}amax_history_{role}"] = state.amax_history.clone()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)
        for role, state in (self.states or {}).items():
            key = f"{prefix}amax_history_{role}"
            if key in state_dict:
                state.amax_history = state_dict[key].detach().clone().to(state.amax_history.device)
                if key in unexpected:
                    unexpected.remove(key)
            elif strict:
                missing.append(key)

    def amax_histories(self) -> dict:
        """The delayed-scaling histories (newest first), or {} with current scaling."""
        return {k: v.amax_history for k, v in (self.states or {}).items()}

    def extra_repr(self) -> str:
        r = self.recipe
        return f"{super().extra_repr()}, granularity={r.granularity}, scaling={r.scaling}"


# Below this width (in_features or out_features) a layer's FP8 step does not repay its casts and its
# launches.  On the H200 (benchmarks/results, fp8_linear), with as many tokens as features, FP8Linear's
# step runs at 0.20x bf16's speed at 2048^3 and 0.69x to 0.95x at 4096^3 (from run to run: both sizes
# are bound by the host's launches, and the host's speed varies) and 1.71x at 8192^3; an LLM MLP
# projection (16384 tokens, 4096 <-> 14336) gains 1.66x.  At this width the step pays with many tokens
# and can lose with few.  swap_linears keeps narrower layers in bf16 unless told not to.
MIN_FEATURES = 4096


def swap_linears(
    module: torch.nn.Module, recipe=None, skip=lambda name, m: False, min_features: int = MIN_FEATURES
) -> torch.nn.Module:
    """Replace every eligible ``nn.Linear`` in ``module`` (in place) by an :class:`FP8Linear` sharing its
    parameters.  Layers stay in bf16 when their sizes are not multiples of 16, when ``skip(name,
    layer)`` names them, and when ``in_features`` or ``out_features`` is below ``min_features``
    (:data:`MIN_FEATURES` by default: where FP8 does not pay; ``min_features=0`` swaps every aligned
    layer, to study FP8's numerics on a small model).  Returns ``module``."""
    if not isinstance(min_features, int) or min_features < 0:
        raise ValueError(f"min_features must be a non-negative int, got {min_features!r}")
    for name, child in list(module.named_modules()):
        for attr, sub in list(child.named_children()):
            full = f"{name}.{attr}" if name else attr
            if type(sub) is torch.nn.Linear and not skip(full, sub):
                aligned = sub.in_features % ALIGN == 0 and sub.out_features % ALIGN == 0
                if aligned and min(sub.in_features, sub.out_features) >= min_features:
                    setattr(child, attr, FP8Linear.from_linear(sub, recipe))
    return module


# -- references ---------------------------------------------------------------------------------------


def fp8_linear_reference(x, weight, dy, recipe: FP8Recipe = FP8Recipe(), bias=None):
    """The layer's forward and both gradients with the same quantization (the package's plain-torch
    quantizer references) and float64 GEMMs: ``(y, dx, dw)``.  Current scaling only."""
    if recipe.scaling != "current":
        raise ValueError("fp8_linear_reference models current scaling")
    g = recipe.granularity
    quant = {
        ("tensor", "a"): Q.quantize_tensor_reference,
        ("tensor", "b"): Q.quantize_tensor_reference,
        ("row", "a"): Q.quantize_rowwise_reference,
        ("row", "b"): Q.quantize_rowwise_reference,
        ("block", "a"): Q.quantize_1x128_reference,
        ("block", "b"): Q.quantize_128x128_reference,
    }

    def gemm(a, role_a, fa, b, fb, out):
        qa, qb = quant[(g, "a")](a, fa), quant[(g, "b")](b, fb)
        return fp8_gemm_reference(qa.q, qb.q, qa.s, qb.s, _GEMM_SCALING[g], out)

    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    y = gemm(x2, "a", recipe.fwd_fmt, weight, recipe.fwd_fmt, _out_dtype(x.dtype))
    if bias is not None:
        y = (y.float() + bias.float()).to(y.dtype)
    dx = gemm(dy2, "a", recipe.grad_fmt, weight.t().contiguous(), recipe.fwd_fmt, _out_dtype(x.dtype))
    dw = gemm(dy2.t().contiguous(), "a", recipe.grad_fmt, x2.t().contiguous(), recipe.fwd_fmt, _out_dtype(weight.dtype))
    return y.reshape(*x.shape[:-1], weight.shape[0]), dx.reshape(x.shape), dw


# Against a bf16 nn.Linear (fp32 accumulation), kernels.testing.frobenius_error on random Gaussian data:
# e4m3 rounds each element with RMS relative error ~2^-4/sqrt(3) = 0.036, e5m2 ~0.072; the errors of
# the two operands of a GEMM add in quadrature and average out over K.  Y: two e4m3 operands (~0.05);
# dX and dW: one e5m2 and one e4m3 operand (~0.08).  The bounds leave ~1.5x headroom.
BF16_TOLERANCE = {"y": 0.08, "dx": 0.12, "dw": 0.12}


# -- a small real model for training runs ---------------------------------------------------------------


def markov_source(vocab: int = 64, order: int = 2, seed: int = 0, concentration: float = 0.3):
    """A fixed random Markov chain over ``vocab`` symbols: transition probabilities ``(vocab**order,
    vocab)`` drawn from a Dirichlet(``concentration``) (peaked, so there is something to learn).
    Returns ``(probs, entropy)``: the entropy rate in nats is the lowest loss any model can reach."""
    g = torch.Generator().manual_seed(seed)
    gamma = torch._standard_gamma(torch.full((vocab**order, vocab), concentration, dtype=torch.float64), generator=g)
    probs = gamma / gamma.sum(-1, keepdim=True)
    # Stationary distribution of the contexts by power iteration on the chain of contexts.
    pi = torch.full((vocab**order,), 1.0 / vocab**order, dtype=torch.float64)
    nxt = (torch.arange(vocab**order)[:, None] % vocab ** (order - 1)) * vocab + torch.arange(vocab)[None, :]
    for _ in range(200):
        pi = torch.zeros_like(pi).index_add_(0, nxt.reshape(-1), (pi[:, None] * probs).reshape(-1))
    h = -(probs * probs.clamp_min(1e-300).log()).sum(-1)
    return probs.float(), float((pi * h).sum())


def markov_batch(probs: torch.Tensor, batch: int, context: int, generator: torch.Generator):
    """``batch`` windows of ``context`` symbols and the symbol that follows each (CPU, deterministic)."""
    vocab = probs.shape[1]
    order = 1
    while vocab**order < probs.shape[0]:
        order += 1
    seq = torch.randint(0, vocab, (batch, order), generator=generator)
    out = [seq[:, i] for i in range(order)]
    for _ in range(context + 1 - order):
        ctx = sum(out[-order + i] * vocab ** (order - 1 - i) for i in range(order))
        out.append(torch.multinomial(probs[ctx], 1, generator=generator)[:, 0])
    s = torch.stack(out, 1)  # (batch, context + 1)
    return s[:, :context], s[:, context]


class MarkovLM(torch.nn.Module):
    """Next-symbol prediction from a window of ``context`` symbols: embeddings (wide) -> ``depth``
    residual MLP blocks (RMSNorm in fp32, then Linear(d, 4d), GELU, Linear(4d, d): the GEMMs that FP8
    replaces) -> RMSNorm -> output head (wide) -> cross-entropy in fp32."""

    def __init__(self, vocab=64, context=8, dim=64, depth=2, fp8_recipe=None, device=None, dtype=torch.bfloat16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim, device=device, dtype=dtype)
        self.pos = torch.nn.Parameter(torch.randn(context, dim, device=device, dtype=dtype) * 0.02)
        self.proj = torch.nn.Linear(context * dim, dim, device=device, dtype=dtype)
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(dim, device=device) for _ in range(depth))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(dim, 4 * dim, device=device, dtype=dtype) for _ in range(depth))
        self.downs = torch.nn.ModuleList(
            torch.nn.Linear(4 * dim, dim, device=device, dtype=dtype) for _ in range(depth)
        )
        self.norm_out = torch.nn.RMSNorm(dim, device=device)
        self.head = torch.nn.Linear(dim, vocab, device=device, dtype=dtype)
        if fp8_recipe is not None:  # only the blocks' GEMMs: embeddings, input projection and head stay wide
            swap_linears(self, fp8_recipe, skip=lambda name, m: name in ("proj", "head"), min_features=0)

    def forward(self, idx):
        h = self.proj((self.embed(idx) + self.pos).flatten(1))  # (B, dim)
        for norm, up, down in zip(self.norms, self.ups, self.downs, strict=True):
            h = h + down(F.gelu(up(norm(h.float()).to(h.dtype))))
        return self.head(self.norm_out(h.float()).to(h.dtype)).float()  # fp32 logits for the softmax


def train_markov(
    fp8_recipe=None, steps=20, batch=64, dim=64, depth=2, context=8, lr=3e-3, seed=0, device=None, log_every=1
):
    """Train :class:`MarkovLM` (bf16 weights, fp32 AdamW state) with its block GEMMs in FP8
    (``fp8_recipe``) or bf16 (None), on the same batches for the same seed.  Returns
    ``(losses, entropy)``: the training loss every ``log_every`` steps and the source's entropy."""
    device = device or default_device()
    probs, entropy = markov_source(seed=seed)
    torch.manual_seed(seed)
    model = MarkovLM(probs.shape[1], context, dim, depth, None, device=device)
    if fp8_recipe is not None:
        swap_linears(model, fp8_recipe, skip=lambda name, m: name in ("proj", "head"), min_features=0)
    # fp32 master copies and optimizer state: AdamW over fp32 params, bf16 copies for compute.
    master = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    for step in range(steps):
        idx, target = markov_batch(probs, batch, context, gen)
        loss = F.cross_entropy(model(idx.to(device)), target.to(device))
        model.zero_grad(set_to_none=True)
        loss.backward()
        for p, m in zip(model.parameters(), master, strict=True):
            m.grad = p.grad.float() if p.grad is not None else None
        opt.step()
        with torch.no_grad():
            for p, m in zip(model.parameters(), master, strict=True):
                p.copy_(m)
        if step % log_every == 0 or step == steps - 1:
            losses.append(loss.item())
    return losses, entropy


__all__ = [
    "BF16_TOLERANCE",
    "FP8Linear",
    "FP8LinearFunction",
    "FP8Recipe",
    "MIN_FEATURES",
    "MarkovLM",
    "delayed_scale",
    "fp8_linear",
    "fp8_linear_reference",
    "markov_batch",
    "markov_source",
    "quantize_operand",
    "swap_linears",
    "tensor_operand",
    "transposed_operand",
    "train_markov",
]
