"""A short host path for launching compiled Triton kernels: the cost of a call, not of a compiler.

Chapter 5 (where the FP8 linear layer's step is host-bound at small sizes); no lab.  Entry points:
:class:`Launcher`, :func:`spec_key`, :func:`scratch`, :func:`resident_programs`.

``kernel[grid](*args)`` does a compiler's work on every call: it binds the arguments to the
signature, works out how each one specializes the kernel (dtypes, 16-byte alignment, integers equal
to 1 or divisible by 16), hashes that into a cache key, checks the globals the kernel read, and, for
an autotuned kernel, builds the tuning key and looks the best configuration up.  On the H200's host
that is tens of microseconds a launch, more than many of the kernels it launches run on the GPU.

:class:`Launcher` does that work once per *specialization key* that the caller computes
(:func:`spec_key`: each tensor's dtype, device and 16-byte alignment, each integer's exact value, each
other argument itself), and keeps the compiled kernel, the argument order (the tuned configuration's
meta-parameters folded in) and the grid.  Later calls with the same key go straight to the compiled
kernel's launcher: the arguments in order, the current stream, nothing else.  A key that differs in
anything Triton specializes on differs in the key too, so a cached kernel never runs on arguments it
was not compiled for.

In CPU mode (the interpreter) and while a launch hook is installed (a profiler such as Proton),
every call takes Triton's own path.
"""

import torch
import triton
from triton import knobs

import kernels


def spec_key(*args) -> tuple:
    """What a compiled kernel depends on among ``args``: for a tensor its dtype, device index and
    whether its address is 16-byte aligned; an integer by value (shapes set the grid, and Triton
    specializes 1 and multiples of 16); anything else as it is."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((a.dtype, a.get_device(), a.data_ptr() % 16 == 0))
        else:
            out.append(a)
    return tuple(out)


class Launcher:
    """``Launcher(fn)(grid, args, key, **meta)`` runs ``fn[grid](*args, **meta)``, the first time for
    each ``key`` through Triton (compiling and, for an autotuned ``fn``, tuning), afterwards straight
    through the compiled kernel's launcher.

    ``fn``: a ``@triton.jit`` function or a ``triton.autotune`` of one.  ``grid``: a tuple, or a
    function of the meta-parameters (the tuned configuration's included) returning one.  ``key``: a
    hashable that fixes everything the compiled kernel and the grid depend on, given ``meta``
    (:func:`spec_key` of ``args`` plus the meta-parameters is always enough)."""

    def __init__(self, fn):
        self.fn = fn
        self._cache = {}

    @property
    def arg_names(self) -> list:
        jit = self.fn
        while not isinstance(jit, triton.runtime.JITFunction):
            jit = jit.fn
        return jit.arg_names

    def __call__(self, grid, args: tuple, key, **meta):
        if kernels.INTERPRETER or _hooked():
            return self.fn[grid](*args, **meta)
        entry = self._cache.get(key)
        if entry is None:
            return self._first(grid, args, key, meta)
        compiled, order, (g0, g1, g2) = entry
        values = [args[i] if i >= 0 else v for i, v in order]
        stream = _raw_stream(torch.cuda.current_device())
        compiled.run(
            g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *values
        )  # fmt: skip
        return None

    def _first(self, grid, args, key, meta):
        compiled = self.fn[grid](*args, **meta)
        if hasattr(compiled, "result"):  # an asynchronous compilation
            compiled = compiled.result()
        config = getattr(self.fn, "best_config", None)
        params = {**meta, **(config.all_kwargs() if config is not None else {})}
        if callable(grid):
            grid = grid({**dict(zip(self.arg_names, args, strict=False)), **params})
        grid = tuple(grid) + (1,) * (3 - len(grid))
        order = []
        for i, name in enumerate(self.arg_names):
            if i < len(args):
                order.append((i, None))
            elif name in params:
                order.append((-1, params[name]))
            else:  # a parameter left to its default: Triton's path keeps handling it
                return None
        self._cache[key] = (compiled, tuple(order), grid)
        return None


def _hooked() -> bool:
    """Whether a launch hook is installed.  Triton's hooks are chains, empty unless a tool (a profiler)
    adds to them; a hook set as a plain function counts too."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _raw_stream(device: int) -> int:
    """The current CUDA stream's handle, as Triton's own launch path asks for it."""
    return triton.runtime.driver.active.get_current_stream(device)


def resident_programs(compiled, device: int) -> int:
    """How many programs of ``compiled`` (a compiled kernel) the GPU holds at once: the driver's own
    occupancy answer (``cuOccupancyMaxActiveBlocksPerMultiprocessor``: registers, shared memory with its
    per-block reservation, threads, the block limit) times the SM count.  A kernel whose programs wait
    for one another (a grid barrier) must launch no more than this, cooperatively
    (``launch_cooperative_grid=True``: the driver then refuses a grid that cannot all be resident
    instead of letting it hang)."""
    compiled._init_handles()
    props = torch.cuda.get_device_properties(device)
    threads = compiled.metadata.num_warps * props.warp_size
    shared = compiled.metadata.shared
    with torch.cuda.device(device):
        per_sm = _driver_occupancy(compiled.function, threads, shared)
    if per_sm is None:  # no driver library to ask: the same limits, worked out here
        regs_per_warp = -(-max(compiled.n_regs, 1) * props.warp_size // 256) * 256  # allocated 256 at a time
        by_regs = props.regs_per_multiprocessor // (regs_per_warp * (threads // props.warp_size))
        by_shared = props.shared_memory_per_multiprocessor // (shared + 1024)  # 1 KB reserved per block
        by_threads = props.max_threads_per_multi_processor // threads
        per_sm = min(by_regs, by_shared, by_threads, 32)
    return props.multi_processor_count * max(1, per_sm)


def _driver_occupancy(function: int, threads: int, shared: int):
    """Blocks of ``function`` (a CUfunction handle) resident per SM, asked of the CUDA driver; None where
    the driver library cannot be loaded or answers with an error."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    blocks = ctypes.c_int(0)
    rc = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(blocks), ctypes.c_void_p(function), ctypes.c_int(threads), ctypes.c_size_t(shared)
    )
    return blocks.value if rc == 0 and blocks.value > 0 else None


_SCRATCH = {}


def scratch(size: int, alignment: int, stream):
    """Triton's allocator for the global scratch of a launch (the TMA descriptors a kernel builds on
    the device): one buffer per device, stream and size, kept.  Launches on one stream run one after
    another, so the next launch may reuse the buffer of the last; a new allocation per launch would
    cost the host an allocation every time.  While a CUDA graph is being captured, each launch gets
    its own buffer from the graph's memory pool, which the graph keeps."""
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(size, device="cuda", dtype=torch.int8)
    device = torch.cuda.current_device()
    buf = _SCRATCH.get((device, stream, size))
    if buf is None:
        buf = _SCRATCH[(device, stream, size)] = torch.empty(size, device="cuda", dtype=torch.int8)
    return buf


__all__ = ["Launcher", "resident_programs", "scratch", "spec_key"]
