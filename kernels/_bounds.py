"""The bounds check of Triton's CPU interpreter: :class:`OutOfBounds` and :func:`install_bounds_check`.

The interpreter performs an unmasked ``tl.load`` past the end of a tensor as a raw read of whatever
memory follows (garbage, silently) and an unmasked ``tl.store`` as a raw write (heap corruption, often a
crash much later).  :func:`install_bounds_check` makes it check every load and store against the memory
of the launch's tensor arguments first and refuse one outside them with :class:`OutOfBounds`.

Two places install it, so that a notebook's check and the grader give one verdict: the labs' checks
(:func:`kernels.checks.call_student`, in CPU mode) and the batch grader's sandbox
(:mod:`kernels.grade.child`).  An :class:`OutOfBounds` raised in the sandbox reaches the grader's judge
rebuilt by :mod:`kernels.grade.rpc` as an instance of this same class.  Importing this module imports
nothing heavy: numpy, torch and triton only once the check is installed.
"""

from __future__ import annotations

__all__ = ["OutOfBounds", "install_bounds_check"]


class OutOfBounds(IndexError):
    """A Triton kernel (in the interpreter) addressed memory outside its tensor arguments."""


def install_bounds_check(report=None):
    """Make the Triton interpreter refuse loads and stores outside the launch's tensor arguments.

    The interpreter copies each tensor argument's storage to the host before a launch; only those
    bytes are legal.  A launch that takes an int64 tensor is not checked: such a tensor may be a table
    of addresses (a multi-tensor kernel reaches tensors that are not its arguments), whose targets
    this check cannot know.  ``report(message)`` is called before the error is raised.
    """
    import numpy as np
    import torch
    from triton.runtime import interpreter as interp

    ranges = []  # (start, end) byte ranges of the current launch's storages
    pointer_table = [False]  # the current launch takes an int64 tensor: not checked
    executor = interp.GridExecutor
    original_init = executor._init_args_hst
    if getattr(original_init, "_bounds_checked", False):
        return

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = original_init(self, args_dev, kwargs)
        ranges.clear()
        pointer_table[0] = False

        def collect(arg):
            if isinstance(arg, tuple):
                for a in arg:
                    collect(a)
            elif hasattr(arg, "untyped_storage"):
                pointer_table[0] |= getattr(arg, "dtype", None) is torch.int64
                storage = arg.untyped_storage()
                ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
            elif hasattr(arg, "base") and hasattr(arg.base, "untyped_storage"):
                collect(arg.base)

        for a in [*args_hst, *kwargs_hst.values()]:
            collect(a)
        return args_hst, kwargs_hst

    _init_args_hst._bounds_checked = True

    def check(ptrs, mask, what):
        addresses = np.asarray(ptrs.data, dtype=np.uint64).ravel()
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).ravel()
        if pointer_table[0] or not active.any():
            return
        size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        inside = np.zeros(addresses.shape, dtype=bool)
        for start, end in ranges:
            inside |= (addresses >= start) & (addresses + size <= end)
        bad = active & ~inside
        if bad.any():
            lane = int(np.argmax(bad))
            address = int(addresses[lane])
            nearest = min(ranges, key=lambda r: min(abs(address - r[0]), abs(address - r[1])), default=None)
            where = ""
            if nearest:
                where = f", byte {address - nearest[0]} of a {nearest[1] - nearest[0]}-byte tensor argument"
            message = (
                f"out-of-bounds {what}: {int(bad.sum())} of {int(active.sum())} active lanes address memory "
                f"outside every tensor argument (first: lane {lane}{where}); give the {what} a mask "
                f"(mask=offs < n)"
            )
            if report:
                report(message)
            raise OutOfBounds(message)

    builder = interp.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def create_masked_load(self, ptrs, mask, other, *args, **kwargs):
        check(ptrs, mask, "tl.load")
        return load(self, ptrs, mask, other, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        check(ptrs, mask, "tl.store")
        return store(self, ptrs, value, mask, *args, **kwargs)

    executor._init_args_hst = _init_args_hst
    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
