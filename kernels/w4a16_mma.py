"""The W4A16 GEMM for decode shapes on Hopper, written in Gluon: packed FP4 weights go from memory
straight into the registers of a bf16 ``mma.sync`` operand, with no trip through shared memory.

Chapter 6 (no lab builds it: Lab 06 builds the ``tl.dot`` kernel).  Entry points: :func:`w4a16_mma`,
:func:`supported`.

:func:`kernels.w4a16.w4a16_matmul` uses this kernel on an sm_90 GPU for ``M <= 16`` rows of activations
when K is a multiple of :func:`k_multiple`; everywhere else (the interpreter, other GPUs, larger M) it
runs the ``tl.dot`` kernel of chapter 6, which is the one the lab builds.

Why a second kernel.  In ``tl.dot`` the dequantized weight tile must be in the layout the tensor cores
read, and Triton gets it there by writing the tile to shared memory and reading it back: at M = 1 that
layout conversion, not the weight bytes, sets the speed.  Gluon lets the kernel choose the layouts
itself, so the decode can produce the operand's registers directly:

* The output is computed transposed, ``C^T = W A^T``: the weights are the *A* operand of ``mma.sync
  m16n8k16`` (16 output columns per tile) and the activations the *B* operand (8 tokens per tile).  At
  decode sizes M <= 8, so one n8 tile of tokens holds them all and no tensor-core work or register is
  spent on padding; the lanes whose token index passes M - 1 read row M - 1 and their outputs are
  dropped.  A CTA holds ``WK`` warps that split K; each warp computes a ``BN x 8`` (M <= 8) or
  ``BN x 16`` tile, bf16 in, fp32 accumulate, and the warps' tiles are summed at the end.
* In the A operand lane ``4g + t`` holds weight rows ``g`` and ``g + 8`` and k values ``2t, 2t + 1,
  2t + 8, 2t + 9`` of each k16 chunk.  Here lane ``t`` of a row loads ``WPL = 4`` consecutive 32-bit
  words (32 codes) of that row in one 16-byte load, two K steps ahead of their use.
* The tensor-core k order need not be the weight's: any permutation of k gives the same dot product if
  the activations are permuted the same way.  The kernel picks the one in which the decode needs no
  data movement: a word ``w`` holds codes ``R`` (bits 4R..4R+3) and ``R + 4`` (bits 16+4R..),
  16 bits apart, so one shift-and-mask makes a bf16 *pair* of them, ``(code R, code R + 4)``, which is
  what one operand register holds.  Logical ``k = 8 WPL t + 8 wi + 2 r1 + r0 + 4 e`` (word ``wi`` of the
  lane, code ``R = 2 r1 + r0``, half ``e``) goes to tensor-core ``k = 16 (2 wi + r1) + 8 r0 + 2 t + e``;
  the activations, loaded as contiguous runs, are permuted in registers to match.
* Decode: ``sign << 15 | (exponent, mantissa) << 6`` read as bf16 is the E2M1 value times 2^-126 (the
  codes 0 and 0.5 land on bf16 subnormals, exactly); one ``mul.rn.bf16x2`` by the block scale, also
  pre-multiplied by a power of two, gives ``value * scale`` exactly (2 + 4 significant bits).  NVFP4:
  the scale is ``E4M3 * 2^118`` and the accumulator is multiplied by ``256 * tensor_scale`` at the end.
  MXFP4: ``2^(e-127)`` is applied as two bf16 factors ``2^(min(e,128)-1)`` and ``2^(max(e,128)-128)``
  so that every E8M0 exponent, 0 to 254 (and 255, NaN), is exact.

How fast it runs, against bf16 ``torch.matmul``, the ``tl.dot`` kernel and a kernel that only reads
the weight's bytes, is measured by ``python -m kernels.bench fp4_w4a16_gemm`` and discussed in
Chapter 6.  What bounds it, from Nsight Compute at decode shapes: too few warps per scheduler and too
few loads in flight, and its own per-weight integer work (decode, scale, activation permutation); with
more rows of activations, their registers and L2 traffic too (each CTA reads all of them).  Levers
left: a weight layout rearranged at quantization time (fewer instructions per code, no activation
permutation) and more loads in flight.
"""

