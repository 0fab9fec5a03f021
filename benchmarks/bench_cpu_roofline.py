"""What bounds the fused CPU cut: store bandwidth with plain and non-temporal stores, against the kernel.

    python benchmarks/bench_cpu_roofline.py [--rounds 15] [--json out.json]

One batch of Indian Pines-shaped patches (256 x 13 x 13 x 200, uint16 ring of 4 tiles, float32 NCHW and
NHWC, bfloat16 NCHW) in one process, each figure the median of ``--rounds`` timed runs, 1 and 2 threads:

- ``memcpy``: ``np.copyto`` of the batch's bytes (glibc streams large copies: non-temporal stores);
- ``plain stores`` / ``streamed stores``: a numba loop writing the batch's bytes from a patch-sized
  buffer that stays in cache, with plain 32-byte vector stores or with the kernel's non-temporal ones
  (``hsgds.engines._cpu_kernel.stream32``): the write bandwidth a core gets either way;
- the kernel (``hsgds.engines.cpu_cut.cut_range``) writing the batch with plain stores and streamed, and
  into a cache-resident output (8 patches over and over), reading the batch's sources from the ring (the
  arithmetic and the source reads) or one patch's source over and over (the arithmetic alone);
- ``rounding loop in L1``: bfloat16 rounding of 4,096 float32 bit patterns held in L1, over and over (pure
  vector integer work, no memory traffic and no Python between calls): how much a second thread adds
  when the work is arithmetic alone (on a VM whose two vCPUs share one physical core, ~1.4x, not 2x);
- ``bfloat16 from normalized tiles``: the bfloat16 batch's memory work alone, as the loader cuts it when
  each tile already holds its bfloat16 bits (``cpu_cut.copy_range``: the same 8 x 8 blocks from the same
  ring into the NCHW planes of a patch finished in cache and streamed out, the next patch's rows
  prefetched, no arithmetic), and ``cpu_cut.normalize_tile`` rewriting one tile in place (what that costs
  once per tile load). The fused kernel's ratio to the copy (timed alternately, round by round, at the
  end) is what its arithmetic costs. The same copy in 16 x 16 blocks (32-byte stores, fewer shuffles per
  value) says whether wider blocks would move that floor.

Prints GB/s of output per row; needs numba (``pip install "hsgds[cpu]"``). Unlike the other benchmarks,
this one is white-box on purpose: it times the kernel's own store instruction and entry point, not the
loader, so it imports them from the engine's modules.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from hsgds.engines import cpu_cut
from hsgds.engines._cpu_kernel import _shuffle, prefetch_rows, store_fence, stream32, stream_copy

SIDE, BANDS, P, N = 96, 200, 13, 256
PATCH = BANDS * P * P


@numba.njit(nogil=True)
def _plain_fill(src, out, lo, hi):
    """out[lo:hi] from the cached patch ``src``, repeated, with plain stores (a copy loop: LLVM calls
    memcpy, whose size keeps it on plain stores)."""
    i = lo
    while i < hi:
        n = min(src.size, hi - i)
        d = out[i:i + n]
        for k in range(n):
            d[k] = src[k]
        i += n


@numba.njit(nogil=True)
def _rounding_loop(bits, out, reps):
    """bfloat16 rounding (round to nearest even) of ``bits`` into ``out``, ``reps`` times: both in L1."""
    for r in range(reps):
        for i in range(bits.size):
            u = bits[i] + r
            out[i] = np.uint16(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)


@numba.njit(nogil=True)
def _streamed_fill(src, out, lo, hi):
    """out[lo:hi] from the cached patch ``src``, repeated, with non-temporal 32-byte stores (``out``
    32-byte aligned, lo and the patch size multiples of 8 floats)."""
    i = lo
    while i < hi:
        n = min(src.size, hi - i)
        for k in range(0, n - 7, 8):
            stream32(src, k, out, i + k)
        i += n


def _butterfly(builder, rows):
    """The columns of n row vectors of n lanes (n a power of two): at each distance d, rows i and i + d swap
    their off-diagonal d x d blocks (n log2 n shuffles; for 16: 64 per 256 values, the 8 x 8 one 96)."""
    rows, n = list(rows), len(rows)
    d = 1
    while d < n:
        for i in (i for i in range(n) if not i & d):
            low = [j if not j & d else n + j - d for j in range(n)]
            high = [j + d if not j & d else n + j for j in range(n)]
            rows[i], rows[i + d] = _shuffle(builder, rows[i], rows[i + d], low), _shuffle(builder, rows[i], rows[i + d], high)
        d *= 2
    return rows


def _copy_block(n: int):
    """An intrinsic: dst[d0 + m*dstride + r] = src[pix[k0 + r] + b0 + m] for r, m in 0..n-1 (16-bit values):
    the kernel's copy_block (n vector loads, a transpose in registers, n vector stores) in n x n blocks."""
    transpose = _butterfly

    @intrinsic
    def copy_block(typingctx, src, pix, k0, b0, dst, d0, dstride):
        sig = types.void(src, pix, types.intp, types.intp, dst, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            srcv, pixv, k0v, b0v, dstv, d0v, dsv = args
            sary, pary, dary = (context.make_array(signature.args[i])(context, builder, v)
                                for i, v in ((0, srcv), (1, pixv), (4, dstv)))
            vec, intp = ir.VectorType(ir.IntType(16), n), k0v.type
            rows = []
            for r in range(n):
                first = builder.load(builder.gep(pary.data, [builder.add(k0v, ir.Constant(intp, r))]))
                rows.append(builder.load(builder.bitcast(builder.gep(sary.data, [builder.add(first, b0v)]),
                                                         vec.as_pointer()), align=2))
            for m, col in enumerate(transpose(builder, rows)):
                at = builder.add(d0v, builder.mul(dsv, ir.Constant(intp, m)))
                builder.store(col, builder.bitcast(builder.gep(dary.data, [at]), vec.as_pointer()), align=2)
            return context.get_dummy_value()

        return sig, codegen

    return copy_block


def _copy_cut_with(n: int):
    """Patches lo:hi as the kernel's streamed NCHW blocked path cuts them (identity transform, the next
    patch's rows prefetched, the patch finished in cache and streamed out), in n x n blocks, values copied
    (``out`` 32-byte aligned)."""
    block = _copy_block(n)

    @numba.njit(nogil=True)
    def copy_cut(src, base, out, p, side, bands, lo, hi):
        pp, groups = p * p, (bands + n - 1) // n
        pix = np.empty(pp, np.int64)
        whole = np.empty(pp * bands, out.dtype)
        for k in range(lo, hi):
            for i in range(p):
                for j in range(p):
                    pix[i * p + j] = base[k] + (i * side + j) * bands
            b0 = 0
            while True:
                bb = min(b0, bands - n)
                if k + 1 < hi:
                    prefetch_rows(src, base[k + 1], side, bands, p, b0 // n, groups)
                k0 = 0
                while True:
                    kk = min(k0, pp - n)
                    block(src, pix, kk, bb, whole, bb * pp + kk, pp)
                    if kk == pp - n:
                        break
                    k0 += n
                if bb == bands - n:
                    break
                b0 += n
            stream_copy(whole, out, k * pp * bands, pp * bands, 0)
        store_fence()

    return copy_cut


_copy_cut16 = _copy_cut_with(16)


def _aligned(n: int, dtype) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(n + 64 // itemsize, dtype)
    skip = (-raw.ctypes.data % 64) // itemsize
    return raw[skip:skip + n]


def _cpu_ticks() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs since boot (Linux /proc/stat; zeros elsewhere): on a VM, steal is
    the time the host ran something else on our cores."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return values[7], sum(values)
    except (OSError, IndexError, ValueError):
        return 0, 0


def _median_s(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not cpu_cut.available():
        raise SystemExit(cpu_cut.unavailable_reason())
    rng = np.random.default_rng(0)
    ring = rng.integers(0, 9000, (4, SIDE, SIDE, BANDS)).astype(np.uint16).reshape(-1)
    base = ((rng.integers(0, 4, N) * SIDE + rng.integers(0, SIDE - P + 1, N)) * SIDE
            + rng.integers(0, SIDE - P + 1, N)) * BANDS
    pool = ThreadPoolExecutor(2)
    steal0, total0 = _cpu_ticks()

    def threads(fn, k: int, n: int, step: int = 1):
        """fn(lo, hi) over [0, n) split into k parts (multiples of ``step``) on the pool."""
        edges = [n * i // k // step * step for i in range(k)] + [n]
        if k == 1:
            return lambda: fn(0, n)
        return lambda: [f.result() for f in [pool.submit(fn, a, b) for a, b in zip(edges[:-1], edges[1:])]]

    rows = []

    def add(name: str, nbytes: int, fn1, fn2) -> None:
        r = {"what": name, "MB": nbytes / 1e6}
        for k, fn in ((1, fn1), (2, fn2)):
            r[f"GBps_{k}_thread"] = nbytes / _median_s(fn, args.rounds) / 1e9
        rows.append(r)
        print(f"{name:66s} {r['GBps_1_thread']:6.2f} GB/s (1 thread) {r['GBps_2_thread']:6.2f} GB/s (2 threads)",
              flush=True)

    out32 = _aligned(N * PATCH, np.float32)
    src32 = np.ones(N * PATCH, np.float32)
    cached = np.ones(PATCH, np.float32)
    nbytes = out32.nbytes
    add("memcpy (np.copyto, float32 batch)", nbytes, lambda: np.copyto(out32, src32),
        threads(lambda a, b: np.copyto(out32[a:b], src32[a:b]), 2, out32.size, 8))
    for name, fill in (("plain stores", _plain_fill), ("streamed (non-temporal) stores", _streamed_fill)):
        add(name, nbytes, threads(lambda a, b, f=fill: f(cached, out32, a, b), 1, out32.size, 8),
            threads(lambda a, b, f=fill: f(cached, out32, a, b), 2, out32.size, 8))

    tables = cpu_cut.make_tables(SIDE, BANDS, np.arange(BANDS), rng.uniform(0, 5000, BANDS),
                                 rng.uniform(1e-4, 1e-3, BANDS), np.float32)
    for label, out, mode in (("float32", out32, 0), ("bfloat16", _aligned(N * PATCH, np.uint16), 1)):
        for nchw in ((True, False) if mode == 0 else (True,)):
            for stream in (False, True):
                def cut(a, b, out=out, mode=mode, nchw=nchw, stream=stream):
                    cpu_cut.cut_range(ring, base, None, None, tables, out, P, nchw, mode, a, b, stream)
                kind = f"kernel {label} {'NCHW' if nchw else 'NHWC'}, {'streamed' if stream else 'plain stores'}"
                add(kind, out.nbytes, threads(cut, 1, N), threads(cut, 2, N))
        small = [np.empty(8 * PATCH, out.dtype) for _ in range(2)]
        one = np.full(N, base[0])  # one patch's source over and over: stays in L1/L2

        for what, sources in (("sources from the ring", base), ("one source (arithmetic alone)", one)):
            def resident(i: int, mode=mode, small=small, sources=sources) -> None:  # 8 outputs over and over
                for r in range(N // 8):
                    cpu_cut.cut_range(ring, sources[r * 8:(r + 1) * 8], None, None, tables, small[i], P, True, mode,
                                      0, 8)

            add(f"kernel {label} NCHW, output in cache, {what}", N * PATCH * small[0].itemsize,
                lambda: resident(0), lambda: [f.result() for f in [pool.submit(resident, 0), pool.submit(resident, 1)]])
            rows[-1]["note"] = "2 threads: each cuts the whole batch, so the figure is per thread x 2"
            rows[-1]["GBps_2_thread"] *= 2
    out16 = _aligned(N * PATCH, np.uint16)

    def copy(a: int, b: int, out=out16) -> None:  # the ring's values taken as bfloat16 bits
        cpu_cut.copy_range(ring, base, None, None, tables, out, P, True, 1, a, b, True)

    add("bfloat16 NCHW from normalized tiles (copy_range, streamed)", out16.nbytes, threads(copy, 1, N),
        threads(copy, 2, N))
    tile = ring[:SIDE * SIDE * BANDS].copy()
    work = tile.copy()

    def normalize() -> None:  # one tile rewritten in place (from the same values each time)
        np.copyto(work, tile)
        cpu_cut.normalize_tile(work, 0, tables, 0, work, 0, BANDS)

    restore = _median_s(lambda: np.copyto(work, tile), args.rounds)
    per_tile = _median_s(normalize, args.rounds) - restore
    print(f"normalize_tile: {per_tile * 1e3:.2f} ms per {SIDE}x{SIDE}x{BANDS} tile in place, one thread "
          f"({tile.size / per_tile / 1e9:.2f} G values/s; the restoring copy's time taken off)", flush=True)
    wide = _aligned(N * PATCH, np.uint16)
    _copy_cut16(ring, base, wide, P, SIDE, BANDS, 0, N)
    copy(0, N)
    if not np.array_equal(wide, out16):
        raise SystemExit("the 16 x 16 copy differs from copy_range: fix it before reading its figures")
    add("the same in 16 x 16 blocks (32-byte stores)", wide.nbytes,
        threads(lambda a, b: _copy_cut16(ring, base, wide, P, SIDE, BANDS, a, b), 1, N),
        threads(lambda a, b: _copy_cut16(ring, base, wide, P, SIDE, BANDS, a, b), 2, N))
    loops = [(rng.integers(0, 2**31, 4096).astype(np.int32), np.empty(4096, np.uint16)) for _ in range(2)]
    reps = 200000  # ~0.25 s a run: long enough for both threads to overlap fully
    _rounding_loop(*loops[0], 1)
    add("rounding loop in L1 (arithmetic alone, bfloat16 output bytes)", reps * 4096 * 2,
        lambda: _rounding_loop(*loops[0], reps),
        lambda: [f.result() for f in [pool.submit(_rounding_loop, *loops[i], reps) for i in range(2)]])
    rows[-1]["note"] = "2 threads: each runs the whole loop, so the figure is per thread x 2"
    rows[-1]["GBps_2_thread"] *= 2
    call = _call_cost(ring, base, tables, out32)
    print(f"one kernel call with no patches (numba's dispatch of its {call['arguments']} arguments): "
          f"{call['empty_call_s'] * 1e6:.2f} us of CPU, {100 * call['share_of_half_batch']:.2f}% of a "
          f"{N // 2}-patch float32 call", flush=True)
    floor = _floor_ratios(ring, base, tables, out16, pool, args.rounds * 3)
    print(f"bfloat16 kernel time / no-arithmetic floor time, 2 threads, alternated round by round: plain stores "
          f"{floor['plain']['median']:.2f} (IQR {floor['plain']['q25']:.2f}-{floor['plain']['q75']:.2f}), streamed "
          f"{floor['streamed']['median']:.2f} (IQR {floor['streamed']['q25']:.2f}-{floor['streamed']['q75']:.2f}); "
          f"the 16 x 16 copy's {floor['copy16']['median']:.2f} (IQR {floor['copy16']['q25']:.2f}-"
          f"{floor['copy16']['q75']:.2f})")
    steal1, total1 = _cpu_ticks()
    steal = (steal1 - steal0) / max(1, total1 - total0)
    print(f"CPU time stolen by the host during the run: {100 * steal:.1f}%")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "batch": [N, BANDS, P, P], "numba": numba.__version__,
                                         "floor_ratios": floor, "normalize_tile_s": per_tile,
                                         "steal_fraction": steal, "kernel_call": call}, indent=2))


def _call_cost(ring, base, tables, out) -> dict:
    """CPU time of a kernel call that cuts nothing (what each cutting thread pays per batch besides the
    work: numba's unboxing of every argument), and its share of a call cutting half the batch."""
    def cpu_per_call(lo: int, hi: int, calls: int) -> float:
        t = time.process_time()
        for _ in range(calls):
            cpu_cut.cut_range(ring, base, None, None, tables, out, P, True, 0, lo, hi, False, None, 0)
        return (time.process_time() - t) / calls

    empty = min(cpu_per_call(0, 0, 20000) for _ in range(3))
    half = min(cpu_per_call(0, N // 2, 20) for _ in range(3))
    kernel = cpu_cut._compiled().cut_patches
    arguments = len(kernel.signatures[0]) if kernel.signatures else 0
    return {"empty_call_s": empty, "half_batch_call_s": half, "share_of_half_batch": empty / half,
            "arguments": arguments}


def _floor_ratios(ring, base, tables, out, pool, rounds: int) -> dict:
    """The bfloat16 kernel's time over the no-arithmetic copy's (copy_range), both on 2 threads, timed alternately in each
    round (this VM's speed drifts between the rows above): what the arithmetic adds to the memory work."""
    def two(fn) -> float:
        t = time.perf_counter()
        for f in [pool.submit(fn, 0, N // 2), pool.submit(fn, N // 2, N)]:
            f.result()
        return time.perf_counter() - t

    fns = {"plain": lambda a, b: cpu_cut.cut_range(ring, base, None, None, tables, out, P, True, 1, a, b, False),
           "streamed": lambda a, b: cpu_cut.cut_range(ring, base, None, None, tables, out, P, True, 1, a, b, True),
           "copy16": lambda a, b: _copy_cut16(ring, base, out, P, SIDE, BANDS, a, b),
           "copy": lambda a, b: cpu_cut.copy_range(ring, base, None, None, tables, out, P, True, 1, a, b, True)}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(two(fn))
    copy = np.array(times["copy"])
    return {k: dict(zip(("q25", "median", "q75"), np.percentile(np.array(times[k]) / copy, [25, 50, 75]).tolist()))
            for k in ("plain", "streamed", "copy16")}


if __name__ == "__main__":
    main()
