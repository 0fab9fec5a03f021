"""The numba kernels of :mod:`hsgds.engines.cpu_cut` (imported only through it: this module needs numba).

Module-level functions, so that numba's on-disk cache (``cache=True``) finds them again in the next process.
"""

from __future__ import annotations

import platform
import sys

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

jit = numba.njit(nogil=True, cache=True, boundscheck=False)
# a pass of a few µs on the training thread keeps the GIL: released, it is often taken by a thread waiting
# for it (a cutting thread between ranges, the batch thread), and the training thread sleeps until it is back
jit_holding_gil = numba.njit(nogil=False, cache=True, boundscheck=False)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_LITTLE = sys.byteorder == "little"


def _vector_half() -> bool:
    """Whether numba's target CPU converts float vectors to half in registers (x86 with F16C). Elsewhere,
    e.g. under ``NUMBA_CPU_NAME=generic`` (caches shared between machines), LLVM calls ``__truncsfhf2``,
    which numba's JIT cannot link: float16 then keeps the scalar rounding (:func:`f16_bits`)."""
    if not _X86:
        return False
    if numba.config.CPU_NAME:
        return "+f16c" in (numba.config.CPU_FEATURES or "")
    from llvmlite import binding
    return bool(binding.get_host_cpu_features().get("f16c"))


_VECTOR_HALF = _vector_half()


@intrinsic
def stream32(typingctx, src, s0, dst, d0):
    """32 bytes from ``src[s0:]`` (any alignment) to ``dst[d0:]`` (32-byte aligned) with a non-temporal
    store: the line goes to memory without being read first (a plain store reads every output line
    before writing it, which halves the write bandwidth: measured 4.2 vs 11.8 GB/s on the 2-core VM)."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array) and src.dtype == dst.dtype):
        return None
    sig = types.void(src, types.intp, dst, types.intp)

    def codegen(context, builder, signature, args):
        srcv, s0v, dstv, d0v = args
        sary = context.make_array(signature.args[0])(context, builder, srcv)
        dary = context.make_array(signature.args[2])(context, builder, dstv)
        vec = ir.VectorType(context.get_data_type(signature.args[0].dtype), 256 // signature.args[0].dtype.bitwidth)
        value = builder.load(builder.bitcast(builder.gep(sary.data, [s0v]), vec.as_pointer()), align=1)
        store = builder.store(value, builder.bitcast(builder.gep(dary.data, [d0v]), vec.as_pointer()), align=32)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_fence(typingctx):
    """Order the non-temporal stores before everything after (sfence on x86; a full fence elsewhere), so
    the thread that waits for this kernel sees the whole output."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if _X86:
            builder.call(builder.module.declare_intrinsic("llvm.x86.sse.sfence", fnty=ir.FunctionType(ir.VoidType(), [])), [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


def _shuffle(builder, a, b, mask):
    """LLVM's shufflevector of ``a`` and ``b`` by the lane indices ``mask``."""
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), len(mask)), mask))


def _transposed(builder, rows):
    """The 8 columns of 8 row vectors of 8 lanes (24 shuffles; LLVM picks the unpack/shuffle/permute
    instructions of the machine)."""
    def shuf(a, b, mask):
        return _shuffle(builder, a, b, mask)

    t = []  # pairs of rows interleaved within 128-bit lanes
    for k in range(0, 8, 2):
        t.append(shuf(rows[k], rows[k + 1], [0, 8, 1, 9, 4, 12, 5, 13]))
        t.append(shuf(rows[k], rows[k + 1], [2, 10, 3, 11, 6, 14, 7, 15]))
    u = []  # groups of four rows: columns (m, m+4) of each
    for g in (0, 4):
        x0, x1, x2, x3 = t[g:g + 4]
        u += [shuf(x0, x2, [0, 1, 8, 9, 4, 5, 12, 13]), shuf(x0, x2, [2, 3, 10, 11, 6, 7, 14, 15]),
              shuf(x1, x3, [0, 1, 8, 9, 4, 5, 12, 13]), shuf(x1, x3, [2, 3, 10, 11, 6, 7, 14, 15])]
    columns = [None] * 8
    for m in range(4):
        columns[m] = shuf(u[m], u[4 + m], [0, 1, 2, 3, 8, 9, 10, 11])
        columns[m + 4] = shuf(u[m], u[4 + m], [4, 5, 6, 7, 12, 13, 14, 15])
    return columns


def _bf16_high(builder, v, nan_check: bool):
    """:func:`bf16_bits` of the 8 lanes of float vector ``v`` (float64 lanes first rounded to float32), left
    in the high half of each 32-bit lane: round to nearest even, NaN -> 0x7FC0 (without ``nan_check``, for
    values known not to be NaN, the test is left out)."""
    i32 = ir.VectorType(ir.IntType(32), 8)
    f32 = ir.VectorType(ir.FloatType(), 8)

    def c(x):
        return ir.Constant(i32, [x] * 8)

    u = builder.bitcast(v if v.type == f32 else builder.fptrunc(v, f32), i32)
    rounded = builder.add(builder.add(u, c(0x7FFF)), builder.and_(builder.lshr(u, c(16)), c(1)))
    if nan_check:
        nan = builder.icmp_unsigned(">", builder.and_(u, c(0x7FFFFFFF)), c(0x7F800000))
        rounded = builder.select(nan, c(0x7FC00000), rounded)
    return rounded


