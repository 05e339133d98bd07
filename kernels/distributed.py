"""Mixed precision and FP8 beyond one device: FSDP2 (``torch.distributed.fsdp.fully_shard``) on N ranks.

Chapter 5 (section 6, beyond one GPU); no lab.  Entry points: :func:`launch` (run a function on N processes),
:func:`shard` (a model under FSDP2 with a mixed-precision policy), :func:`fp8_all_gather` (FSDP2 gathers
FP8Linear weights as FP8 codes), :func:`agree_amax` (delayed scaling's histories kept equal on every rank),
:func:`count_collectives` (bytes moved by each collective), :func:`state_bytes` (what each rank holds), and
the experiments the chapter prints (:func:`reduction_experiment`, :func:`training_experiment`,
:func:`fp8_gather_experiment`, :func:`amax_experiment`).

The sharding is PyTorch's own: ``fully_shard`` keeps each parameter as a DTensor sharded by rows over
the ranks (its master copy, in the dtype it was made in), all-gathers a layer's parameters before the
layer runs (cast to ``param_dtype``), frees them after, and reduce-scatters the gradients (cast to
``reduce_dtype``), so each rank keeps and updates only its shard.  Nothing here shards by hand.

Two ways a weight can travel: in ``param_dtype`` (bf16: 2 bytes an element), or, for an
:class:`~kernels.fp8_linear.FP8Linear` with one scale per tensor, as the FP8 codes the layer would have
made after the gather (1 byte an element, and 4 for the scale).  The second uses FSDP2's extension point
for tensor subclasses (``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``): each rank quantizes its own
shard before the gather, with a scale from the amax of the *whole* weight (the shards' maxima, all-reduced
with MAX), so the gathered codes are bit for bit those of quantizing the gathered bf16 weight.  With each
rank's own amax instead (``agree=False``), every shard has its own scale and the gathered codes are read
with one of them: a weight that no rank holds.

Processes: :func:`launch` starts N fresh Pythons (``python -m kernels.distributed``, one per rank, as
``torchrun --nproc-per-node N`` would), joined with the gloo backend on CPU (a laptop, CI; every worker
runs the package in CPU mode, so the FP8 numbers are compiled Hopper's on either lane) or NCCL with one
GPU per rank.
"""

import contextlib
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

BACKENDS = ("gloo", "nccl")

