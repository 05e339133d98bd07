"""Fine-tuning a pretrained checkpoint in FP8, where the data changes at the first step: measured.

Chapter 5 (FP8 fine-tuning); no lab.  Entry points: :func:`pretrain`, :func:`finetune`, :func:`cipher`,
:func:`catch_up_step`, :data:`RECIPES`.

:func:`pretrain` trains :class:`kernels.charmodel.CharTransformer` on the shipped corpus in bf16
(autocast, fp32 weights and AdamW state) and returns its state_dict, the checkpoint.
:func:`finetune` trains a copy of it on other data with one of :data:`RECIPES`: bf16, or the GEMM
layers of the blocks swapped to :class:`kernels.fp8_linear.FP8Linear` with per-tensor current or
delayed scaling (the output head stays bf16).  The delayed run starts from histories filled on the
pretraining data, the state that a checkpoint saved by an FP8 pretraining run carries
(``FP8Linear``'s ``state_dict``), so that its first fine-tuning step is scaled for the old data.

The new data is :func:`cipher` of the corpus: every character replaced by another under a fixed
permutation.  The text keeps all its structure up to the names of its characters, so the model can
learn it again, but at the first step everything it predicts is wrong: the abrupt change of a
fine-tuning run, in its plainest form.

Per step, the FP8 runs log for each operand role (``x``, ``w``, ``dy``, over all FP8 layers) the share
of values that saturate (``|v| / S`` above the format's largest code: clipped) and the share of the
nonzero values whose code is zero (flushed).  The counts are taken by hooks on the layers, with the
scale the layer uses at that step: its own amax with current scaling, the history's with delayed
scaling (:func:`kernels.fp8_linear.tensor_operand`'s rule, run on a copy of the history, so that
measuring changes nothing), and the package's reference quantizer.
"""

import copy

import torch

from kernels import charmodel
from kernels import fp8_linear as L
from kernels import quantize as Q
from kernels.device import default_device

RECIPES = ("bf16", "fp8 current", "fp8 delayed")
ROLES = ("x", "w", "dy")
_SCALING = {"fp8 current": "current", "fp8 delayed": "delayed"}
# A scaled value beyond this is clipped, not rounded, to the largest code: FP8_MAX plus half the spacing
# of the codes in the top binade (464 for e4m3, 61440 for e5m2).
_CLIP = {f: Q.FP8_MAX[f] + 2.0 ** Q.EMAX_ELEM[f] * torch.finfo(t).eps / 2 for f, t in Q.FP8_FORMATS.items()}


def cipher(ids: torch.Tensor, vocab_size: int, seed: int = 0) -> torch.Tensor:
    """``ids`` with every character id replaced under a fixed random permutation of ``vocab_size`` ids."""
    perm = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))
    return perm[ids]


def _model(vocab_size, model_args, device):
    return charmodel.CharTransformer(vocab_size, **(model_args or {})).to(device)