def _bf16_columns(builder, rows, nan_check: bool):
    """The 8 columns, as bfloat16 bits, of 8 float rows (:func:`bf16_bits` on 8 lanes: round to nearest
    even, NaN -> 0x7FC0; without ``nan_check``, for rows known to hold no NaN, the test is left out).
    Each rounded value is left in the high half of a 32-bit lane; two rows share one vector (row r's
    value in the low half of each lane, row r+1's in the high half), so a 4 x 8 transpose of 32-bit
    lanes (8 shuffles, a third of the 8 x 8 one) leaves each column as 8 adjacent 16-bit values, row r
    first on a little-endian machine (the only kind :func:`cut_patches` sends here)."""
    i32 = ir.VectorType(ir.IntType(32), 8)

    def c(x):
        return ir.Constant(i32, [x] * 8)

    def shuf(a, b, mask):
        return _shuffle(builder, a, b, mask)

    high = [_bf16_high(builder, v, nan_check) for v in rows]
    pairs = [builder.or_(builder.lshr(high[r], c(16)), builder.and_(high[r + 1], c(0xFFFF0000)))
             for r in range(0, 8, 2)]
    t = [shuf(pairs[k], pairs[k + 1], mask) for k in (0, 2) for mask in
         ([0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15])]
    # t[0], t[1]: pairs 0-1 interleaved (bands 0,1,4,5 / 2,3,6,7); t[2], t[3]: pairs 2-3
    quads = [shuf(t[a], t[a + 2], mask) for a in (0, 1) for mask in
             ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])]
    # quads[0]: bands 0 and 4, [1]: 1 and 5, [2]: 2 and 6, [3]: 3 and 7 (low and high 128 bits)
    i16x8 = ir.VectorType(ir.IntType(16), 8)
    columns = [None] * 8
    for m in range(4):
        columns[m] = builder.bitcast(shuf(quads[m], quads[m], [0, 1, 2, 3]), i16x8)
        columns[m + 4] = builder.bitcast(shuf(quads[m], quads[m], [4, 5, 6, 7]), i16x8)
    return columns


def _half_bits(builder, v, nan_check: bool):
    """The float16 bits of float32 ``v`` (a value or a vector of them) as :func:`f16_bits` gives them:
    LLVM's ``fptrunc`` to half (IEEE round to nearest even, subnormals and overflow to infinity included;
    ``vcvtps2ph`` on an x86 CPU with F16C), and a NaN as sign | 0x7E00 (the conversion would keep part of
    its payload). Without ``nan_check`` that test is left out, for values known not to be NaN."""
    lanes = getattr(v.type, "count", None)

    def typed(t):
        return t if lanes is None else ir.VectorType(t, lanes)

    def const(t, x):
        return ir.Constant(t, x if lanes is None else [x] * lanes)

    i32, i16 = typed(ir.IntType(32)), typed(ir.IntType(16))
    bits = builder.bitcast(builder.fptrunc(v, typed(ir.HalfType())), i16)
    if not nan_check:
        return bits
    u = builder.bitcast(v, i32)
    nan = builder.icmp_unsigned(">", builder.and_(u, const(i32, 0x7FFFFFFF)), const(i32, 0x7F800000))
    sign = builder.and_(builder.trunc(builder.lshr(u, const(i32, 16)), i16), const(i16, 0x8000))
    return builder.select(nan, builder.or_(sign, const(i16, 0x7E00)), bits)


def _f16_columns(builder, rows, nan_check: bool):
    """The 8 columns, as float16 bits (:func:`_half_bits`), of 8 float32 rows: the 8 x 8 transpose of
    16-bit lanes after the conversion."""
    return _transposed(builder, [_half_bits(builder, v, nan_check) for v in rows])