import torch
import triton

try:  # Gluon ships with Triton >= 3.5; without it the tl.dot kernel is used everywhere
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # pragma: no cover - the pinned Triton has it
    gluon = gl = None

WK = 4  # warps per CTA, splitting K
WPL = 4  # 32-bit words (8 codes each) a lane loads per column and K step: one 16-byte load
MAX_M = 16  # two n8 tiles of tokens


def block_n(m: int) -> int:
    """Weight rows (output columns) per CTA, one or two m16 tiles: 16 at M <= 8, where the small tile
    leaves registers for more CTAs in flight; 32 above, where each CTA's read of all 16 activation rows
    from L2 serves twice as many weight rows (both chosen with the ``fp4_w4a16_gemm`` benchmark)."""
    return 16 if m <= 8 else 32


def tokens_per_tile(m: int) -> int:
    """Tokens in the mma's n dimension: one n8 tile at M <= 8, two above."""
    return 8 if m <= 8 else 16


def k_multiple() -> int:
    """K must be a multiple of this: WK warps, each a whole number of 32 * WPL-wide steps."""
    return WK * 32 * WPL


def supported(a: torch.Tensor, n: int, k: int) -> bool:
    """Whether :func:`w4a16_mma` serves this call: Gluon present, an sm_90 GPU (where it was measured),
    1 <= M <= 16 and K a multiple of :func:`k_multiple`."""
    m = a.shape[0]
    if gl is None or a.device.type != "cuda" or not 1 <= m <= MAX_M or n < 1 or k % k_multiple():
        return False
    # imported here, not at the top: the module must also load on its own, without the kernels package
    # (which switches Triton to its interpreter on a machine with no GPU), for the sm_90 compile test
    from kernels.device import cuda_capabilities

    index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    return cuda_capabilities(index).capability[0] == 9


