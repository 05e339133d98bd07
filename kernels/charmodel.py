"""A small character-level transformer and the five precision recipes chapter 4 trains it with.

Chapter 4 and Lab 04 (loss scaling, its training questions); chapter 6 reads the same corpus.  Entry
points: :func:`train`, :func:`train_step`, :class:`CharTransformer`, :func:`load_corpus`,
:data:`RECIPES`.

:func:`train` trains :class:`CharTransformer` on the corpus in ``data/`` with one of :data:`RECIPES`
(fp32, bf16, fp16 with and without loss scaling, fp16 weights without a master copy), one
:func:`train_step` at a time, with :class:`kernels.amp.DynamicLossScaler` where the recipe scales the
loss and :class:`kernels.norms.RMSNorm` as the model's norm on a GPU, and logs what the chapter plots:
the loss, the share of gradients that are zero or underflow, the steps skipped, the loss scale.
With ``optimizer_state_dtype``, :func:`keep_state_in` holds AdamW's moments in a 16-bit format
between steps, the twin runs of chapter 4's loss spike.
"""

import math
from pathlib import Path

import torch

import kernels
from kernels import ROOT
from kernels.amp import DynamicLossScaler
from kernels.device import default_device
from kernels.norms import RMSNorm, rmsnorm_reference

CORPUS = "data/stdlib_docstrings.txt"

RECIPES = {
    # name: (autocast dtype or None, parameter dtype, loss scaling)
    "fp32": (None, torch.float32, False),
    "bf16": (torch.bfloat16, torch.float32, False),
    "fp16, no scaling": (torch.float16, torch.float32, False),
    "fp16 + loss scaling": (torch.float16, torch.float32, True),
    "fp16 weights, no master copy": (None, torch.float16, False),
}
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what train's optimizer_state_dtype accepts
MOMENTS = ("exp_avg", "exp_avg_sq")  # Adam's m and v, as torch.optim.AdamW names them in its state


def load_corpus(path=None):
    """``(ids, vocab)``: the shipped corpus as int64 character ids (sorted vocabulary of its characters)."""
    path = Path(path) if path is not None else ROOT / CORPUS
    text = path.read_text(encoding="ascii")
    vocab = "".join(sorted(set(text)))
    lookup = torch.full((128,), -1, dtype=torch.int64)
    lookup[torch.tensor([ord(c) for c in vocab])] = torch.arange(len(vocab))
    ids = lookup[torch.tensor(list(text.encode("ascii")), dtype=torch.int64)]
    return ids, vocab


class _Block(torch.nn.Module):
    def __init__(self, dim, heads, norm):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = norm(dim), norm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.up = torch.nn.Linear(dim, 4 * dim, bias=False)
        self.down = torch.nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):  # (B, T, D)
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)  # (B, T, H, D/H)
        att = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )  # (B, H, T, D/H)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class _TorchRMSNorm(torch.nn.Module):
    """The same norm in plain torch with fp32 statistics, for the CPU, where Triton is interpreted."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rmsnorm_reference(x, self.weight, self.eps).to(x.dtype)


class CharTransformer(torch.nn.Module):
    """A small GPT-style model over characters: embeddings, pre-norm blocks, a final norm and an
    untied output head whose logits are returned in fp32 (the loss needs fp32 logits)."""

    def __init__(self, vocab: int, dim=128, layers=4, heads=4, context=128, init_std=0.02, triton_norm=None):
        super().__init__()
        triton_norm = not kernels.INTERPRETER if triton_norm is None else triton_norm
        norm = RMSNorm if triton_norm else _TorchRMSNorm
        self.context = context
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(context, dim)
        self.blocks = torch.nn.ModuleList(_Block(dim, heads, norm) for _ in range(layers))
        self.norm = norm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=init_std)

    def forward(self, idx):  # (B, T) int64 -> (B, T, vocab) fp32 logits
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)).float()  # logits to fp32 before the softmax of the loss


def windows(ids, batch, context, generator, device):
    """``batch`` random windows of ``ids`` (drawn with ``generator``), as ``(inputs, targets)`` on
    ``device``: ``(batch, context)`` token ids and the same shifted by one."""
    starts = torch.randint(0, ids.numel() - context - 1, (batch,), generator=generator)
    rows = starts[:, None] + torch.arange(context + 1)  # (B, T + 1)
    chunk = ids[rows].to(device)
    return chunk[:, :-1], chunk[:, 1:]


def train_step(model, optimizer, scaler, inputs, targets, autocast_dtype=None, max_norm=1.0):
    """One AMP step in the order that works: forward under autocast, scale, backward, unscale_,
    clip, step (skipped on inf/NaN), update.  ``scaler`` may be None (no loss scaling).
    Returns ``(loss, skipped)``."""
    device_type = inputs.device.type
    with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        logits = model(inputs)  # (B, T, vocab), fp32
    logits = logits.float()  # (..., vocab): the softmax of the loss in fp32
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        return loss.detach(), False
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # before clipping: the norm must be the true gradient's
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    skipped = scaler.found_inf(optimizer)
    scaler.update()
    return loss.detach(), skipped


def keep_state_in(optimizer, dtype):
    """Hold ``optimizer``'s moments (Adam's m and v) in ``dtype`` between steps, with two step hooks:
    before each step they are widened to their parameter's dtype, so the optimizer's arithmetic is
    unchanged; after it they are rounded to ``dtype`` and stored so.  Returns the hooks' handles."""

    def widen(opt, args, kwargs):
        for p, state in opt.state.items():
            for key in MOMENTS:
                if key in state:
                    state[key] = state[key].to(p.dtype)

    def narrow(opt, args, kwargs):
        for state in opt.state.values():
            for key in MOMENTS:
                if key in state:
                    state[key] = state[key].to(dtype)

    return optimizer.register_step_pre_hook(widen), optimizer.register_step_post_hook(narrow)