# -- processes ----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(job: str, rank: int) -> None:
    """One rank of :func:`launch` (``python -m kernels.distributed JOB RANK``): join the group, run the
    function, save what it returned next to the job."""
    import importlib

    spec = torch.load(job, weights_only=False)
    fn = importlib.import_module(spec["module"])
    for part in spec["name"].split("."):
        fn = getattr(fn, part)
    if spec["backend"] == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        spec["backend"],
        init_method=spec["init"],
        rank=rank,
        world_size=spec["world_size"],
        timeout=timedelta(minutes=5),
    )
    try:
        result = fn(rank, spec["world_size"], *spec["args"])
        torch.save(result, os.path.join(os.path.dirname(job), f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def can_launch() -> bool:
    """Whether :func:`launch` may start processes here: not inside the batch grader's sandbox, which
    refuses every new process (a lab's demonstration checks this and skips itself)."""
    return os.environ.get("KERNELS_GRADING") != "1"


def launch(fn, world_size: int = 2, args: tuple = (), backend: str = "gloo", timeout_s: float = 900) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes joined in one process group, and
    return what each returned (a list by rank; arguments and results travel through ``torch.save``).

    ``backend="gloo"`` runs on CPU: each worker imports the package in CPU mode (``KERNELS_INTERPRET=1``),
    whatever the caller runs on.  ``"nccl"`` puts rank r on GPU r and needs ``world_size`` GPUs.  ``fn``
    must be defined at the top level of an importable module: each worker is a fresh Python
    (``python -m kernels.distributed``) that imports it, as ``torchrun`` would.  A worker that fails stops
    the others, and its error is raised here with the end of its output."""
    if not can_launch():
        raise RuntimeError("launch starts processes, which the grader's sandbox refuses: check can_launch() first")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"backend='nccl' runs one rank per GPU: world_size={world_size} needs {world_size} GPUs, "
            f"this machine has {torch.cuda.device_count()}; use backend='gloo' (CPU processes)"
        )
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", repr(fn))
    if module in (None, "__main__", "__mp_main__") or "<locals>" in name:
        raise ValueError(
            f"fn must be a function defined at the top level of an importable module (each worker imports "
            f"it); {name!r} is defined in {module!r}"
        )
    env = {**os.environ, "KERNELS_INTERPRET": "1" if backend == "gloo" else "0"}
    # The caller's import path, so that the workers find what it finds (a test module, a lab's folder).
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p))
    with tempfile.TemporaryDirectory() as out:
        job = os.path.join(out, "job.pt")
        init = f"tcp://127.0.0.1:{_free_port()}"
        spec = {"module": module, "name": name, "args": tuple(args), "backend": backend, "init": init}
        torch.save({**spec, "world_size": world_size}, job)
        logs = [open(os.path.join(out, f"{r}.log"), "wb") for r in range(world_size)]  # noqa: SIM115
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "kernels.distributed", job, str(r)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for r, log in enumerate(logs)
        ]
        failed = _wait(procs, timeout_s)
        for log in logs:
            log.close()
        if failed is not None:
            rank, code = failed
            tail = open(os.path.join(out, f"{rank}.log"), errors="replace").read()[-3000:]
            raise RuntimeError(f"rank {rank} of {world_size} exited with {code} running {name}:\n{tail}")
        return [torch.load(os.path.join(out, f"{r}.pt"), weights_only=False) for r in range(world_size)]


def _wait(procs, timeout_s) -> tuple | None:
    """Wait for every process; on the first failure (or past ``timeout_s``) stop the rest.  Returns
    ``(rank, exit code)`` of the failure, or None."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                return bad[0]
            if all(c == 0 for c in codes):
                return None
            if time.monotonic() > deadline:
                return next(r for r, c in enumerate(codes) if c is None), f"a timeout ({timeout_s} s)"
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def device() -> torch.device:
    """This rank's device: its GPU under NCCL, the CPU under gloo (and outside a process group)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# -- counting what crosses the wire -------------------------------------------------------------------

# The names differ between PyTorch releases (all_gather_into_tensor, all_gather_single, ...); FSDP2 calls
# them as attributes of torch.distributed, so wrapping those attributes sees every call.
_COLLECTIVES = {
    "all_gather_into_tensor": ("all-gather", 0),
    "all_gather_single": ("all-gather", 0),
    "reduce_scatter_tensor": ("reduce-scatter", 1),
    "reduce_scatter_single": ("reduce-scatter", 1),
    "all_reduce": ("all-reduce", 0),
}


@contextlib.contextmanager
def count_collectives():
    """Count the collectives this rank calls inside the block: yields a dict ``kind -> {"calls",
    "bytes"}``, ``bytes`` being the size of the whole tensor a collective produces (all-gather: the
    gathered tensor; reduce-scatter: the full tensor before it is scattered; all-reduce: the tensor).  A
    ring sends ``(N-1)/N`` of that from each of the N ranks."""
    counts = {}
    originals = {}

    def wrap(name, kind, arg):
        original = getattr(dist, name)

        def counted(*args, **kwargs):
            t = args[arg] if len(args) > arg else kwargs.get(("output_tensor", "input")[arg], kwargs.get("tensor"))
            entry = counts.setdefault(kind, {"calls": 0, "bytes": 0})
            entry["calls"] += 1
            entry["bytes"] += t.numel() * t.element_size()
            return original(*args, **kwargs)

        return original, counted

    for name, (kind, arg) in _COLLECTIVES.items():
        if hasattr(dist, name):
            originals[name], counted = wrap(name, kind, arg)
            setattr(dist, name, counted)
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


# -- FSDP2 with a mixed-precision policy ----------------------------------------------------------------


def shard(model: torch.nn.Module, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, mesh=None):
    """``fully_shard`` every Linear of ``model`` (one all-gather each), then the model itself (the rest:
    embeddings, positions), with ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``; norms are units of
    their own whose weights stay in their dtype.  The parameters stay in the dtype they were made in (the
    master copy, sharded); the layers compute in ``param_dtype``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if mesh is None:
        mesh = init_device_mesh(device().type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    # Norms keep their fp32 weights, as under autocast (chapter 4): a unit of their own whose parameters
    # are not cast.
    wide = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=reduce_dtype)
    for m in list(model.modules()):
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh, mp_policy=policy)
        elif isinstance(m, (torch.nn.RMSNorm, torch.nn.LayerNorm)) and any(True for _ in m.parameters()):
            fully_shard(m, mesh=mesh, mp_policy=wide)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a sharded parameter or gradient (a collective: every rank must call it)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Bytes this rank holds between steps: its shards of the parameters, of their gradients and of the
    optimizer's state (``"params"``, ``"grads"``, ``"optimizer"``), and the number of parameters."""

    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    out = {"params": 0, "grads": 0, "optimizer": 0, "numel": 0}
    for p in model.parameters():
        out["params"] += local(p)
        out["numel"] += p.numel()
        if p.grad is not None:
            out["grads"] += local(p.grad)
        for v in optimizer.state.get(p, {}).values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                out["optimizer"] += local(v)
    return out


# -- FP8 all-gather of weights ------------------------------------------------------------------------

_VIEW_OPS = (
    torch.ops.aten.detach.default,
    torch.ops.aten.alias.default,
    torch.ops.aten.as_strided.default,
    torch.ops.aten.view.default,
)


class FP8GatheredWeight(torch.Tensor):
    """The unsharded weight FSDP2 hands to the layer after an FP8 all-gather: it reads as a ``dtype``
    tensor of the weight's shape, and carries the codes ``q`` and scale ``s``, which
    :class:`~kernels.fp8_linear.FP8Linear` uses as its weight operand instead of quantizing again
    (:meth:`fp8_operand`).  Any other operation sees the dequantized weight ``S * q``."""

    @staticmethod
    def __new__(cls, q, s, fmt, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, q.shape, strides=q.stride(), dtype=dtype, device=q.device)

    def __init__(self, q, s, fmt, dtype):
        self.q, self.s, self.fmt = q, s, fmt

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        kwargs = kwargs or {}
        if func in _VIEW_OPS:  # FSDP2 views the gathered tensor as the parameter: keep the codes
            t = args[0]
            return cls(func(t.q, *args[1:], **kwargs), t.s, t.fmt, t.dtype)

        def dequantized(t):
            return (t.q.float() * t.s).to(t.dtype) if isinstance(t, FP8GatheredWeight) else t

        return func(*tree_map(dequantized, args), **tree_map(dequantized, kwargs))

    def fp8_operand(self, fmt: str):
        from kernels.quantize import Quantized

        if fmt != self.fmt:
            raise ValueError(f"the weight was gathered as {self.fmt} codes; the layer's recipe wants {fmt}")
        return Quantized(self.q, self.s)

    def __repr__(self):
        return f"FP8GatheredWeight(shape={tuple(self.shape)}, fmt={self.fmt}, s={self.s.item():.4g})"


class FP8ShardedWeight(torch.Tensor):
    """A weight parameter (its master copy, any float dtype) that FSDP2 all-gathers as FP8 codes.

    Behaves as the tensor it wraps (the optimizer updates it in place).  Before each all-gather
    (``fsdp_pre_all_gather``), this rank's shard is cast to the policy's ``param_dtype`` (the bits a bf16
    all-gather would send), its amax is all-reduced with MAX over the ranks (``agree=True``) and the shard
    is quantized with the scale of that amax; after it (``fsdp_post_all_gather``), the codes become an
    :class:`FP8GatheredWeight`."""

    @staticmethod
    def __new__(cls, data, fmt="e4m3", agree=True):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            strides=data.stride(),
            dtype=data.dtype,
            device=data.device,
            requires_grad=data.requires_grad,
        )

    def __init__(self, data, fmt="e4m3", agree=True):
        self._data, self.fmt, self.agree = data, fmt, agree

    __torch_function__ = torch._C._disabled_torch_function_impl

    # Operations whose results are the parameter again (views, copies, FSDP2's sharding): keep the wrapper.
    _KEEP = {
        *_VIEW_OPS,
        torch.ops.aten.slice.Tensor,
        torch.ops.aten.split.Tensor,
        torch.ops.aten.chunk.default,
        torch.ops.aten.clone.default,
        torch.ops.aten.empty_like.default,
        torch.ops.aten.new_zeros.default,
        torch.ops.aten._to_copy.default,
        torch.ops.aten.copy_.default,
        torch.ops.aten.view.dtype,
        torch.ops.aten.constant_pad_nd.default,
        torch.ops.aten._pin_memory.default,
    }

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        kwargs = kwargs or {}
        first = next(a for a in (*args, *kwargs.values()) if isinstance(a, FP8ShardedWeight))

        def unwrap(t):
            return t._data if isinstance(t, FP8ShardedWeight) else t

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if func not in cls._KEEP:
            return out

        def wrap(t):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not isinstance(t, FP8ShardedWeight):
                return cls(t, first.fmt, first.agree)
            return t

        return tree_map(wrap, out)

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        from kernels import fp8_ops as ops

        x = self._data.to(mp_policy.param_dtype or self._data.dtype)
        amax = ops.tensor_amax(x)
        if self.agree:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group())
        s = ops.scale_from_amax(amax, self.fmt)
        q = ops.quantize_tensor_with_scale(x, s, self.fmt)
        return (q.view(torch.uint8),), (s, self.fmt)

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        (data,), (s, fmt) = outputs, metadata
        codes = data.view(torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2)
        if out is not None:  # the same storage is reused from the second gather on: refresh the scale
            out.s, out.q = s, codes.view(out.q.shape) if codes.dim() == 1 else codes
            return
        return FP8GatheredWeight(codes, s, fmt, param_dtype), (data,)

    def __repr__(self):
        return f"FP8ShardedWeight({self._data!r}, fmt={self.fmt}, agree={self.agree})"