@intrinsic
def transpose8(typingctx, src, s0, sstride, dst, d0, dstride):
    """``dst[d0 + m*dstride + k] = src[s0 + k*sstride + m]`` for k, m in 0..7: an 8x8 block transposed in
    registers (8 vector loads, 24 shuffles, 8 vector stores). ``src`` and ``dst``: contiguous 1-D arrays of
    one dtype."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array) and src.dtype == dst.dtype):
        return None
    sig = types.void(src, types.intp, types.intp, dst, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        srcv, s0v, ssv, dstv, d0v, dsv = args
        sary = context.make_array(signature.args[0])(context, builder, srcv)
        dary = context.make_array(signature.args[3])(context, builder, dstv)
        vec = ir.VectorType(context.get_data_type(signature.args[0].dtype), 8)
        align = signature.args[0].dtype.bitwidth // 8

        def at(ary, first, stride, k):
            off = builder.add(first, builder.mul(stride, ir.Constant(stride.type, k)))
            return builder.bitcast(builder.gep(ary.data, [off]), vec.as_pointer())

        rows = [builder.load(at(sary, s0v, ssv, k), align=align) for k in range(8)]
        for m, column in enumerate(_transposed(builder, rows)):
            builder.store(column, at(dary, d0v, dsv, m), align=align)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy_block(typingctx, src, pix, k0, b0, dst, d0, dstride):
    """``dst[d0 + m*dstride + r] = src[pix[k0 + r] + b0 + m]`` for r, m in 0..7: the 8 x 8 block of
    :func:`gather_block` with no arithmetic, for tiles that already hold the output's values
    (:func:`normalize_tile`): 8 vector loads, 24 shuffles, 8 vector stores. ``src`` and ``dst``: one dtype."""
    if not (isinstance(src, types.Array) and isinstance(pix, types.Array) and isinstance(dst, types.Array)
            and src.dtype == dst.dtype):
        return None
    sig = types.void(src, pix, types.intp, types.intp, dst, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        srcv, pixv, k0v, b0v, dstv, d0v, dsv = args
        sary, pary, dary = (context.make_array(signature.args[i])(context, builder, v)
                            for i, v in ((0, srcv), (1, pixv), (4, dstv)))
        vec, intp = ir.VectorType(context.get_data_type(signature.args[0].dtype), 8), k0v.type
        align = signature.args[0].dtype.bitwidth // 8
        rows = []
        for r in range(8):
            first = builder.load(builder.gep(pary.data, [builder.add(k0v, ir.Constant(intp, r))]))
            ptr = builder.bitcast(builder.gep(sary.data, [builder.add(first, b0v)]), vec.as_pointer())
            rows.append(builder.load(ptr, align=align))
        for m, column in enumerate(_transposed(builder, rows)):
            at = builder.add(d0v, builder.mul(dsv, ir.Constant(intp, m)))
            builder.store(column, builder.bitcast(builder.gep(dary.data, [at]), vec.as_pointer()), align=align)
        return context.get_dummy_value()

    return sig, codegen


def _gather_block(noisy: bool, nan_check: bool = True):
    """An intrinsic that cuts an 8-pixel x 8-band block of a patch straight from the tile into band-major
    output, in registers: ``dst[d0 + m*dstride + r] = f(src[pix[k0 + r] + b0 + m])`` for r, m in 0..7,
    where f casts to the compute dtype (``offset``'s), normalizes ``(v - offset[b]) * scale[b]`` and, when
    ``noisy``, adds radiation noise ``v * alpha + std * noise[(k0 + r) * nstride + b]`` (the same
    operations in the same order as :func:`gather_row`, so the same bits). A uint16 ``dst`` takes the
    bfloat16 bits (:func:`bf16_bits`, vectorized), an int16 one the float16 bits (:func:`_f16_columns`;
    :func:`hsgds.engines.cpu_cut.cut_range` passes float16 outputs as int16), a float ``dst`` the value.
    ``pix``: each output pixel's first element in ``src`` (int64). 8 vector loads, the arithmetic on 8
    lanes, 24 shuffles (16 for bfloat16) and 8 vector stores per 64 values: no pixel-major scratch between
    the gather and the transpose. Without ``nan_check`` the 16-bit rounding assumes no value is NaN (see
    :func:`nan_free`)."""

    @intrinsic
    def gather_block(typingctx, src, pix, k0, b0, offset, scale, alpha, noise, nstride, std, dst, d0, dstride):
        arrays = (src, pix, offset, scale, noise, dst)
        if not (all(isinstance(a, types.Array) for a in arrays) and isinstance(offset.dtype, types.Float)
                and all(isinstance(a.dtype, (types.Integer, types.Float)) for a in (src, noise, dst))):
            return None
        compute = offset.dtype
        sig = types.void(src, pix, types.intp, types.intp, offset, scale, compute, noise, types.intp, compute, dst,
                         types.intp, types.intp)

        def codegen(context, builder, signature, args):
            srcv, pixv, k0v, b0v, offv, scalev, alphav, noisev, nstridev, stdv, dstv, d0v, dstridev = args
            sary, pary, oary, cary, nary, dary = (context.make_array(signature.args[i])(context, builder, v) for i, v
                                                  in ((0, srcv), (1, pixv), (4, offv), (5, scalev), (7, noisev),
                                                      (10, dstv)))
            intp = k0v.type
            fvec = _vector8(context, compute)

            def load8(ary, dtype, index):
                return _load8(context, builder, ary, dtype, index)

            def splat(value):
                vec = ir.Constant(fvec, ir.Undefined)
                for i in range(8):
                    vec = builder.insert_element(vec, value, ir.Constant(ir.IntType(32), i))
                return vec

            off, scale_ = load8(oary, compute, b0v), load8(cary, compute, b0v)
            alpha_, std_ = (splat(alphav), splat(stdv)) if noisy else (None, None)
            rows = []
            for r in range(8):
                k = builder.add(k0v, ir.Constant(intp, r))
                first = builder.load(builder.gep(pary.data, [k]))
                v = _to_float(builder, load8(sary, signature.args[0].dtype, builder.add(first, b0v)),
                              signature.args[0].dtype, fvec)
                v = builder.fmul(builder.fsub(v, off), scale_)
                if noisy:
                    nz = load8(nary, signature.args[7].dtype, builder.add(builder.mul(k, nstridev), b0v))
                    v = builder.fadd(builder.fmul(v, alpha_),
                                     builder.fmul(std_, _to_float(builder, nz, signature.args[7].dtype, fvec)))
                rows.append(v)
            out = signature.args[10].dtype
            if isinstance(out, types.Integer):
                if out.signed and not _VECTOR_HALF:  # cut_patches sends no float16 patch to the blocks then
                    _trap(builder)
                columns = (_f16_columns if out.signed and _VECTOR_HALF else _bf16_columns)(builder, rows, nan_check)
            else:
                columns = [_to_float(builder, col, compute, _vector8(context, out)) for col in _transposed(builder, rows)]
            for m, col in enumerate(columns):
                at = builder.add(d0v, builder.mul(dstridev, ir.Constant(intp, m)))
                ptr = builder.bitcast(builder.gep(dary.data, [at]), col.type.as_pointer())
                builder.store(col, ptr, align=out.bitwidth // 8)
            return context.get_dummy_value()

        return sig, codegen

    return gather_block


def _bits(vec_type) -> int:
    """Bit width of a float vector's element type."""
    return {"half": 16, "float": 32, "double": 64}[str(vec_type.element)]


def _trap(builder):
    """Stop the process here: code that must compile but never runs (a half conversion where LLVM would call
    __truncsfhf2, which numba's JIT cannot link)."""
    builder.call(builder.module.declare_intrinsic("llvm.trap", (), ir.FunctionType(ir.VoidType(), [])), [])


def _vector8(context, dtype):
    """The LLVM type of 8 lanes of numba ``dtype``."""
    return ir.VectorType(context.get_data_type(dtype), 8)


def _load8(context, builder, ary, dtype, index):
    """8 consecutive ``dtype`` values of array ``ary`` (numba's array struct) from element ``index``."""
    ptr = builder.bitcast(builder.gep(ary.data, [index]), _vector8(context, dtype).as_pointer())
    return builder.load(ptr, align=dtype.bitwidth // 8)


def _to_float(builder, v, dtype, target):
    """Vector ``v`` of numba ``dtype`` values converted to the float vector type ``target``."""
    if isinstance(dtype, types.Integer):
        return (builder.sitofp if dtype.signed else builder.uitofp)(v, target)
    if v.type == target:
        return v
    return (builder.fpext if _bits(v.type) < _bits(target) else builder.fptrunc)(v, target)


@intrinsic
def normalize8(typingctx, src, s0, offset, scale, b0, dst, d0):
    """``dst[d0 + m] = round((src[s0 + m] - offset[b0 + m]) * scale[b0 + m])`` for m in 0..7, in
    ``offset``'s compute dtype, rounded to ``dst``'s kind as :func:`put` does (uint16: bfloat16 bits,
    int16: float16 bits, only where ``_VECTOR_HALF``; a float array: the value), on 8 lanes. Every value is
    loaded before any is stored, so ``dst`` may overlap ``src`` (:func:`normalize_tile` in place)."""
    arrays = (src, offset, scale, dst)
    if not (all(isinstance(a, types.Array) for a in arrays) and isinstance(offset.dtype, types.Float)
            and all(isinstance(a.dtype, (types.Integer, types.Float)) for a in (src, dst))):
        return None
    compute = offset.dtype
    sig = types.void(src, types.intp, offset, scale, types.intp, dst, types.intp)

    def codegen(context, builder, signature, args):
        srcv, s0v, offv, scalev, b0v, dstv, d0v = args
        sary, oary, cary, dary = (context.make_array(signature.args[i])(context, builder, v) for i, v in
                                  ((0, srcv), (2, offv), (3, scalev), (5, dstv)))
        fvec, out = _vector8(context, compute), signature.args[5].dtype
        v = _to_float(builder, _load8(context, builder, sary, signature.args[0].dtype, s0v), signature.args[0].dtype,
                      fvec)
        v = builder.fmul(builder.fsub(v, _load8(context, builder, oary, compute, b0v)),
                         _load8(context, builder, cary, compute, b0v))
        i16x8 = ir.VectorType(ir.IntType(16), 8)
        if isinstance(out, types.Integer) and out.signed and not _VECTOR_HALF:
            _trap(builder)  # normalize_tile sends no float16 here then (see _vector_half)
            return context.get_dummy_value()
        if isinstance(out, types.Integer) and out.signed:
            v = _half_bits(builder, v if compute.bitwidth == 32 else builder.fptrunc(v, _vector8(context, types.float32)),
                           True)
        elif isinstance(out, types.Integer):
            high = _bf16_high(builder, v, True)
            v = builder.trunc(builder.lshr(high, ir.Constant(high.type, [16] * 8)), i16x8)
        else:
            v = _to_float(builder, v, compute, _vector8(context, out))
        ptr = builder.bitcast(builder.gep(dary.data, [d0v]), v.type.as_pointer())
        builder.store(v, ptr, align=out.bitwidth // 8)
        return context.get_dummy_value()

    return sig, codegen


gather_block = _gather_block(noisy=False)
gather_block_nan_free = _gather_block(noisy=False, nan_check=False)
gather_block_noisy = _gather_block(noisy=True)


def integer_values(ary):
    """Whether ``ary`` holds integers (its dtype, known when numba compiles the caller)."""
    return np.issubdtype(ary.dtype, np.integer)


@overload(integer_values)
def _integer_values(ary):
    answer = isinstance(ary.dtype, types.Integer)
    return lambda ary: answer


@jit
def finite_tables(offset, scale):
    """Whether every offset and scale is finite. A function of its own, not of the tile's dtype: compiled
    once per compute dtype instead of once per (tile, output) dtype pair (~0.6 s each on the 2-core VM)."""
    for values in (offset, scale):
        for v in values.flat:
            if not np.isfinite(v):
                return False
    return True


@jit
def nan_free(src, offset, scale):
    """Whether no value cut without noise can be NaN: integers minus a finite offset times a finite scale
    are finite or, past float32's range, infinite. Then the bfloat16 rounding needs no NaN test (the
    test and its select took a third of the bfloat16 block's time)."""
    return integer_values(src) and finite_tables(offset, scale)


#: llvm.prefetch's locality of the kernels' source prefetches: 2 = into L2 (see :func:`prefetch`)
PREFETCH_LOCALITY = 2


@intrinsic
def prefetch(typingctx, ary, index):
    """Ask for the cache line holding ``ary[index]`` ahead of its use (a hint: no fault, no result), into
    the core's L2 (prefetcht1 on x86), not L1: the lines of the next patch arrive while the current one's
    blocks use L1. Against L1 (prefetcht0) on the Intel Xeon VM of CPU run 23: 4-5% faster in the kernel
    alone on 2 threads (Pavia-sized and Indian Pines rings); through the loader, alternated epoch by epoch
    in two spells, Pavia-sized float32 1.04x and 1.05x, bfloat16 1.03x and 1.08x, Indian Pines float32 1.01x
    (benchmarks/README.md, run 24). Locality 0 (prefetchnta) halved the kernel's speed."""
    if not isinstance(ary, types.Array):
        return None
    sig = types.void(ary, types.intp)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", [ptr.type],
                                              ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]))
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, PREFETCH_LOCALITY), ir.Constant(i32, 1)])  # read, data
        return context.get_dummy_value()

    return sig, codegen