def zero_v_fraction(optimizer, total):
    """Share of ``total`` parameter elements whose stored Adam v is exactly zero while their m is not."""
    lost = 0
    for state in optimizer.state.values():
        if "exp_avg_sq" in state:
            lost += int(((state["exp_avg_sq"] == 0) & (state["exp_avg"] != 0)).sum())
    return lost / total


def train(
    recipe: str,
    steps=300,
    batch=64,
    lr=3e-3,
    seed=0,
    model_args=None,
    step_fn=None,
    device=None,
    log_every=1,
    optimizer_state_dtype=None,
    prepare=None,
    progress=None,
):
    """Train a :class:`CharTransformer` on the shipped corpus with one of :data:`RECIPES`.

    Returns a dict: ``loss`` (per logged step), ``zero_grad_fraction`` (share of gradient elements
    that are exactly zero after unscaling, per logged step), ``underflow_fraction`` (share of the
    non-zero gradients of the logits, (softmax - onehot) / tokens, that fp16 rounds to zero),
    ``unmoved_fraction`` (share of parameter elements with a non-zero gradient that the step left
    unchanged), ``zero_v_fraction`` (share of parameter elements whose stored AdamW v is exactly
    zero while their m is not), ``skipped`` (steps skipped on
    overflow), ``scale`` (loss scale per logged step) and ``nonfinite_step`` (first step whose loss
    was inf/NaN, or None).  ``step_fn`` replaces :func:`train_step` (same signature).
    ``optimizer_state_dtype``, one of :data:`STATE_DTYPES`, stores AdamW's m and v in that dtype
    between steps (:func:`keep_state_in`); None leaves them in the parameters' dtype.  ``prepare``, a
    function of the model, changes it in place before the optimizer is built (chapter 6 swaps its linear
    layers for FP4 or FP8 ones there).  ``progress``, a function of the dict being filled, is called after
    every logged step (a long run writes its losses so far there)."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {list(RECIPES)}, got {recipe!r}")
    if optimizer_state_dtype is not None and optimizer_state_dtype not in STATE_DTYPES:
        raise ValueError(f"optimizer_state_dtype must be None or one of {STATE_DTYPES}, got {optimizer_state_dtype!r}")
    autocast_dtype, param_dtype, scaling = RECIPES[recipe]
    device = device or default_device()
    step_fn = step_fn or train_step
    ids, vocab = load_corpus()
    torch.manual_seed(seed)
    model = CharTransformer(len(vocab), **(model_args or {})).to(device=device, dtype=param_dtype)
    if prepare is not None:
        prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    if optimizer_state_dtype is not None:
        keep_state_in(optimizer, optimizer_state_dtype)
    scaler = DynamicLossScaler() if scaling else None
    gen = torch.Generator().manual_seed(seed + 1)
    out = {"loss": [], "zero_grad_fraction": [], "underflow_fraction": [], "unmoved_fraction": [], "scale": []}
    out["zero_v_fraction"] = []
    out["skipped"] = 0
    out["nonfinite_step"] = None
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    for step in range(steps):
        x, y = windows(ids, batch, model.context, gen, device)
        before = [p.detach().clone() for p in params]
        loss, skipped = step_fn(model, optimizer, scaler, x, y, autocast_dtype)
        out["skipped"] += int(skipped)
        if out["nonfinite_step"] is None and not math.isfinite(float(loss)):
            out["nonfinite_step"] = step
        if step % log_every == 0 or step == steps - 1:
            with torch.no_grad():
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                zero = sum(int((g == 0).sum()) for g in grads)
                live = sum(int((g != 0).sum()) for g in grads)
                unmoved = sum(int(((p == b) & (g != 0)).sum()) for p, b, g in zip(params, before, grads, strict=True))
                with torch.autocast(x.device.type, dtype=autocast_dtype or torch.float32, enabled=bool(autocast_dtype)):
                    logits = model(x)  # (B, T, vocab) fp32
                d = torch.softmax(logits, -1) - torch.nn.functional.one_hot(y, logits.shape[-1])
                d = d / y.numel()  # the gradient of the mean cross-entropy with respect to the logits
                out["underflow_fraction"].append(float(((d != 0) & (d.half() == 0)).sum() / (d != 0).sum()))
            out["loss"].append(float(loss))
            out["zero_grad_fraction"].append(zero / total)
            out["unmoved_fraction"].append(unmoved / max(live, 1) if not skipped else float("nan"))
            out["scale"].append(scaler.get_scale() if scaler else 1.0)
            out["zero_v_fraction"].append(zero_v_fraction(optimizer, total))
            if progress is not None:
                progress(out)
    out["steps"] = list(range(0, steps, log_every)) + ([steps - 1] if (steps - 1) % log_every else [])
    return out


__all__ = [
    "CORPUS",
    "CharTransformer",
    "MOMENTS",
    "RECIPES",
    "STATE_DTYPES",
    "keep_state_in",
    "load_corpus",
    "train",
    "train_step",
    "windows",
    "zero_v_fraction",
]