def fp8_all_gather(model: torch.nn.Module, agree: bool = True) -> torch.nn.Module:
    """Make FSDP2 gather every :class:`~kernels.fp8_linear.FP8Linear` weight of ``model`` as FP8 codes
    (call before :func:`shard`).  Only layers with one scale per tensor and current scaling qualify (a
    per-row or per-block scale is not the gathered weight's, and a delayed weight scale would need the
    history on every rank); others raise.  ``agree=False`` quantizes each shard with its own amax: the
    wrong way, to see what goes wrong.  Returns ``model``."""
    from kernels.fp8_linear import FP8Linear

    found = 0
    for name, m in model.named_modules():
        if isinstance(m, FP8Linear):
            r = m.recipe
            if r.granularity != "tensor" or r.scaling != "current":
                raise ValueError(
                    f"{name}: FP8 all-gather needs granularity='tensor' and scaling='current', the recipe "
                    f"has granularity={r.granularity!r}, scaling={r.scaling!r}"
                )
            w = m.weight
            m.weight = torch.nn.Parameter(FP8ShardedWeight(w.detach(), r.fwd_fmt, agree), requires_grad=w.requires_grad)
            found += 1
    if not found:
        raise ValueError("model has no FP8Linear layer: swap its Linears first (kernels.fp8_linear.swap_linears)")
    return model