@jit
def prefetch_rows(src, q, side, stride, p, part, parts):
    """Part ``part`` of ``parts`` of the cache lines of the p x p window whose top-left pixel starts at
    element ``q`` (p rows of p*stride contiguous elements, side*stride apart)."""
    step = max(1, 64 // src.itemsize)
    per_row = (p * stride + step - 1) // step
    lines = p * per_row
    line, end = part * lines // parts, (part + 1) * lines // parts
    r = line // per_row
    c = line - r * per_row
    at = q + r * side * stride + c * step
    while line < end:  # no division per line
        prefetch(src, at)
        line += 1
        c += 1
        at += step
        if c == per_row:
            c = 0
            r += 1
            at = q + r * side * stride

@jit
def bf16_bits(u):  # u: float32 bits as int64; torch's round_to_nearest_even (NaN -> 0x7FC0)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return 0x7FC0
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


@jit
def f16_bits(u):  # u: float32 bits as int64; IEEE binary16, round to nearest even
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:  # NaN: quiet, sign kept
        return sign | 0x7E00
    if a >= 0x47800000:  # >= 65536 (and inf): infinity; 65520..65535 round up below
        return sign | 0x7C00
    e = a >> 23
    if e >= 113:  # a normal half: rebias the exponent, round the 13 dropped mantissa bits
        h = ((e - 112) << 10) | ((a & 0x7FFFFF) >> 13)
        rem = a & 0x1FFF
        if rem > 0x1000 or (rem == 0x1000 and (h & 1) == 1):
            h += 1  # a carry into the exponent is the right result (up to infinity)
        return sign | h
    if e < 102:  # below 2**-25: rounds to zero
        return sign
    m = (a & 0x7FFFFF) | 0x800000  # a subnormal half: units of 2**-24
    shift = 126 - e
    q = m >> shift
    rem = m & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return sign | q


@jit
def row_source(i, p, side, d):
    """(first pixel, step) in flat pixels, relative to the patch's top-left, of output row i under
    dihedral code d = 4*t + 2*v + h."""
    t, v, h = (d >> 2) & 1, (d >> 1) & 1, d & 1
    if t:
        return (p - 1 if v else 0) * side + (p - 1 - i if h else i), (-side if v else side)
    return (p - 1 - i if v else i) * side + (p - 1 if h else 0), (-1 if h else 1)


@intrinsic
def float32_bits(typingctx, x):
    """The bits of a float32 (a float64 is first rounded to float32) as uint32: a register move."""
    if not isinstance(x, types.Float):
        return None
    sig = types.uint32(x)

    def codegen(context, builder, signature, args):
        v = args[0]
        if signature.args[0].bitwidth == 64:
            v = builder.fptrunc(v, ir.FloatType())
        return builder.bitcast(v, ir.IntType(32))

    return sig, codegen


@intrinsic
def _f16_converted(typingctx, x):
    """The float16 bits of a float32 (a float64 is first rounded to float32) by :func:`_half_bits`: one
    instruction with F16C, and a loop of them vectorizes. Only where ``_VECTOR_HALF``."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if signature.args[0].bitwidth == 64:
            v = builder.fptrunc(v, ir.FloatType())
        return _half_bits(builder, v, True)

    return types.uint16(x), codegen


@jit
def _f16_rounded(x):
    return f16_bits(np.int64(float32_bits(x)))


f16_of = _f16_converted if _VECTOR_HALF else _f16_rounded  # the float16 bits of a float


def put(r, b, v):
    """r[b] = v in the output's kind (:func:`output_kind`), decided when numba compiles the caller."""


@overload(put)
def _put(r, b, v):
    kind = _kind(r.dtype)
    if kind == 0:
        def store(r, b, v):
            r[b] = v
    elif kind == 1:
        def store(r, b, v):
            r[b] = bf16_bits(np.int64(float32_bits(v)))
    else:
        def store(r, b, v):
            r[b] = f16_of(v)
    return store


def output_kind(out):
    """What ``out``'s values mean: 0 the computed values (a float array), 1 bfloat16 bits (uint16), 2
    float16 bits (int16; :func:`hsgds.engines.cpu_cut.cut_range` passes float16 outputs so). A constant
    of the compiled code: one kernel per output dtype holds only its own rounding."""


@overload(output_kind)
def _output_kind(out):
    kind = _kind(out.dtype)
    return lambda out: kind


def _kind(dtype) -> int:
    return 0 if isinstance(dtype, types.Float) else 2 if dtype.signed else 1


@jit
def gather_row(src, first, step, bands, ws, p, band, identity, offset, scale, w, alpha, noise, std):
    """Cast and normalize p source pixels (``step`` elements apart from element ``first``) into ``w``
    (p pixels ``ws`` >= B values apart, pixel-major), rounded to the output's kind (``put``). ``band``: the stored band of
    each output band; ``identity``: it is 0..B-1, so the output bands are the pixel's first B values in
    order (a contiguous run). Slices (views) tell numba that each run is contiguous, so LLVM vectorizes
    the band loop (indexing the flat arrays directly leaves it scalar, ~3x slower). ``noise`` (the row's
    p*B noise values, pixel-major; empty: none): value <- alpha * value + std * noise, in the compute
    dtype, before the rounding."""
    cast = offset.dtype.type  # the compute dtype: float32, or float64 for a float64 output
    a, sd = cast(alpha), cast(std)
    for j in range(p):
        q = first + j * step
        r = w[j * ws:j * ws + bands]
        if noise.size > 0:
            nz = noise[j * bands:(j + 1) * bands]
            if identity:
                s = src[q:q + bands]
                for b in range(bands):
                    put(r, b, ((cast(s[b]) - offset[b]) * scale[b]) * a + sd * cast(nz[b]))
            else:
                for b in range(bands):
                    put(r, b, ((cast(src[q + band[b]]) - offset[b]) * scale[b]) * a + sd * cast(nz[b]))
        elif identity:
            s = src[q:q + bands]
            for b in range(bands):
                put(r, b, (cast(s[b]) - offset[b]) * scale[b])
        else:
            for b in range(bands):
                put(r, b, (cast(src[q + band[b]]) - offset[b]) * scale[b])


@jit
def block_starts(n):
    """The first index of each 8-wide block over 0..n-1 (n >= 8): 0, 8, 16, ..., the last block ending at
    n and overlapping the one before when n is not a multiple of 8 (its values written twice)."""
    starts = np.empty((n + 7) // 8, np.int64)
    for g in range(starts.size):
        starts[g] = min(8 * g, n - 8)
    return starts


@jit
def store_nchw(st, out, o, pp, bands, ss):
    """Write one patch held pixel-major in ``st`` (pp pixels ``ss`` >= B values apart, in output order) as
    band planes out[o + b*pp + k]: 8x8 blocks transposed in registers, band blocks outermost so that each
    of the 8 planes being written is filled front to back while the scratch column stays in L1. Blocks
    overlap at the edges (the same values written twice), so any pp, B >= 8 needs no scalar tail; smaller
    ones are copied one value at a time."""
    if pp >= 8 and bands >= 8:
        pixels = block_starts(pp)
        for bb in block_starts(bands):
            for kk in pixels:
                transpose8(st, kk * ss + bb, ss, out, o + bb * pp + kk, pp)
    else:
        for b in range(bands):
            dst = out[o + b * pp:o + (b + 1) * pp]
            for k in range(pp):
                dst[k] = st[k * ss + b]


@jit
def gather_patch(src, base, d, side, stride, bands, ws, p, band, identity, offset, scale, w, alpha, noise, std):
    """The patch whose top-left pixel starts at element ``base`` (tiles ``side`` pixels wide, ``stride``
    values per pixel) under dihedral code ``d`` into ``w`` (p*p pixels ``ws`` values apart, pixel-major
    in output order), cast and normalized; with radiation noise when ``noise`` (the patch's window, p*p*B
    values in the output's pixel-major order) is not empty."""
    row = p * ws
    for i in range(p):
        first, step = row_source(i, p, side, d)
        nz = noise[i * p * bands:(i + 1) * p * bands] if noise.size > 0 else noise
        gather_row(src, base + first * stride, step * stride, bands, ws, p, band, identity, offset, scale,
                   w[i * row:(i + 1) * row], alpha, nz, std)


@jit
def patch_pixels(pix, q, p, side, stride, d):
    """pix[i*p + j] = the first element of output pixel (i, j) of the patch whose top-left pixel starts at
    element ``q`` (tiles ``side`` pixels wide, ``stride`` values per pixel), under dihedral code ``d``."""
    for i in range(p):
        first, step = row_source(i, p, side, d)
        for j in range(p):
            pix[i * p + j] = q + (first + j * step) * stride


@jit
def cut_blocked(src, q, d, side, stride, bands, p, band, offset, scale, out, o, stream, phase, pix, whole, rad, alpha,
                window, std, drop, ahead, finite, band_blocks, pixel_blocks):  # ahead: the next patch's (q, side, stride)
    """One NCHW patch (p*p and B >= 8; a band map of runs of >= 8 bands, hsgds.engines.cpu_cut.band_blocks)
    cut in 8 x 8 register blocks (:func:`gather_block`) straight from the tile: the pixel addresses first (``pix``, in
    output order under dihedral code ``d``), then 8 band planes at a time, which are contiguous in the
    output; streamed, the whole patch is finished in ``whole`` (p*p*B values, in L2) and then written out
    with non-temporal stores in one sequential pass (streaming each group of 8 planes as soon as it was
    finished, between the gathers of the next, took about twice as long per patch on the 2-core VM).
    ``band_blocks``: the first output band of each block, whose 8 stored bands are contiguous from
    ``band[bb]``; a run's blocks overlap at its end, as the pixel blocks (``pixel_blocks``, the
    :func:`block_starts` of p*p) do (the same values written twice, as in :func:`store_nchw`). For a run's
    blocks the addresses are shifted by ``band[bb] - bb``, so the intrinsic reads the run's stored bands
    and the output bands' statistics and noise."""
    pp = p * p
    patch_pixels(pix, q, p, side, stride, d)
    dst = whole if stream else out
    shift = 0  # pix[k] = pixel k's first element + shift
    for g in range(band_blocks.size):
        bb = band_blocks[g]
        delta = band[bb] - bb
        if delta != shift:
            for k in range(pp):
                pix[k] += delta - shift
            shift = delta
        if ahead[0] >= 0:
            prefetch_rows(src, ahead[0], ahead[1], ahead[2], p, g, band_blocks.size)
        d0 = bb * pp if stream else o + bb * pp
        for kk in pixel_blocks:
            if rad:
                gather_block_noisy(src, pix, kk, bb, offset, scale, alpha, window, bands, std, dst, d0 + kk, pp)
            elif finite:
                gather_block_nan_free(src, pix, kk, bb, offset, scale, alpha, window, bands, std, dst, d0 + kk, pp)
            else:
                gather_block(src, pix, kk, bb, offset, scale, alpha, window, bands, std, dst, d0 + kk, pp)
        for b in drop:
            if bb <= b < bb + 8:
                plane = dst[d0 + (b - bb) * pp:d0 + (b - bb + 1) * pp]
                for k in range(pp):
                    plane[k] = 0
    if stream:
        stream_copy(whole, out, o, pp * bands, phase)


@jit
def patch_args(n, base, table, dihedral, side, stride, band, identity):
    """(first element, dihedral code, table, side, stride, identity) of patch n; see cut_patches."""
    t = table[n] if table.size > 0 else 0
    d = dihedral[n] if dihedral.size > 0 else 0
    return base[n], d, t, side[t], stride[t], identity[t] != 0


@jit
def stream_copy(w, out, o, size, phase):
    """out[o:o + size] = w[:size] with non-temporal stores; ``phase``: the element index of ``out``'s first
    element within its 32-byte block, so that the aligned stores start where they can."""
    k = 32 // out.itemsize
    head = min((k - (phase + o) % k) % k, size)
    for i in range(head):
        out[o + i] = w[i]
    i = head
    while i + k <= size:
        stream32(w, i, out, o + i)
        i += k
    for j in range(i, size):
        out[o + j] = w[j]


@jit
def finish_patch(w, out, o, pp, bands, ws, nchw, whole, phase, stream, drop):
    """A patch held pixel-major in ``w`` (output dtype, pixels ``ws`` values apart; NHWC not streamed:
    ``w`` is out[o:o + pp*B] itself) into out[o:o + pp*B] in its layout, the bands ``drop`` zeroed (0 bits
    are +0.0 in every dtype); streamed: finished in ``whole`` (NCHW) or ``w`` (NHWC), in cache, and copied
    out with non-temporal stores. NCHW zeroes whole band planes after the transpose (contiguous runs)."""
    if nchw:
        dst = whole if stream else out
        d0 = 0 if stream else o
        store_nchw(w, dst, d0, pp, bands, ws)
        for b in drop:
            plane = dst[d0 + b * pp:d0 + (b + 1) * pp]
            for k in range(pp):
                plane[k] = 0
        if stream:
            stream_copy(whole, out, o, pp * bands, phase)
    else:
        for b in drop:
            for k in range(pp):
                w[k * bands + b] = 0
        if stream:
            stream_copy(w, out, o, pp * bands, phase)


@jit
def augments(n, alpha, start, drop_ptr, drop_band):
    """(radiation noise?, dropped bands) of patch n: empty arrays mean none for the whole batch; a
    negative start, no noise for this patch."""
    rad = alpha.size > 0 and start[n] >= 0
    if drop_ptr.size > 0:
        return rad, drop_band[drop_ptr[n]:drop_ptr[n + 1]]
    return rad, drop_band[:0]


@jit
def scratch_stride(bands, nchw):
    """Values per pixel in a patch's pixel-major scratch: B for NHWC (the scratch is the output's order);
    for NCHW, B rounded up to 8, so that the transpose's 8-value loads start 32-byte (16-bit: 16-byte)
    aligned: with 103 bands the transpose took 0.50 ns per value, with 104 0.29 ns."""
    return (bands + 7) // 8 * 8 if nchw else bands


# Arguments of cut_patches: see hsgds.engines.cpu_cut.cut_range (per-table arrays indexed by each patch's table; empty
# ``table``/``dihedral``: table 0 / code 0 for every patch). NHWC: a patch is gathered straight into its
# output (after the rounding, for 16-bit outputs). NCHW with p*p and B >= 8 and a band map of runs of at
# least 8 consecutive stored bands (all bands, or e.g. all but the water-vapour bands: ``block_plan``,
# ``block_count``, ``block_start``, see hsgds.engines.cpu_cut.Tables; bfloat16: on a little-endian machine;
# float16: with _VECTOR_HALF): 8 x 8 register blocks straight from the tile (cut_blocked), the next patch's
# rows prefetched meanwhile (a patch's 13 rows of 5 KB sit in memory, not in cache: prefetching them took a
# cache-resident Indian Pines float32 cut from 20 to 10-12 us per patch). Other NCHW cuts: into a patch-sized
# scratch (L2-sized, rows padded to 8 values), then transposed into the B planes. ``stream`` (large batches): every patch is finished in cache and written out
# with non-temporal stores (stream_copy), then one fence.
#
# Noise arguments (hsgds.engines.cpu_cut.Noise; empty arrays: none): per patch ``alpha`` (float32) and
# ``start`` (int64, its noise window in ``bank``, negative for none), ``std`` the noise's standard
# deviation, and the dropped bands of patch n ``drop_band[drop_ptr[n]:drop_ptr[n + 1]]``. Noise is
# added as each value is gathered (its window read in the output's pixel-major order, front to back),
# in the compute dtype before the one rounding; dropped bands are zeroed last.

@jit
def cut_patches(src, base, table, dihedral, side, stride, band, identity, offset, scale, block_plan, block_count,
                block_start, out, p, nchw, phase, stream, alpha, start, bank, std, drop_ptr, drop_band, lo, hi):
    """Patches lo:hi of a batch into ``out``, whose dtype says what its values are (:func:`output_kind`).
    16-bit outputs: float32 arithmetic, rounded as each value is computed (after its noise, for a radiated
    patch)."""
    kind = output_kind(out)
    bands = offset.shape[1]
    pp = p * p
    size = pp * bands
    ws = scratch_stride(bands, nchw)
    staged = nchw or stream
    # the bfloat16 blocks pack two values per 32-bit lane little-endian
    blocked = (nchw and (kind == 0 or (kind == 1 and _LITTLE) or (kind == 2 and _VECTOR_HALF)) and pp >= 8
               and bands >= 8)
    staging = not blocked or not np.all(block_count > 0)  # some patch takes the scratch path (a band map)
    scratch = np.empty(pp * ws if staging else 0, out.dtype)
    whole = np.empty(size if nchw and stream else 0, out.dtype)  # a streamed NCHW patch, finished in cache
    pix = np.empty(pp if blocked else 0, np.int64)
    pixel_blocks = block_starts(pp) if blocked else pix[:0]
    finite = blocked and nan_free(src, offset, scale)
    for n in range(lo, hi):
        q, d, t, sd, st, ident = patch_args(n, base, table, dihedral, side, stride, band, identity)
        rad, drop = augments(n, alpha, start, drop_ptr, drop_band)
        o = n * size
        window = bank[start[n]:start[n] + size] if rad else bank[:0]
        a = alpha[n] if rad else np.float32(1)
        u = block_plan[t]  # the block plan of the table's band map
        if blocked and block_count[u] > 0:
            ahead = (-1, 0, 0)
            if n + 1 < hi:  # its tile may have another geometry (a collection's scenes)
                q1, _, _, sd1, st1, _ = patch_args(n + 1, base, table, dihedral, side, stride, band, identity)
                ahead = (q1, sd1, st1)
            cut_blocked(src, q, d, sd, st, bands, p, band[t], offset[t], scale[t], out, o, stream, phase, pix, whole,
                        rad, a, window, std, drop, ahead, finite, block_start[u, :block_count[u]], pixel_blocks)
            continue
        w = scratch if staged else out[o:o + size]
        gather_patch(src, q, d, sd, st, bands, ws, p, band[t], ident, offset[t], scale[t], w, a, window, std)
        finish_patch(w, out, o, pp, bands, ws, nchw, whole, phase, stream, drop)
    if stream:
        store_fence()


@jit_holding_gil
def patch_starts(slot, y, x, table, side, stride, slots, slot_elems, r, check, base):
    """base[i] = the element of the flat ring where sample i's patch starts (its top-left pixel: slot
    ``slot[i]``, centre (y[i], x[i]) in table ``table[i]``'s tile geometry; empty ``table``: table 0).
    Returns the first sample whose table does not exist or, with ``check``, whose slot does not exist or
    whose patch leaves its tile; -1 when every sample is inside. One pass instead of a dozen numpy calls
    on the training thread, where each costs a few µs more right after a cut has evicted its caches."""
    tables = side.size
    for i in range(slot.size):
        t = table[i] if table.size > 0 else 0
        if t < 0 or t >= tables:
            return i
        s, yy, xx, last = slot[i], y[i], x[i], side[t] - r - 1
        if check and (s < 0 or s >= slots or yy < r or yy > last or xx < r or xx > last):
            return i
        base[i] = s * slot_elems + ((yy - r) * side[t] + (xx - r)) * stride[t]
    return -1


@jit
def normalize_tile(src, first, side, stride, band, identity, offset, scale, dst, dfirst, dstride):
    """The side x side tile whose first pixel starts at ``src[first]`` (``stride`` values per pixel) as
    the output's values: pixel k's output band b cast, normalized and rounded to ``dst``'s kind
    (:func:`put`) exactly as :func:`cut_patches` computes it (:func:`gather_row`), written to
    ``dst[dfirst + k*dstride + b]``. ``dst`` may be ``src``'s own memory (the tile rewritten in place),
    when each pixel's output values fit in its own bytes: with every band in order, a value goes to a
    place no later than its own, so each pixel is rewritten in place, 8 bands per vector (:func:`normalize8`);
    a band map may read a band that was already overwritten, so each row goes through a scratch row."""
    bands = offset.shape[0]
    if identity and (output_kind(dst) != 2 or _VECTOR_HALF):
        cast = offset.dtype.type
        vector_end = bands - bands % 8
        for k in range(side * side):
            q, o = first + k * stride, dfirst + k * dstride
            for b in range(0, vector_end, 8):
                normalize8(src, q + b, offset, scale, b, dst, o + b)
            for b in range(vector_end, bands):
                put(dst, o + b, (cast(src[q + b]) - offset[b]) * scale[b])
        return
    scratch = np.empty(side * bands, dst.dtype)
    none = np.empty(0, np.float32)
    for i in range(side):
        gather_row(src, first + i * side * stride, stride, bands, bands, side, band, identity, offset, scale,
                   scratch, np.float32(1), none, np.float32(0))
        for j in range(side):
            o = dfirst + (i * side + j) * dstride
            dst[o:o + bands] = scratch[j * bands:(j + 1) * bands]


@jit
def copy_patches(src, base, table, dihedral, side, stride, bands, out, p, nchw, phase, stream, drop_ptr, drop_band,
                 lo, hi):
    """Patches lo:hi of a batch into ``out`` from tiles that already hold the output's values
    (:func:`normalize_tile`: a pixel's B output values first in its ``stride[t]`` elements): the layout,
    dihedral transform and band dropout of :func:`cut_patches`, with no arithmetic. NCHW with p*p and
    B >= 8: 8 x 8 blocks transposed in registers (:func:`copy_block`), the next patch's rows prefetched,
    streamed like :func:`cut_blocked`; NHWC: each pixel's B values copied as one run."""
    pp = p * p
    size = pp * bands
    blocked = nchw and pp >= 8 and bands >= 8
    whole = np.empty(size if nchw and stream else 0, out.dtype)
    pix = np.empty(pp, np.int64)
    band_blocks = block_starts(bands) if blocked else pix[:0]
    pixel_blocks = block_starts(pp) if blocked else pix[:0]
    for n in range(lo, hi):
        t = table[n] if table.size > 0 else 0
        d = dihedral[n] if dihedral.size > 0 else 0
        patch_pixels(pix, base[n], p, side[t], stride[t], d)
        o = n * size
        drop = drop_band[drop_ptr[n]:drop_ptr[n + 1]] if drop_ptr.size > 0 else drop_band[:0]
        if not nchw:
            for k in range(pp):
                out[o + k * bands:o + (k + 1) * bands] = src[pix[k]:pix[k] + bands]
                for b in drop:
                    out[o + k * bands + b] = 0
            continue
        dst = whole if stream else out
        d0 = 0 if stream else o
        if blocked:
            t1 = (table[n + 1] if table.size > 0 else 0) if n + 1 < hi else 0
            for g in range(band_blocks.size):
                bb = band_blocks[g]
                if n + 1 < hi:  # its tile may have another geometry (a collection's scenes)
                    prefetch_rows(src, base[n + 1], side[t1], stride[t1], p, g, band_blocks.size)
                for kk in pixel_blocks:
                    copy_block(src, pix, kk, bb, dst, d0 + bb * pp + kk, pp)
        else:
            for b in range(bands):
                for k in range(pp):
                    dst[d0 + b * pp + k] = src[pix[k] + b]
        for b in drop:
            plane = dst[d0 + b * pp:d0 + (b + 1) * pp]
            for k in range(pp):
                plane[k] = 0
        if stream:
            stream_copy(whole, out, o, size, phase)
    if stream:
        store_fence()