if gl is not None:

    @gluon.jit
    def _pair(W, R: gl.constexpr):
        # codes R and R + 4 of each word -> bf16x2 bits (R in the low half), each value * 2^-126
        if R == 0:
            p = ((W << 6) & 0x01C001C0) | ((W << 12) & 0x80008000)
        elif R == 1:
            p = ((W << 2) & 0x01C001C0) | ((W << 8) & 0x80008000)
        elif R == 2:
            p = ((W >> 2) & 0x01C001C0) | ((W << 4) & 0x80008000)
        else:
            p = ((W >> 6) & 0x01C001C0) | (W & 0x80008000)
        return p

    @gluon.jit
    def _mul_bf16x2(p, f):
        return gl.inline_asm_elementwise(
            "mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [p, f], dtype=gl.uint32, is_pure=True, pack=1
        )

    @gluon.jit
    def _decoded(W, f2, g2, R: gl.constexpr, NV: gl.constexpr):
        """Codes R and R + 4 of each word, scaled, as bf16 ``[..., 2]`` (the last axis is the pair)."""
        p = _mul_bf16x2(_pair(W, R), f2)
        if not NV:
            p = _mul_bf16x2(p, g2)
        lo = p.to(gl.uint16).to(gl.bfloat16, bitcast=True)
        hi = (p >> 16).to(gl.uint16).to(gl.bfloat16, bitcast=True)
        return gl.join(lo, hi)

    @gluon.jit
    def _dup(bits):
        b = bits.to(gl.uint32)
        return b | (b << 16)

    @gluon.jit
    def _step(acc, W, S, A, NV: gl.constexpr, WK: gl.constexpr, WPL: gl.constexpr, MT: gl.constexpr):
        """One K step of one warp: decode ``W`` (words) with scales ``S`` and multiply by ``A``."""
        KC: gl.constexpr = 32 * WPL
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WK, 1, 1], instr_shape=[1, 16, 8])
        if NV:  # E4M3 * 2^118 as bf16 (exact: 3 mantissa bits, exponent within range)
            f = (S.to(gl.float8e4nv, bitcast=True).to(gl.float32) * 2.0**118).to(gl.bfloat16)
            f2 = _dup(f.to(gl.uint16, bitcast=True))
            g2 = f2
        else:  # 2^(e-127) = 2^(min(e,128)-1) * 2^(max(e,128)-128); e = 255 is NaN
            e = S.to(gl.int32)
            f2 = _dup((gl.minimum(e, 128) + 126) << 7)
            g2 = _dup(gl.where(e == 255, 0x7FC0, (gl.maximum(e, 128) - 1) << 7))
        x0 = _decoded(W, f2, g2, 0, NV)  # [warp, t, word, column, e]
        x1 = _decoded(W, f2, g2, 1, NV)
        x2 = _decoded(W, f2, g2, 2, NV)
        x3 = _decoded(W, f2, g2, 3, NV)
        z = gl.join(gl.join(x0, x1), gl.join(x2, x3))  # [warp, t, word, column, e, r0, r1]
        z = gl.permute(z, (0, 3, 2, 6, 5, 1, 4))  # [warp, column, word, r1, r0, t, e]
        BN: gl.constexpr = z.shape[1]
        w = gl.convert_layout(gl.reshape(z, (WK, BN, KC)), gl.DotOperandLayout(0, MMA, 2), assert_trivial=True)
        # activations [warp, token, t, j] -> [warp, k, token] in the same k order: j = 8 word + 4 e + 2 r1 + r0
        a = gl.reshape(A, (WK, MT, 4, WPL, 2, 2, 2))  # [warp, token, t, word, e, r1, r0]
        a = gl.reshape(gl.permute(a, (0, 3, 5, 6, 2, 4, 1)), (WK, KC, MT))  # [.., word, r1, r0, t, e, token]
        return gl.nvidia.ampere.mma_v2(w, gl.convert_layout(a, gl.DotOperandLayout(1, MMA, 2)), acc)

    @gluon.jit
    def _w4a16_mma_kernel(
        a_ptr,  # (M, K) bf16, unit stride along K
        q_ptr,  # (N, K // 2) packed codes, read as 32-bit words
        s_ptr,  # (N, K // BS) uint8 block scales
        ts_ptr,  # NVFP4: the fp32 tensor scale
        c_ptr,  # (M, N) bf16
        M,
        N,
        stride_am,
        stride_cm,
        K8,  # words per weight row
        KW,  # K per warp
        KW8,  # words per warp
        KS,  # scales per row
        KWS,  # scales per warp
        NV: gl.constexpr,
        BN: gl.constexpr,
        WK: gl.constexpr,
        WPL: gl.constexpr,
        MT: gl.constexpr,  # tokens per tile: 8 (M <= 8) or 16
        PF: gl.constexpr,  # steps of weights in flight beyond the one in use: 1 or 2
    ):
        KC: gl.constexpr = 32 * WPL  # K per warp and step
        SC: gl.constexpr = KC // (16 if NV else 32)  # scales per row and step
        # weight words [warp, t, word, column]: lane = 4 * column + t, a lane's WPL words contiguous
        LW: gl.constexpr = gl.BlockedLayout([1, 1, WPL, 1], [1, 4, 1, 8], [WK, 1, 1, 1], [2, 1, 3, 0])
        # activations [warp, row, t, j]: lane t's 8 * WPL contiguous k, rows spread over lanes
        LA: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8 * WPL], [1, 8, 4, 1], [WK, 1, 1, 1], [3, 2, 1, 0])
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WK, 1, 1], instr_shape=[1, 16, 8])
        LC: gl.constexpr = gl.SliceLayout(0, MMA)

        n0 = gl.program_id(0) * BN
        steps = KW // KC
        wk = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LW))))[:, None, None, None]
        t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, LW))))[None, :, None, None]
        wi = gl.arange(0, WPL, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LW))))[None, None, :, None]
        col = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LW))))[None, None, None, :]
        row = gl.minimum(n0 + col, N - 1).to(gl.int64)  # rows past N read row N - 1; their outputs are masked
        w_ptrs = q_ptr.to(gl.pointer_type(gl.uint32)) + row * K8 + wk * KW8 + t * WPL + wi
        if NV:  # 16 codes (2 words) per scale
            s_ptrs = s_ptr + row * KS + wk * KWS + t * (WPL // 2) + wi // 2
        else:  # 32 codes (4 words) per scale
            s_ptrs = s_ptr + row * KS + wk * KWS + t * (WPL // 4) + wi // 4
        wka = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LA))))[:, None, None, None]
        ma = gl.arange(0, MT, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, LA))))[None, :, None, None]
        ta = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LA))))[None, None, :, None]
        ja = gl.arange(0, 8 * WPL, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LA))))[
            None, None, None, :
        ]
        a_ptrs = a_ptr + gl.minimum(ma, M - 1) * stride_am + wka * KW + ta * (8 * WPL) + ja

        acc = gl.zeros([WK, BN, MT], gl.float32, MMA)
        w_next = gl.load(w_ptrs)
        s_next = gl.load(s_ptrs)
        a_next = gl.load(a_ptrs)
        if PF == 1:
            for i in range(steps):  # registers double-buffered: step i + 1's loads fly during step i's math
                W = w_next
                S = s_next
                A = a_next
                j = gl.minimum(i + 1, steps - 1)
                w_next = gl.load(w_ptrs + j * (KC // 8))
                s_next = gl.load(s_ptrs + j * SC)
                a_next = gl.load(a_ptrs + j * KC)
                acc = _step(acc, W, S, A, NV, WK, WPL, MT)
        else:  # two steps of weights in flight; steps is even
            w_odd = gl.load(w_ptrs + KC // 8)
            s_odd = gl.load(s_ptrs + SC)
            for i in range(0, steps, 2):
                W = w_next
                S = s_next
                A = a_next
                j = gl.minimum(i + 2, steps - 1)
                w_next = gl.load(w_ptrs + j * (KC // 8))
                s_next = gl.load(s_ptrs + j * SC)
                a_next = gl.load(a_ptrs + (i + 1) * KC)
                acc = _step(acc, W, S, A, NV, WK, WPL, MT)
                W = w_odd
                S = s_odd
                A = a_next
                j = gl.minimum(i + 3, steps - 1)
                w_odd = gl.load(w_ptrs + j * (KC // 8))
                s_odd = gl.load(s_ptrs + j * SC)
                a_next = gl.load(a_ptrs + gl.minimum(i + 2, steps - 1) * KC)
                acc = _step(acc, W, S, A, NV, WK, WPL, MT)
        out = gl.sum(acc, axis=0)  # the warps' K slices
        if NV:
            out = out * (gl.load(ts_ptr) * 256.0)
        rn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, LC))[:, None]
        rm = gl.arange(0, MT, layout=gl.SliceLayout(0, LC))[None, :]
        gl.store(c_ptr + rm * stride_cm + rn, out.to(gl.bfloat16), mask=(rm < M) & (rn < N))


def w4a16_mma(
    a2: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    ts: torch.Tensor,
    c: torch.Tensor,
    nv: bool,
    bn: int | None = None,
    wk: int = WK,
    wpl: int = WPL,
    pf: int | None = None,
):
    """Launch on checked inputs: ``a2`` (M, K) bf16 with unit stride along K, ``q`` (N, K // 2) uint8
    contiguous, ``s`` (N, K // BS) uint8 contiguous, ``ts`` the fp32 tensor scale (NVFP4), ``c`` (M, N)
    bf16; :func:`supported` must hold.  ``bn``, ``wk``, ``wpl`` (4 or 8) and ``pf`` (1 or 2 steps of
    weights in flight; 2 needs an even number of steps) override the defaults, for experiments: K must
    stay a multiple of ``wk * 32 * wpl``."""
    m, k = a2.shape
    n = q.shape[0]
    bn = block_n(m) if bn is None else bn
    steps = k // (wk * 32 * wpl)
    pf = (2 if steps % 2 == 0 else 1) if pf is None else pf
    bs = 16 if nv else 32
    _w4a16_mma_kernel[(triton.cdiv(n, bn),)](
        a2, q, s, ts, c, m, n, a2.stride(0), c.stride(0), k // 8, k // wk, k // wk // 8, k // bs, k // wk // bs,
        NV=nv, BN=bn, WK=wk, WPL=wpl, MT=tokens_per_tile(m), PF=pf, num_warps=wk,
    )  # fmt: skip
    return c


__all__ = [
    "MAX_M",
    "WK",
    "WPL",
    "block_n",
    "k_multiple",
    "supported",
    "tokens_per_tile",
    "w4a16_mma",
]