# -- delayed scaling across ranks -----------------------------------------------------------------------


def fp8_gather_codes(shards: list, fmt: str = "e4m3") -> tuple:
    """What an FP8 all-gather of one weight delivers, computed in one process (Lab 5 q7's answer): the
    ranks' shards (blocks of rows, in rank order) each quantized with the scale of their agreed amax (the
    maximum of the shards' amaxes), the codes concatenated.  Returns ``(codes, scale)``."""
    from kernels import fp8_ops as ops

    if not shards:
        raise ValueError("shards must name at least one rank's shard")
    amax = torch.stack([ops.tensor_amax(t) for t in shards]).max()  # on real ranks: all_reduce(MAX)
    s = ops.scale_from_amax(amax, fmt)
    return torch.cat([ops.quantize_tensor_with_scale(t, s, fmt) for t in shards]), s


def agree_amax(model: torch.nn.Module, group=None) -> torch.nn.Module:
    """Make every delayed-scaling history of ``model``'s FP8Linear layers the same on every rank: each
    new amax is all-reduced with MAX over ``group`` (default: all ranks) before it enters the history,
    so all ranks compute the scale of the global batch (what one process on the whole batch would).
    One small all-reduce per tensor role and layer a step (Transformer Engine reduces them in one)."""
    from kernels.fp8_linear import FP8Linear

    found = 0
    for m in model.modules():
        if isinstance(m, FP8Linear) and m.states:
            for state in m.states.values():
                state.group = group if group is not None else dist.group.WORLD
            found += 1
    if not found:
        raise ValueError("model has no FP8Linear layer with delayed scaling (FP8Recipe(scaling='delayed'))")
    return model


