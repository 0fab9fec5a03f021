"""One fused CUDA kernel (Triton) for the torch engine: gather + cast + normalize + layout in one pass.

The plain torch path on CUDA makes four passes over each batch (gather, cast, subtract, multiply);
this kernel reads each patch row once in the store's dtype and writes the normalized output once.
NHWC: a patch row (p pixels x B bands) is contiguous in a band-last tile and in the output, so each
program copies one row. NCHW: each program writes a contiguous run of one patch's (B, p, p) output.
The arithmetic is the torch path's: (float32(x) - offset) * scale, rounded once to the output dtype.
Used only when Triton imports and the dtypes are supported; the torch path remains the fallback.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

# store dtypes the kernel reads directly (unsigned 16-bit is read through its signed view)
_LOADABLE = {torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.float16, torch.float32}
_OUTPUTS = {torch.float32, torch.float16, torch.bfloat16}

_kernel: Any = None


def available() -> bool:
    """True when Triton can be imported (CUDA builds of torch ship it)."""
    return _build() is not None


def supports(src: torch.dtype, out: torch.dtype) -> bool:
    return src in _LOADABLE and out in _OUTPUTS


def _build() -> Any:
    global _kernel
    if _kernel is not None:
        return _kernel or None
    try:
        import triton
        import triton.language as tl
    except ImportError:
        _kernel = False
        return None

    @triton.jit
    def cut_rows(src, slot_ptr, y_ptr, x_ptr, off_ptr, scale_ptr, out, side, code_ptr,
                 B: tl.constexpr, P: tl.constexpr, R: tl.constexpr, ROW: tl.constexpr,
                 BLOCK: tl.constexpr, U16: tl.constexpr, DIHEDRAL: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)  # NHWC: one program per (patch n, patch row dy)
        n = pid // P
        dy = pid % P
        slot = tl.load(slot_ptr + n).to(tl.int64)
        y = tl.load(y_ptr + n).to(tl.int64)
        x = tl.load(x_ptr + n).to(tl.int64)
        start = ((slot * side + (y - R + dy)) * side + (x - R)) * B
        if DIHEDRAL:
            code = tl.load(code_ptr + n).to(tl.int64)
        for k in range(0, ROW, BLOCK):
            offs = k + tl.arange(0, BLOCK)
            mask = offs < ROW
            if DIHEDRAL:  # the row's pixels come from a source row or column, in some direction
                # dihedral code 4t + 2v + h (hsgds.augment): output (i, j) reads source (a, b)
                j = offs // B
                a = tl.where((code >> 2) & 1 == 1, j, dy)
                b = tl.where((code >> 2) & 1 == 1, dy, j)
                a = tl.where((code >> 1) & 1 == 1, P - 1 - a, a)
                b = tl.where(code & 1 == 1, P - 1 - b, b)
                v = tl.load(src + ((slot * side + (y - R + a)) * side + (x - R + b)) * B + offs % B,
                            mask=mask, other=0)
            else:  # a patch row is contiguous in the tile
                v = tl.load(src + start + offs, mask=mask, other=0)
            if U16:
                v = v.to(tl.int32) & 0xFFFF
            v = v.to(tl.float32)
            b = offs % B
            o = tl.load(off_ptr + b, mask=mask, other=0.0)
            s = tl.load(scale_ptr + b, mask=mask, other=1.0)
            r = (v - o) * s
            dst = (n * P + dy) * ROW + offs
            tl.store(out + dst, r.to(out.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)

    @triton.jit
    def cut_planes(src, slot_ptr, y_ptr, x_ptr, off_ptr, scale_ptr, out, side, code_ptr,
                   B: tl.constexpr, P: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr,
                   U16: tl.constexpr, DIHEDRAL: tl.constexpr):
        # NCHW: a patch is B*P*P contiguous outputs; walk them in output order so every store is
        # coalesced (the gathered 2-byte loads hit the patch's rows, which stay in cache)
        n = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = j < B * P * P
        slot = tl.load(slot_ptr + n).to(tl.int64)
        y = tl.load(y_ptr + n).to(tl.int64)
        x = tl.load(x_ptr + n).to(tl.int64)
        b = j // (P * P)
        rem = j % (P * P)
        dy = rem // P
        dx = rem % P
        if DIHEDRAL:  # as in cut_rows: output (dy, dx) reads source (a, b)
            code = tl.load(code_ptr + n).to(tl.int64)
            row = tl.where((code >> 2) & 1 == 1, dx, dy)
            col = tl.where((code >> 2) & 1 == 1, dy, dx)
            dy = tl.where((code >> 1) & 1 == 1, P - 1 - row, row)
            dx = tl.where(code & 1 == 1, P - 1 - col, col)
        v = tl.load(src + ((slot * side + (y - R + dy)) * side + (x - R + dx)) * B + b, mask=mask, other=0)
        if U16:
            v = v.to(tl.int32) & 0xFFFF
        v = v.to(tl.float32)
        o = tl.load(off_ptr + b, mask=mask, other=0.0)
        s = tl.load(scale_ptr + b, mask=mask, other=1.0)
        r = (v - o) * s
        tl.store(out + n * (B * P * P) + j, r.to(out.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)

    _kernel = (cut_rows, cut_planes)
    return _kernel


def cut(storage: torch.Tensor, slot: torch.Tensor, y: torch.Tensor, x: torch.Tensor, offset: torch.Tensor,
        scale: torch.Tensor, out: torch.Tensor, patch_size: int, nchw: bool,
        dihedral: torch.Tensor | None = None) -> torch.Tensor:
    """Fill ``out`` ((N, B, p, p) or (N, p, p, B), contiguous, on CUDA) from ``storage`` (slots, S, S, B).
    ``dihedral``: optional (N,) int8 codes; each patch is read in its flipped / turned order."""
    rows_kernel, planes_kernel = _build()
    n, bands, side = slot.shape[0], storage.shape[3], storage.shape[1]
    src = storage.view(torch.int16) if storage.dtype == torch.uint16 else storage
    u16 = storage.dtype == torch.uint16
    codes = slot if dihedral is None else dihedral  # an unused pointer when there are no codes
    # Triton launches on torch's current device, on its current stream: the ring may be on another GPU
    # (device="cuda:1" without torch.cuda.set_device(1)), so make it the ring's, as torch ops do
    with torch.cuda.device(storage.device) if storage.is_cuda else contextlib.nullcontext():
        if nchw:
            block = 1024
            grid = (n, -(-(bands * patch_size * patch_size) // block))
            planes_kernel[grid](src, slot, y, x, offset, scale, out, side, codes, B=bands, P=patch_size,
                                R=patch_size // 2, BLOCK=block, U16=u16, DIHEDRAL=dihedral is not None)
        else:
            row = patch_size * bands
            block = min(4096, 1 << max(0, (row - 1).bit_length()))
            rows_kernel[(n * patch_size,)](src, slot, y, x, offset, scale, out, side, codes, B=bands, P=patch_size,
                                           R=patch_size // 2, ROW=row, BLOCK=block, U16=u16,
                                           DIHEDRAL=dihedral is not None)
    return out