def pretrain(steps=200, batch=32, lr=3e-3, seed=0, model_args=None, device=None):
    """Train a :class:`~kernels.charmodel.CharTransformer` on the shipped corpus in bf16 (autocast,
    fp32 weights).  Returns ``(state_dict, losses)``."""
    device = device or default_device()
    ids, vocab = charmodel.load_corpus()
    torch.manual_seed(seed)
    model = _model(len(vocab), model_args, device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        x, y = charmodel.windows(ids, batch, model.context, gen, device)
        loss, _ = charmodel.train_step(model, opt, None, x, y, torch.bfloat16)
        losses.append(float(loss))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def _scale(layer, role, v, fmt):
    """The scale ``layer`` quantizes ``v`` with in this step, read without touching its history."""
    if layer.states is None:
        return Q.quantize_tensor_reference(v, fmt).s
    return L.delayed_scale(copy.deepcopy(layer.states[role]), v.reshape(-1, v.shape[-1]))


class _Counter:
    """Hooks on every FP8Linear of a model that count, per role, saturated and flushed values."""

    def __init__(self, model):
        self.handles = []
        self.reset()
        for m in model.modules():
            if isinstance(m, L.FP8Linear):
                self.handles.append(m.register_forward_pre_hook(self._forward))
                self.handles.append(m.register_full_backward_pre_hook(self._backward))

    def reset(self):
        # per role: saturated, elements, flushed, nonzero, and the largest amax / (FP8_MAX * S) of a layer
        self.counts = {role: [0, 0, 0, 0, 0.0] for role in ROLES}

    def _count(self, layer, role, v, fmt):
        v = v.detach()
        s = _scale(layer, role, v, fmt)
        q = Q.quantize_tensor_with_scale_reference(v, s, fmt)
        scaled = v.float().abs() * (1.0 / s.float())
        c = self.counts[role]
        c[0] += int((scaled > _CLIP[fmt]).sum())
        c[1] += v.numel()
        c[2] += int(((v != 0) & (q.float() == 0)).sum())
        c[3] += int((v != 0).sum())
        c[4] = max(c[4], float(scaled.max()) / Q.FP8_MAX[fmt])

    def _forward(self, layer, args):
        self._count(layer, "x", args[0], layer.recipe.fwd_fmt)
        self._count(layer, "w", layer.weight, layer.recipe.fwd_fmt)

    def _backward(self, layer, grad_output):
        self._count(layer, "dy", grad_output[0], layer.recipe.grad_fmt)

    def shares(self):
        return {role: (c[0] / max(c[1], 1), c[2] / max(c[3], 1), c[4]) for role, c in self.counts.items()}

    def remove(self):
        for h in self.handles:
            h.remove()


def finetune(
    checkpoint,
    recipe: str,
    steps=30,
    batch=32,
    lr=1e-3,
    seed=0,
    model_args=None,
    history_len=16,
    device=None,
    cipher_seed=0,
):
    """Fine-tune a copy of ``checkpoint`` (from :func:`pretrain`, same ``model_args``) on
    :func:`cipher` of the corpus with one of :data:`RECIPES`, the same batches for every recipe.

    The FP8 recipes swap every GEMM layer of the blocks to :class:`~kernels.fp8_linear.FP8Linear`
    (per-tensor scales, E4M3 activations and weights, E5M2 gradients; the head stays bf16).  With
    ``"fp8 delayed"`` the amax histories (``history_len``) are first filled by ``history_len``
    forward and backward passes on pretraining batches, without updates: the histories a delayed-
    scaling pretraining run would have saved with the checkpoint.

    Returns a dict of per-step lists: ``loss``, and for the FP8 recipes ``saturated_{x,w,dy}`` (share
    of the role's values, over all FP8 layers, beyond the largest code under the step's scale) and
    ``flushed_{x,w,dy}`` (share of the nonzero values whose code is zero) and ``amax_ratio_{x,w,dy}``
    (the largest, over the FP8 layers, of the tensor's amax over the amax its scale covers, ``FP8_MAX *
    S``: 1 with current scaling, above 1 where delayed scaling saturates)."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {list(RECIPES)}, got {recipe!r}")
    device = device or default_device()
    ids, vocab = charmodel.load_corpus()
    torch.manual_seed(seed)
    model = _model(len(vocab), model_args, device)
    model.load_state_dict(checkpoint)
    out = {"loss": []}
    counter = None
    if recipe != "bf16":
        fp8 = L.FP8Recipe(scaling=_SCALING[recipe], history_len=history_len)
        L.swap_linears(model, fp8, skip=lambda name, m: name == "head", min_features=0)
        if fp8.scaling == "delayed":
            gen = torch.Generator().manual_seed(seed + 2)
            for _ in range(history_len):
                x, y = charmodel.windows(ids, batch, model.context, gen, device)
                with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                    logits = model(x)  # (B, T, vocab) fp32
                torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
            model.zero_grad(set_to_none=True)
        counter = _Counter(model)
        for role in ROLES:
            out[f"saturated_{role}"], out[f"flushed_{role}"], out[f"amax_ratio_{role}"] = [], [], []
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    new = cipher(ids, len(vocab), cipher_seed)
    gen = torch.Generator().manual_seed(seed + 3)
    for _ in range(steps):
        x, y = charmodel.windows(new, batch, model.context, gen, device)
        if counter is not None:
            counter.reset()
        loss, _ = charmodel.train_step(model, opt, None, x, y, torch.bfloat16)
        out["loss"].append(float(loss))
        if counter is not None:
            for role, (sat, flush, ratio) in counter.shares().items():
                out[f"saturated_{role}"].append(sat)
                out[f"flushed_{role}"].append(flush)
                out[f"amax_ratio_{role}"].append(ratio)
    if counter is not None:
        counter.remove()
    return out


def catch_up_step(run: dict):
    """The first step of an FP8 run (:func:`finetune`'s result) at which no value of any role saturates:
    where the scales cover the tensors again after the shift.  None if every step saturates some."""
    for step in range(len(run["loss"])):
        if all(run[f"saturated_{role}"][step] == 0 for role in ROLES):
            return step
    return None


__all__ = ["RECIPES", "ROLES", "catch_up_step", "cipher", "finetune", "pretrain"]