__all__ = [
    "BACKENDS",
    "FP8GatheredWeight",
    "FP8ShardedWeight",
    "agree_amax",
    "can_launch",
    "chapter_model",
    "count_collectives",
    "device",
    "fp8_all_gather",
    "fp8_gather_codes",
    "full",
    "launch",
    "shard",
    "state_bytes",
    "with_outlier",
]


# -- the chapter's experiments (per-rank functions for launch) -------------------------------------------

SETUP = {"vocab": 64, "context": 8, "dim": 64, "depth": 2, "batch": 32, "lr": 3e-3, "seed": 0}


def chapter_model(fp8_recipe=None, seed=SETUP["seed"]):
    """The chapter's model, :class:`~kernels.fp8_linear.MarkovLM`, with fp32 parameters (FSDP2's master
    copy) on this rank's device; its block GEMMs in FP8 with ``fp8_recipe``."""
    from kernels.fp8_linear import MarkovLM

    torch.manual_seed(seed)
    s = SETUP
    return MarkovLM(s["vocab"], s["context"], s["dim"], s["depth"], fp8_recipe, device=device(), dtype=torch.float32)


def _batches(steps, world_size, seed=SETUP["seed"]):
    """The global batches (``world_size * batch`` windows each), the same on every rank and for every run."""
    from kernels.fp8_linear import markov_batch, markov_source

    probs, _ = markov_source(SETUP["vocab"], seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    return [markov_batch(probs, SETUP["batch"] * world_size, SETUP["context"], gen) for _ in range(steps)]


def _local(batch, rank):
    idx, target = batch
    b = SETUP["batch"]
    return idx[rank * b : (rank + 1) * b].to(device()), target[rank * b : (rank + 1) * b].to(device())


def _loss(model, idx, target):
    return torch.nn.functional.cross_entropy(model(idx), target)


def _grads(model) -> list:
    return [full(p.grad).detach().float().cpu() for p in model.parameters()]


def _compute_copy(model):
    """A plain (unsharded) copy of ``model`` as FSDP2 computes with it under :func:`shard`'s policy: bf16
    parameters, norms in fp32."""
    import copy

    plain = copy.deepcopy(model)
    for m in plain.modules():
        if not isinstance(m, (torch.nn.RMSNorm, torch.nn.LayerNorm)):
            for p in m.parameters(recurse=False):
                p.data = p.data.to(torch.bfloat16)
    return plain


def reduction_experiment(rank, world_size):
    """One step of the chapter's model on this rank's quarter (half, ...) of a global batch: the gradient
    this rank computes (bf16, before any reduction), and the reduced gradients FSDP2 hands back with
    ``reduce_dtype`` fp32 and bf16 (whole tensors, fp32).  :func:`reduction_errors` compares them."""
    idx, target = _local(_batches(1, world_size)[0], rank)
    plain = _compute_copy(chapter_model())
    _loss(plain, idx, target).backward()
    out = {"local": [p.grad.detach().float().cpu() for p in plain.parameters()]}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = shard(chapter_model(), reduce_dtype=dtype)
        _loss(model, idx, target).backward()
        out[name] = _grads(model)
    return out


def _relative(a: list, b: list) -> float:
    num = math.sqrt(sum(float((x.double() - y.double()).square().sum()) for x, y in zip(a, b, strict=True)))
    return num / math.sqrt(sum(float(y.double().square().sum()) for y in b))


def reduction_errors(world_sizes=(2, 4)) -> dict:
    """``{N: {"fp32": e, "bf16": e}}``: the relative (Frobenius) error of the gradient FSDP2 reduces over N
    ranks, against the exact (float64) mean of the N ranks' own gradients, i.e. the error of the reduction
    alone."""
    out = {}
    for n in world_sizes:
        results = launch(reduction_experiment, n)
        exact = [sum(r["local"][i].double() for r in results) / n for i in range(len(results[0]["local"]))]
        out[n] = {k: _relative(results[0][k], exact) for k in ("fp32", "bf16")}
    return out


def _mean_over_ranks(x: torch.Tensor) -> float:
    t = x.detach().float().reshape(1).clone()
    dist.all_reduce(t)  # gloo has no AVG: sum, then divide
    return float(t) / dist.get_world_size()


def _train(model, rank, world_size, steps) -> tuple:
    """``steps`` AdamW steps of ``model`` on this rank's share of the global batches: (optimizer, the
    loss tensors of this rank).  The losses are left on the device: averaging them over the ranks is a
    collective of its own, for after the steps (see :func:`_mean_over_ranks`)."""
    opt = torch.optim.AdamW(model.parameters(), lr=SETUP["lr"], weight_decay=0.0)
    losses = []
    for batch in _batches(steps, world_size):
        loss = _loss(model, *_local(batch, rank))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return opt, losses


def _single_process(steps, world_size, mixed: bool) -> tuple:
    """The reference runs on one process and the whole global batch: fp32 throughout, or (``mixed``) in
    bf16 with fp32 master weights and AdamW state (what FSDP2 computes on one rank).  Returns (losses,
    final fp32 parameters)."""
    model = chapter_model()
    master = list(model.parameters())
    net = model
    if mixed:
        net = _compute_copy(model)
        master = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=SETUP["lr"], weight_decay=0.0)
    losses = []
    for idx, target in _batches(steps, world_size):
        loss = _loss(net, idx.to(device()), target.to(device()))
        net.zero_grad(set_to_none=True)
        loss.backward()
        if mixed:
            for p, m in zip(net.parameters(), master, strict=True):
                m.grad = p.grad.float()
        opt.step()
        if mixed:
            with torch.no_grad():
                for p, m in zip(net.parameters(), master, strict=True):
                    p.copy_(m)
        losses.append(float(loss))
    return losses, [m.detach().float().cpu().clone() for m in master]


REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def training_experiment(rank, world_size, steps, reductions=tuple(REDUCE_DTYPES)):
    """Train the chapter's model under FSDP2 (bf16 compute, fp32 master shards and AdamW state) for
    ``steps`` steps on global batches split over the ranks, once per gradient reduction dtype in
    ``reductions`` (names of :data:`REDUCE_DTYPES`).  Returns, for each: the loss of each step (the global
    batch's), the final parameters (whole), and what this rank holds (:func:`state_bytes`)."""
    out = {}
    for name in reductions:
        model = shard(chapter_model(), reduce_dtype=REDUCE_DTYPES[name])
        opt, losses = _train(model, rank, world_size, steps)
        out[name] = {
            "losses": [_mean_over_ranks(x) for x in losses],
            "params": [full(p).detach().float().cpu() for p in model.parameters()],
            "held": state_bytes(model, opt),
        }
    return out


def reference_experiment(rank, world_size, steps, ranks):
    """:func:`_single_process` for the global batches of ``ranks`` ranks, fp32 and mixed (run on one
    process: ``world_size`` 1)."""
    return {name: _single_process(steps, ranks, mixed) for name, mixed in (("fp32", False), ("bf16", True))}


def training_drift(steps=100, world_size=2) -> dict:
    """Train the same model from the same seed on the same global batches: on one process in fp32 (the
    reference) and in bf16 with fp32 masters, and under FSDP2 over ``world_size`` ranks with gradients
    reduced in fp32 and in bf16.  Returns ``{"runs": {run: {"loss": last loss, "drift": |theta -
    theta_ref| / |theta_ref|}}, "held": {kind: bytes per parameter one rank holds}}``."""
    ref = launch(reference_experiment, 1, (steps, world_size))[0]
    fsdp = launch(training_experiment, world_size, (steps,))[0]
    truth = ref["fp32"][1]
    runs = {f"one process, {k}": {"loss": v[0][-1], "drift": _relative(v[1], truth)} for k, v in ref.items()}
    for k, v in fsdp.items():
        runs[f"FSDP2 x{world_size}, reduce {k}"] = {"loss": v["losses"][-1], "drift": _relative(v["params"], truth)}
    held = fsdp["fp32"]["held"]
    return {"runs": runs, "held": {k: v / held["numel"] for k, v in held.items() if k != "numel"}}


OUTLIER = 0.5  # one weight of the first up-projection, in the rows the last rank holds (the rest are < 0.13)
GATHERS = ("bf16", "fp8", "fp8, own scales")


def with_outlier(model):
    """``model`` (the chapter's) with one weight of its first up-projection set to :data:`OUTLIER`, in the
    rows that the last rank holds."""
    with torch.no_grad():
        w = model.ups[0].weight
        w[w.shape[0] - 1, 3] = OUTLIER
    return model


def fp8_gather_experiment(rank, world_size, steps, gathers=GATHERS):
    """Train the chapter's model with FP8Linear blocks (one scale per tensor) under FSDP2 for ``steps``
    steps, once per way of gathering the weights in ``gathers``: as bf16 (``"bf16"``: the layer quantizes
    after the gather), as FP8 codes with an agreed scale (``"fp8"``) or with each shard's own scale
    (``"fp8, own scales"``); one weight is an outlier (:data:`OUTLIER`).  Returns, for each: the losses,
    the final gradients (whole), the calls and bytes of each collective per step, and the first
    up-projection's weight as the layer saw it at the first step (dequantized) with the bf16 weight it
    stands for."""
    from kernels import fp8_ops as ops
    from kernels.fp8_linear import FP8Recipe

    out = {}
    for gather in gathers:
        if gather not in GATHERS:
            raise ValueError(f"gathers must be among {list(GATHERS)}, got {gather!r}")
        model = with_outlier(chapter_model(FP8Recipe()))
        truth = model.ups[0].weight.detach().to(torch.bfloat16).float().cpu()
        if gather != "bf16":
            fp8_all_gather(model, agree=gather == "fp8")
        shard(model)
        seen = []

        def look(module, args, seen=seen):
            if not seen:
                w = module.weight
                # gathered in bf16: what the layer's own quantizer makes of it
                q, s = (w.q, w.s) if isinstance(w, FP8GatheredWeight) else ops.quantize_tensor(w.detach(), "e4m3")
                seen.append((q.float() * s).cpu())

        handle = model.ups[0].register_forward_pre_hook(look)
        with count_collectives() as counts:  # FSDP2's collectives (and the amax all-reduces), nothing else
            _, losses = _train(model, rank, world_size, steps)
        handle.remove()
        out[gather] = {
            "losses": [_mean_over_ranks(x) for x in losses],
            "grads": _grads(model),
            "collectives": {k: {"calls": v["calls"] / steps, "bytes": v["bytes"] / steps} for k, v in counts.items()},
            "seen": seen[0],
            "truth": truth,
        }
    return out


def amax_experiment(rank, world_size, steps, agreements=(True, False)):
    """Train with delayed scaling (``FP8Recipe(scaling="delayed")``) under FSDP2 for ``steps`` steps, each
    rank on its share of the global batch, once with the amaxes all-reduced (``True`` in ``agreements``)
    and once with each rank's own (``False``).  Returns, for each: every FP8Linear's histories (role ->
    history) on this rank, and the losses."""
    from kernels.fp8_linear import FP8Linear, FP8Recipe

    out = {}
    for agree in agreements:
        model = chapter_model(FP8Recipe(scaling="delayed"))
        if agree:
            agree_amax(model)
        shard(model)
        _, losses = _train(model, rank, world_size, steps)
        histories = {
            name: {k: v.detach().cpu().clone() for k, v in m.amax_histories().items()}
            for name, m in model.named_modules()
            if isinstance(m, FP8Linear)
        }
        out[agree] = {"histories": histories, "losses": [_mean_over_ranks(x) for x in losses]}
    return out


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]))


def step_time_experiment(rank, world_size, steps, gathers=("bf16", "fp8"), dim=4096, depth=4, batch=4096):
    """Time a training step of a wide :class:`~kernels.fp8_linear.MarkovLM` (``depth`` FP8 blocks of
    width ``dim``, ``batch`` windows a rank) under FSDP2, once per way of gathering its FP8Linear weights
    (:data:`GATHERS`), and on one device (``"one device"`` in ``gathers``: FSDP2 on a group of rank 0
    alone, while the others wait).  Returns ``{gather: {"ms": median step time, "bytes": all-gathered bytes a
    step}}``.  Meant for NCCL with one GPU per rank (:func:`launch` with ``backend="nccl"``); on gloo it
    runs too, slowly."""
    from kernels.fp8_linear import MarkovLM, markov_batch, markov_source

    dev = device()
    probs, _ = markov_source(SETUP["vocab"], seed=SETUP["seed"])
    gen = torch.Generator().manual_seed(rank)
    idx, target = (t.to(dev) for t in markov_batch(probs, batch, SETUP["context"], gen))

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    out = {}
    for gather in gathers:
        torch.manual_seed(SETUP["seed"])
        from kernels.fp8_linear import FP8Recipe

        model = MarkovLM(SETUP["vocab"], SETUP["context"], dim, depth, FP8Recipe(), device=dev, dtype=torch.float32)
        if gather == "one device":  # the same FSDP2 code on a group of one rank: nothing to communicate
            from torch.distributed.device_mesh import DeviceMesh

            alone = dist.new_group([0])  # every rank must take part in making the group
            model = shard(model, mesh=DeviceMesh.from_group(alone, dev.type)) if rank == 0 else None
        else:
            if gather != "bf16":
                fp8_all_gather(model, agree=gather == "fp8")
            shard(model)
        times, moved = [], 0
        if model is not None:
            opt = torch.optim.AdamW(model.parameters(), lr=SETUP["lr"], weight_decay=0.0)
            for step in range(steps + 3):  # three warm-up steps
                with count_collectives() as counts:
                    sync()
                    t0 = time.perf_counter()
                    loss = _loss(model, idx, target)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    sync()
                if step >= 3:
                    times.append(1e3 * (time.perf_counter() - t0))
                    moved = counts.get("all-gather", {}).get("bytes", 0)
        dist.barrier()
        out[gather] = {"ms": sorted(times)[len(times) // 2] if times else None, "bytes": moved}
    return out
