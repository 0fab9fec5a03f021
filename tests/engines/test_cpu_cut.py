"""The fused CPU kernel (hsgds.engines.cpu_cut) against numpy and torch, and the engine's fallback without it.

References are independent: patches sliced sample by sample with numpy, dihedral transforms composed from
``np.flip``/``np.swapaxes``, 16-bit roundings done by torch's own ``Tensor.to`` on the float32 result.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

from hsgds import defaults  # noqa: E402
from hsgds.augment import apply_dihedral_numpy  # noqa: E402
from hsgds.engines import PatchSpec, TorchEngine, cpu_cut  # noqa: E402
from hsgds.errors import InputError  # noqa: E402

from .kernel_pairs import CUT_PAIRS, OUT_DTYPES  # noqa: E402


def _storage(dtype: str, slots: int, side: int, bands: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (slots, side, side, bands)
    if dtype.startswith("float"):
        return rng.uniform(-3e4, 3e4, shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def _reference(storage: np.ndarray, slot, y, x, p: int, offset, scale, out_dtype: str, nchw: bool,
               dihedral=None) -> torch.Tensor:
    """numpy slices and flips, float32 arithmetic (float64 for a float64 output), torch's rounding."""
    r = p // 2
    compute = np.float64 if out_dtype == "float64" else np.float32
    patches = []
    for k, (s, a, b) in enumerate(zip(slot, y, x)):
        q = storage[s, a - r:a + r + 1, b - r:b + r + 1, :]
        if dihedral is not None:
            c = int(dihedral[k])
            t, v, h = (c >> 2) & 1, (c >> 1) & 1, c & 1
            if v:
                q = np.flip(q, 0)
            if h:
                q = np.flip(q, 1)
            if t:
                q = np.swapaxes(q, 0, 1)
        patches.append(q)
    f = np.stack(patches).astype(compute)
    f = (f - offset.astype(compute)) * scale.astype(compute)
    if nchw:
        f = f.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(f)).to(getattr(torch, out_dtype))


def _kernel_cut(storage: np.ndarray, slot, y, x, p: int, offset, scale, out_dtype: str, nchw: bool,
                dihedral=None, ranges=None, stream=False, shift=0) -> torch.Tensor:
    """Call cut_range directly (the engine's own use of it is tested through TorchEngine below).
    ``stream``: non-temporal stores; ``shift``: the output starts ``shift`` elements into its buffer, so
    the streamed stores meet every alignment of the first and last 32-byte block."""
    slots, side, _, bands = storage.shape
    r = p // 2
    n = len(slot)
    base = ((np.asarray(slot) * side + (np.asarray(y) - r)) * side + (np.asarray(x) - r)).astype(np.int64) * bands
    compute = np.float64 if out_dtype == "float64" else np.float32
    shape = (n, bands, p, p) if nchw else (n, p, p, bands)
    out = torch.empty(int(np.prod(shape)) + shift, dtype=getattr(torch, out_dtype))[shift:].view(shape)
    mode = cpu_cut.MODES[out_dtype]
    dst = out.view(-1).view(torch.int16).numpy().view(np.uint16) if mode else out.view(-1).numpy()
    tables = cpu_cut.make_tables(side, bands, np.arange(bands), offset, scale, compute)
    for lo, hi in ranges or [(0, n)]:
        cpu_cut.cut_range(storage.reshape(-1), base, None, dihedral, tables, dst, p, nchw, mode, lo, hi, stream)
    return out


def _equal_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    ia, ib = (t.view(torch.int16 if t.element_size() == 2 else torch.int32 if t.element_size() == 4 else
                     torch.int64) for t in (a, b))
    bad = (ia != ib).nonzero()
    assert len(bad) == 0, (f"{len(bad)} values differ, first at {bad[0].tolist()}: "
                           f"{a[tuple(bad[0])]} vs {b[tuple(bad[0])]}")


class _Draws:
    """Random radiation noise (``radiated`` patches, a bank of ``bank_size`` values, std 0.04) and band
    dropout (each band of each patch with probability ``drop``) for n patches, as the kernel takes them, and
    their numpy application to an NCHW reference."""

    def __init__(self, rng, n, bands, p, bank_size, radiated, drop):
        self.window, self.p, self.bands = bands * p * p, p, bands
        self.bank = rng.normal(size=bank_size).astype(np.float32)
        self.radiated = np.sort(rng.choice(n, radiated, replace=False))
        self.alpha = rng.uniform(0.9, 1.1, radiated).astype(np.float32)
        self.start = rng.integers(0, (bank_size - self.window) // 64, radiated) * 64
        self.dropped = np.argwhere(rng.random((n, bands)) < drop)
        self.noise = cpu_cut.make_noise(n, self.radiated, self.alpha, self.start, self.bank, 0.04, self.dropped)

    def apply(self, ref, compute):
        """``ref`` (N, B, p, p), normalized: noise on the radiated patches (window pixel-major), drops zeroed."""
        for k, i in enumerate(self.radiated):
            window = self.bank[self.start[k]:self.start[k] + self.window].astype(compute)
            ref[i] = ref[i] * compute(self.alpha[k]) + compute(np.float32(0.04)) * window.reshape(
                self.p, self.p, self.bands).transpose(2, 0, 1)
        ref[self.dropped[:, 0], self.dropped[:, 1]] = 0
        return ref


@pytest.mark.parametrize("store, out_dtype", CUT_PAIRS)
@pytest.mark.parametrize("nchw", [True, False], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("stream", [False, True], ids=["stores", "streamed"])
def test_every_dtype_and_layout_matches_numpy_bit_for_bit(store, out_dtype, nchw, stream):
    # p, B >= 8 and not multiples of 8: the register-transposed blocks, overlapping at both edges
    p, bands, side, slots = 9, 11, 14, 3
    storage = _storage(store, slots, side, bands, seed=1)
    rng = np.random.default_rng(2)
    n = 9
    slot, y, x = rng.integers(0, slots, n), rng.integers(4, side - 4, n), rng.integers(4, side - 4, n)
    lo, hi = float(storage.min()), float(storage.max())
    offset = rng.uniform(lo, hi, bands)
    scale = 8 / (hi - lo) * rng.uniform(0.5, 1.5, bands)
    ref = _reference(storage, slot, y, x, p, offset, scale, out_dtype, nchw)
    for shift in (0, 1, 3) if stream else (0,):
        _equal_bits(_kernel_cut(storage, slot, y, x, p, offset, scale, out_dtype, nchw, stream=stream, shift=shift), ref)


@pytest.mark.parametrize("p, bands, side", [(1, 1, 1), (1, 3, 4), (3, 1, 3), (7, 2, 9), (5, 7, 8), (3, 8, 3), (3, 9, 5),
                                           (9, 8, 9), (13, 33, 17), (15, 200, 15), (17, 16, 20)])
def test_odd_shapes_and_tile_edges(p, bands, side):
    """Patch size 1, one band, tiles exactly one patch wide, patches touching every tile edge."""
    storage = _storage("uint16", 2, side, bands, seed=p + bands)
    r = p // 2
    edges = [r, side - r - 1]
    slot = np.array([0, 1, 0, 1, 1])
    y = np.array([edges[0], edges[1], edges[1], edges[0], (side - 1) // 2])
    x = np.array([edges[0], edges[1], edges[0], edges[1], (side - 1) // 2])
    offset, scale = np.linspace(0, 3e4, bands), np.linspace(1e-4, 2e-4, bands)
    for out_dtype in ("float32", "bfloat16"):
        for nchw in (True, False):
            ref = _reference(storage, slot, y, x, p, offset, scale, out_dtype, nchw)
            for stream, shift in ((False, 0), (True, 0), (True, 5)):
                got = _kernel_cut(storage, slot, y, x, p, offset, scale, out_dtype, nchw, stream=stream, shift=shift)
                _equal_bits(got, ref)


@pytest.mark.parametrize("p, bands", [(1, 3), (3, 3), (5, 2), (9, 10)])
@pytest.mark.parametrize("nchw", [True, False], ids=["NCHW", "NHWC"])
def test_dihedral_codes_match_numpy_flips(p, bands, nchw):
    """Each of the 8 codes c = 4t + 2v + h against np.flip (v: rows, h: columns) then np.swapaxes (t)."""
    side = p + 4
    storage = _storage("int16", 2, side, bands, seed=5)
    r = p // 2
    codes = np.arange(8, dtype=np.int8).repeat(2)
    rng = np.random.default_rng(6)
    n = len(codes)
    slot, y, x = rng.integers(0, 2, n), rng.integers(r, side - r, n), rng.integers(r, side - r, n)
    offset, scale = np.zeros(bands), np.ones(bands)
    for out_dtype in ("float32", "bfloat16"):
        got = _kernel_cut(storage, slot, y, x, p, offset, scale, out_dtype, nchw, dihedral=codes)
        _equal_bits(got, _reference(storage, slot, y, x, p, offset, scale, out_dtype, nchw, dihedral=codes))
    # the identity code and no array at all are the same cut; a transposed patch is a different one
    ident = _kernel_cut(storage, slot, y, x, p, offset, scale, "float32", nchw, dihedral=np.zeros(n, np.int8))
    _equal_bits(ident, _kernel_cut(storage, slot, y, x, p, offset, scale, "float32", nchw))
    if p > 1:
        assert not torch.equal(ident, _kernel_cut(storage, slot, y, x, p, offset, scale, "float32", nchw,
                                                  dihedral=np.full(n, 4, np.int8)))


def test_16bit_roundings_match_torch_on_special_values():
    """bfloat16 and float16 bits equal torch's conversion of the float32 value: ties to even, subnormals,
    overflow to infinity, signed zeros, infinities (NaNs: NaN). Offset 0 and scale 1 pass values through."""
    rng = np.random.default_rng(7)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.99, 65520, 65536, -65520, 1e-8, 2**-24,
                         2**-25, 1.5 * 2**-25, 2**-14, 2**-14 - 2**-24, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8,
                         1 + 3 * 2**-8, 3.4e38, 1e-40, -1e-45], dtype=np.float32)
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([specials, bits, np.float32([np.nan, -np.nan])])
    storage = values.reshape(1, 1, -1, 1)  # one tile row of pixels, one band; p = 1
    side = values.size
    storage = np.zeros((1, side, side, 1), np.float32)
    storage[0, 0, :, 0] = values
    n = values.size
    slot, y, x = np.zeros(n, int), np.zeros(n, int), np.arange(n)
    f32 = torch.from_numpy(values.copy())
    for name in ("bfloat16", "float16"):
        got = _kernel_cut(storage, slot, y, x, 1, np.zeros(1), np.ones(1), name, True).view(-1)
        want = f32.to(getattr(torch, name))
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        _equal_bits(got[~nan], want[~nan])


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("stream", [False, True], ids=["stores", "streamed"])
def test_16bit_roundings_in_register_blocks_match_torch(out_dtype, stream):
    """NCHW patches with p*p and B >= 8 go through the 8 x 8 register blocks, whose 16-bit rounding is
    vectorized: float32 bit patterns of every kind (NaN, infinities, subnormals, ties; for float16 also
    its subnormals, ties and overflow) pass through with offset 0 and scale 1; an integer source whose
    scaled values overflow to infinity takes the block without the NaN test (no integer can become NaN)
    and must round the same."""
    rng = np.random.default_rng(8)
    side, bands, p = 6, 8, 3
    bits = rng.integers(0, 2**32, (2, side, side, bands), dtype=np.uint64).astype(np.uint32)
    if out_dtype == "float16":  # random bit patterns are mostly outside float16's range: half of them inside
        bits.reshape(-1)[::2] = rng.uniform(-7e4, 7e4, bits.size // 2).astype(np.float32).view(np.uint32)
        bits.reshape(-1)[1::4] = (rng.uniform(-1, 1, bits.size // 4) * 2.0**-13).astype(np.float32).view(np.uint32)
    bits.reshape(-1)[:6] = np.float32([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0]).view(np.uint32)
    bits.reshape(-1)[6:12] = np.array([0x3F808000, 0x3F818000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FC000])
    bits.reshape(-1)[12:22] = np.float32([65504, 65519.99, 65520, -65520, 2**-24, 2**-25, 1.5 * 2**-25,
                                          2**-14 - 2**-24, 1 + 2**-11, 1 + 3 * 2**-11]).view(np.uint32)
    bits.reshape(-1)[22:24] = np.array([0x7F800001, 0xFFFFFFFF])  # a signalling NaN, a NaN with a full payload
    storage = bits.view(np.float32)
    slot, y, x = np.repeat([0, 1], 16), np.tile(np.repeat(np.arange(1, 5), 4), 2), np.tile(np.arange(1, 5), 8)
    got = _kernel_cut(storage, slot, y, x, p, np.zeros(bands), np.ones(bands), out_dtype, True, stream=stream)
    with np.errstate(invalid="ignore"):  # signalling NaNs among the random bit patterns
        want = _reference(storage, slot, y, x, p, np.zeros(bands), np.ones(bands), out_dtype, True)
    nan = torch.isnan(want)
    assert nan.any() and torch.equal(torch.isnan(got), nan)
    _equal_bits(got[~nan], want[~nan])
    # the NaN bits hsgds writes (torch's vary by path): bfloat16 0x7FC0; float16 the sign and 0x7E00
    nans = {v & 0xFFFF for v in got[nan].view(torch.int16).tolist()}
    assert nans == ({0x7FC0} if out_dtype == "bfloat16" else {0x7E00, 0xFE00})

    ints = _storage("int32", 2, side, bands, seed=9)
    offset, scale = np.zeros(bands), np.geomspace(1e20, 1e32, bands)  # |v| * scale past float32's range
    with np.errstate(over="ignore"):
        want = _reference(ints, slot, y, x, p, offset, scale, out_dtype, True)
    assert torch.isinf(want).any() and not torch.isnan(want).any()
    _equal_bits(_kernel_cut(ints, slot, y, x, p, offset, scale, out_dtype, True, stream=stream), want)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stream", [False, True], ids=["stores", "streamed"])
def test_engine_kernel_equals_torch_ops_path(out_dtype, layout, stream, monkeypatch):
    """The engine's two CPU paths (numba kernel, torch ops) give the same bits, on several threads too;
    ``streamed``: every batch counts as large, so NCHW batches take the non-temporal stores."""
    if stream:
        monkeypatch.setattr(cpu_cut, "STREAM_BYTES", 0)
    bands, side, p = 17, 20, 7
    storage = torch.from_numpy(_storage("uint16", 3, side, bands, seed=8))
    rng = np.random.default_rng(9)
    spec = PatchSpec(p, 6, bands, side, layout, getattr(torch, out_dtype), rng.uniform(0, 6e4, bands),
                     rng.uniform(1e-5, 1e-3, bands))
    n = 61
    co = [torch.from_numpy(a) for a in (rng.integers(0, 3, n), rng.integers(3, side - 3, n),
                                        rng.integers(3, side - 3, n))]
    with defaults.set(numba=False):
        ops = TorchEngine(spec)
    fused = TorchEngine(spec)
    assert fused.reasons == ["CPU cut: fused numba kernel (hsgds.engines.cpu_cut)"]
    assert ops.reasons == ["CPU cut: torch ops (setting numba is off)"]
    _equal_bits(fused.cut(storage, *co), ops.cut(storage, *co))
    threads = torch.get_num_threads()
    try:  # several threads, each cutting ranges of a few patches
        torch.set_num_threads(3)
        with defaults.set(torch_chunk_bytes=4096):
            many = TorchEngine(spec)
        _equal_bits(many.cut(storage, *co), ops.cut(storage, *co))
    finally:
        torch.set_num_threads(threads)
    codes = torch.from_numpy(rng.integers(0, 8, n).astype(np.int8))  # per-patch flips/turns (hsgds.augment)
    _equal_bits(fused.cut(storage, *co, dihedral=codes), ops.cut(storage, *co, dihedral=codes))


def test_large_nchw_batches_are_streamed():
    big = cpu_cut.STREAM_BYTES
    assert cpu_cut.should_stream(big, True)
    assert not cpu_cut.should_stream(big - 1, True) and not cpu_cut.should_stream(big, False)


def test_source_rows_are_prefetched_into_l2():
    """The NCHW cut and the copy of normalized tiles prefetch the next patch's rows into L2 (llvm.prefetch
    locality 2, prefetcht1), not L1 (locality 3): measured faster on the Intel Xeon of CPU run 23. The hint
    changes no value, so its compiled code says which it is; the cuts themselves still match numpy."""
    import re

    rng = np.random.default_rng(3)
    p, bands, side, n = 5, 16, 12, 4
    storage = _storage("uint16", 2, side, bands, 3)
    offset, scale = rng.uniform(0, 3e4, bands), rng.uniform(1e-5, 1e-3, bands)
    slot, y, x = rng.integers(0, 2, n), rng.integers(2, side - 2, n), rng.integers(2, side - 2, n)
    tables = cpu_cut.make_tables(side, bands, np.arange(bands), offset, scale, np.float32)
    base, bad = cpu_cut.patch_starts(slot, y, x, None, tables, 2, side * side * bands, p // 2, True)
    assert bad == -1
    out = np.empty(n * p * p * bands, np.float32)
    cpu_cut.cut_range(storage.reshape(-1), base, None, None, tables, out, p, True, 0, 0, n, False)
    want = _reference(storage, slot, y, x, p, offset, scale, "float32", True)
    assert np.array_equal(out.view(np.uint32), want.numpy().reshape(-1).view(np.uint32))
    flat = storage.reshape(-1).astype(np.uint16)  # stands for a normalized ring (16-bit values)
    cpu_cut.copy_range(flat, base, None, None, tables, np.empty(n * p * p * bands, np.uint16), p, True, 1, 0, n)
    # the kernels' prefetches are this intrinsic, inlined: compiled afresh (numba cannot inspect cached code)
    import numba

    kernels = cpu_cut._compiled()
    fetch = numba.njit(cache=False)(lambda ary, i: kernels.prefetch(ary, i))
    fetch(flat, 0)
    code = "\n".join(fetch.inspect_llvm().values())
    localities = re.findall(r"call void @llvm\.prefetch[.\w]*\([^,]+, i32 0, i32 (\d), i32 1\)", code)
    assert localities and set(localities) == {"2"}, localities


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_per_scene_tables_kernel_equals_torch_ops_path(out_dtype, layout):
    """Several scenes in one batch (tile sides, values per pixel, band selections and statistics of their
    own), with per-patch dihedral codes: the kernel and the torch ops give the same bits."""
    from hsgds.engines.base import SceneTables

    rng = np.random.default_rng(10)
    p, n = 5, 97
    band = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8], [8, 0, 2, 4, 6, 1, 3, 5, 7], [0, 1, 2, 3, 4, 5, 6, 7, 8]])
    tables = SceneTables(side=np.array([12, 10, 11]), stride=np.array([9, 9, 12]), band=band,
                         offset=rng.uniform(0, 3e4, (3, 9)), scale=rng.uniform(1e-5, 1e-3, (3, 9)))
    storage = torch.from_numpy(rng.integers(0, 60000, (4, 12 * 12 * 12)).astype(np.uint16))
    table = rng.integers(0, 3, n)
    side = tables.side[table]
    co = [torch.from_numpy(a) for a in (rng.integers(0, 4, n), rng.integers(2, side - 2), rng.integers(2, side - 2),
                                        table)]
    spec = PatchSpec(p, 2, 9, 12, layout, getattr(torch, out_dtype), np.zeros(9), np.ones(9), tables=tables)
    with defaults.set(numba=False):
        ops = TorchEngine(spec)
    fused = TorchEngine(spec)
    assert "numba" in fused.reasons[0] and "numba is off" in ops.reasons[0]
    _equal_bits(fused.cut(storage, *co), ops.cut(storage, *co))
    codes = torch.from_numpy(rng.integers(0, 8, n).astype(np.int8))
    _equal_bits(fused.cut(storage, *co, dihedral=codes), ops.cut(storage, *co, dihedral=codes))


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stream", [False, True], ids=["stores", "streamed"])
def test_noise_and_dropout_in_the_cut_match_numpy(out_dtype, layout, stream, monkeypatch):
    """Radiation noise (alpha * value + std * the patch's bank window, pixel-major) and band dropout
    applied by the kernel, against numpy: the same float32 operations in the same order, then torch's
    rounding; dropped bands exactly +0; patches without draws untouched."""
    if stream:
        monkeypatch.setattr(cpu_cut, "STREAM_BYTES", 0)
    bands, side, p, n = 11, 16, 5, 40
    storage = _storage("int16", 3, side, bands, seed=11)
    rng = np.random.default_rng(12)
    offset, scale = rng.uniform(-100, 100, bands), rng.uniform(1e-4, 1e-3, bands)
    slot, y, x = rng.integers(0, 3, n), rng.integers(2, side - 2, n), rng.integers(2, side - 2, n)
    codes = rng.integers(0, 8, n).astype(np.int8)
    draws = _Draws(rng, n, bands, p, 4096, 15, 0.2)
    spec = PatchSpec(p, 2, bands, side, layout, getattr(torch, out_dtype), offset, scale)
    engine = TorchEngine(spec)
    assert engine.fuses_noise
    co = [torch.from_numpy(a) for a in (slot, y, x)]
    got = engine.cut(torch.from_numpy(storage), *co, dihedral=torch.from_numpy(codes), noise=draws.noise)

    compute = np.float64 if out_dtype == "float64" else np.float32
    ref = np.stack([apply_dihedral_numpy(storage[s, a - 2:a + 3, b - 2:b + 3], int(c))
                    for s, a, b, c in zip(slot, y, x, codes)]).astype(compute)
    ref = draws.apply(((ref - offset.astype(compute)) * scale.astype(compute)).transpose(0, 3, 1, 2), compute)
    if layout == "NHWC":
        ref = ref.transpose(0, 2, 3, 1)
    _equal_bits(got, torch.from_numpy(np.ascontiguousarray(ref)).to(getattr(torch, out_dtype)))
    plain = engine.cut(torch.from_numpy(storage), *co, dihedral=torch.from_numpy(codes))
    untouched = np.setdiff1d(np.setdiff1d(np.arange(n), draws.radiated), draws.dropped[:, 0])
    _equal_bits(got[untouched], plain[untouched])


def test_noise_is_refused_where_the_cut_cannot_apply_it():
    spec = PatchSpec(3, 1, 4, 8, "NCHW", torch.float32, np.zeros(4), np.ones(4))
    with defaults.set(numba=False):
        ops = TorchEngine(spec)
    assert not ops.fuses_noise
    storage = torch.zeros((2, 8, 8, 4), dtype=torch.int16)
    one = torch.ones(1, dtype=torch.int64) * 3
    noise = cpu_cut.make_noise(1, np.array([0]), np.ones(1, np.float32), np.zeros(1, np.int64),
                               np.zeros(64, np.float32), 0.1, None)
    with pytest.raises(InputError, match="fused CPU kernel"):
        ops.cut(storage, one * 0, one, one, noise=noise)
    fused = TorchEngine(spec)
    short = noise._replace(bank=np.zeros(8, np.float32))
    with pytest.raises(InputError, match="past the bank"):
        fused.cut(storage, one * 0, one, one, noise=short)


def test_without_numba_the_engine_falls_back_and_says_why(monkeypatch):
    """numba missing: torch ops cut the batch, and the reason names the pip extra."""
    monkeypatch.setitem(sys.modules, "numba", None)  # "import numba" raises ImportError
    monkeypatch.delitem(sys.modules, "hsgds.engines._cpu_kernel", raising=False)
    monkeypatch.setattr(cpu_cut, "_state", {})
    assert not cpu_cut.available()
    spec = PatchSpec(3, 1, 2, 6, "NCHW", torch.bfloat16, np.zeros(2), np.ones(2))
    engine = TorchEngine(spec)
    assert len(engine.reasons) == 1 and "torch ops" in engine.reasons[0]
    assert 'pip install "hsgds[cpu]"' in engine.reasons[0]
    storage = torch.arange(72, dtype=torch.int16).view(1, 6, 6, 2)
    one = torch.ones(1, dtype=torch.int64)
    out = engine.cut(storage, one * 0, one * 2, one * 3)
    want = storage[0, 1:4, 2:5].permute(2, 0, 1).to(torch.bfloat16)
    assert torch.equal(out[0], want)


def test_patch_starts_match_numpy_and_name_the_first_sample_outside():
    """The engine's per-batch index pass (cpu_cut.patch_starts): each patch's first element as numpy
    computes it, over tables of different tile geometry; the first sample whose table, slot or patch
    is outside is found (the engine then raises the error that names it), and check=False skips the
    slot and tile bounds but never the table (it indexes the tables)."""
    rng = np.random.default_rng(11)
    side, stride = np.array([12, 9, 15]), np.array([5, 7, 3])
    tables = cpu_cut.make_tables(side, stride, np.zeros((3, 1), np.int64), np.zeros((3, 1)), np.ones((3, 1)),
                                 np.float32)
    n, r, slots, slot_elems = 500, 2, 4, 15 * 15 * 7
    table = rng.integers(0, 3, n)
    slot, y, x = rng.integers(0, slots, n), rng.integers(r, side[table] - r), rng.integers(r, side[table] - r)
    base, bad = cpu_cut.patch_starts(slot, y, x, table, tables, slots, slot_elems, r, True)
    assert bad == -1
    np.testing.assert_array_equal(base, slot * slot_elems + ((y - r) * side[table] + (x - r)) * stride[table])
    one = cpu_cut.make_tables(12, 5, np.zeros((1, 1), np.int64), np.zeros((1, 1)), np.ones((1, 1)), np.float32)
    base, bad = cpu_cut.patch_starts(slot, y % 8 + r, x % 8 + r, None, one, slots, slot_elems, r, True)
    assert bad == -1
    np.testing.assert_array_equal(base, slot * slot_elems + ((y % 8) * 12 + x % 8) * 5)
    for array, value in ((slot, slots), (slot, -1), (y, r - 1), (x, side[table[37]] - r), (table, 3), (table, -1)):
        wrong = array.copy()
        wrong[[37, 90]] = value
        args = [wrong if a is array else a for a in (slot, y, x, table)]
        assert cpu_cut.patch_starts(*args, tables, slots, slot_elems, r, True)[1] == 37
        unchecked = cpu_cut.patch_starts(*args, tables, slots, slot_elems, r, False)[1]
        assert unchecked == (37 if array is table else -1)


_WARM_UP_CHILD = """
import threading
import numpy as np, torch
from hsgds.engines import PatchSpec, TorchEngine, cpu_cut
from hsgds.engines._cpu_kernel import cut_patches, patch_starts
cpu_cut.warm_up(np.uint8, "bfloat16")
cpu_cut.wait_for_warm_up()
assert not any(t.name == "hsgds-warm-up" and t.is_alive() for t in threading.enumerate())
warmed = len(cut_patches.signatures), len(patch_starts.signatures)
rng = np.random.default_rng(0)
storage = torch.from_numpy(rng.integers(0, 255, (2, 20, 20, 12)).astype(np.uint8))
spec = PatchSpec(5, 3, 12, 20, "NCHW", torch.bfloat16, rng.uniform(0, 9, 12), rng.uniform(0.1, 1, 12))
coords = [torch.tensor(v) for v in ([0, 1, 1], [3, 9, 16], [4, 10, 16])]
TorchEngine(spec).cut(storage, *coords)
print(*warmed, len(cut_patches.signatures), len(patch_starts.signatures))
"""


def test_warm_up_loads_the_specialization_the_first_cut_uses():
    """cpu_cut.warm_up (the loader starts it while it looks up samples and plans) must load the very
    specialization the engine's first cut calls, or the first batch would still wait for a load; in a
    fresh process, so that no earlier test has compiled the pair. ``wait_for_warm_up`` returns only once
    the load is done (``hsgds bench`` waits for it before timing reads)."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", _WARM_UP_CHILD], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # one specialization of the cut and one of the index pass, made by the warm-up, used by the cut
    assert proc.stdout.split() == ["1", "1", "1", "1"]


GENERIC_CHILD = r"""
import numpy as np, torch
from hsgds.engines import _cpu_kernel, cpu_cut
side, bands, p = 9, 10, 5
rng = np.random.default_rng(3)
storage = rng.uniform(-7e4, 7e4, (1, side, side, bands)).astype(np.float32)
tables = cpu_cut.make_tables(side, bands, np.arange(bands), np.zeros(bands), np.ones(bands), np.float32)
base = np.array([0, (side + 1) * bands, (4 * side + 4) * bands], np.int64)
out = torch.empty(len(base), bands, p, p, dtype=torch.float16)
dst = out.view(-1).view(torch.int16).numpy().view(np.uint16)
cpu_cut.cut_range(storage.reshape(-1), base, None, None, tables, dst, p, True, cpu_cut.MODES["float16"], 0, len(base))
want = torch.stack([torch.from_numpy(storage[0].reshape(-1, bands)[b // bands + np.add.outer(
    np.arange(p) * side, np.arange(p)).ravel()].T.reshape(bands, p, p).copy()) for b in base]).to(out.dtype)
assert torch.equal(out.view(torch.int16), want.view(torch.int16))
ring = storage.reshape(-1).copy()  # the same patches from a tile normalized in place (scalar rounding too)
cpu_cut.normalize_tile(ring, 0, tables, 0, ring.view(np.int16), 0, 2 * bands)
copied = np.empty_like(dst)
cpu_cut.copy_range(ring, base * 2, None, None, tables._replace(stride=tables.stride * 2), copied, p, True,
                   cpu_cut.MODES["float16"], 0, len(base))
assert np.array_equal(copied, dst)
print("vector half:", _cpu_kernel._VECTOR_HALF)
"""


def test_a_generic_target_cpu_keeps_the_scalar_float16_rounding(tmp_path):
    """Under ``NUMBA_CPU_NAME=generic`` (portable caches) x86 has no F16C: LLVM would call __truncsfhf2,
    which numba's JIT cannot link (the process aborts), so float16 patches keep the scalar rounding and
    every cut still compiles and gives torch's bits, from stored values and from normalized tiles."""
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", GENERIC_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "vector half: False"


def test_band_blocks_follow_the_runs_of_consecutive_stored_bands():
    def plan(band):
        count, starts = cpu_cut.band_blocks(np.asarray([band], np.int64))
        assert np.all(starts[0, count[0]:] == -1)
        return starts[0, :count[0]].tolist()

    assert plan(range(20)) == [0, 8, 12]  # all bands: the last block overlaps the one before
    assert plan(list(range(10)) + list(range(14, 24))) == [0, 2, 10, 12]  # two runs of 10
    assert plan(list(range(30, 38)) + list(range(8))) == [0, 8]  # runs of exactly 8, the second one earlier
    assert plan(list(range(0, 80, 4))) == []  # every 4th band: runs of 1
    assert plan(list(range(9)) + [20] + list(range(30, 39))) == []  # one short run is enough to fall back
    assert plan(range(7)) == []
    # many tables at once, as an archive's scenes have: each row as on its own
    maps = [list(range(20)), list(range(10)) + list(range(14, 24)), list(range(0, 80, 4)), list(range(3, 23))]
    count, starts = cpu_cut.band_blocks(np.array(maps))
    assert [starts[t, :count[t]].tolist() for t in range(4)] == [plan(m) for m in maps]
    tables = cpu_cut.make_tables(np.full(3, 30), np.full(3, 30), np.array([maps[1]] * 3), np.zeros((3, 20)),
                                 np.ones((3, 20)), np.float32)  # one map shared by every table
    assert tables.block_plan.tolist() == [0, 0, 0] and tables.block_count.tolist() == [4]
    assert (tables.block_start == starts[1]).all()
    tables = cpu_cut.make_tables(np.full(5, 30), np.full(5, 30), np.array([maps[k] for k in (1, 0, 1, 3, 0)]),
                                 np.zeros((5, 20)), np.ones((5, 20)), np.float32)  # a plan per distinct map
    assert tables.block_plan.tolist() == [0, 1, 0, 2, 1] and tables.block_count.tolist() == [4, 3, 3]


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("stream", [False, True], ids=["stores", "streamed"])
def test_band_selections_of_long_runs_match_numpy_with_noise_and_dropout(out_dtype, stream, monkeypatch):
    """NCHW cuts with band maps of long runs (dropped water-vapour bands, a shifted window, runs out of
    order) next to tables that fall back to the scratch path: per-patch tables, dihedral codes, radiation
    noise and band dropout, against numpy slices of each table's stored bands and torch's rounding."""
    if stream:
        monkeypatch.setattr(cpu_cut, "STREAM_BYTES", 0)
    rng = np.random.default_rng(21)
    bands, side, stride, p, n = 20, 14, 26, 5, 120
    band = np.array([list(range(10)) + list(range(16, 26)),  # runs of 10 and 10 (bands 10..15 dropped)
                     list(range(3, 23)),  # one run, shifted by 3
                     list(range(18, 26)) + list(range(12)),  # a run of 8, then an earlier run of 12
                     list(range(0, 20)),  # all of the first 20
                     list(range(9)) + [12] + list(range(14, 24))])  # a run of 1: the scratch path
    t_count = len(band)
    compute = np.float64 if out_dtype == "float64" else np.float32
    offset, scale = rng.uniform(-300, 300, (t_count, bands)), rng.uniform(1e-4, 1e-3, (t_count, bands))
    tables = cpu_cut.make_tables(np.full(t_count, side), np.full(t_count, stride), band, offset, scale, compute)
    assert tables.block_count[tables.block_plan].tolist() == [4, 3, 3, 3, 0]
    storage = _storage("uint16", 3, side, stride, seed=22)
    slot, y, x = rng.integers(0, 3, n), rng.integers(2, side - 2, n), rng.integers(2, side - 2, n)
    table, codes = rng.integers(0, t_count, n), rng.integers(0, 8, n).astype(np.int8)
    draws = _Draws(rng, n, bands, p, 8192, 40, 0.15)

    base = ((slot * side + (y - 2)) * side + (x - 2)).astype(np.int64) * stride
    out = torch.empty((n, bands, p, p), dtype=getattr(torch, out_dtype))
    mode = cpu_cut.MODES[out_dtype]
    dst = out.view(-1).view(torch.int16).numpy().view(np.uint16) if mode else out.view(-1).numpy()
    cpu_cut.cut_range(storage.reshape(-1), base, table.astype(np.int64), codes, tables, dst, p, True, mode, 0, n,
                      stream, draws.noise)

    ref = np.stack([apply_dihedral_numpy(storage[s, a - 2:a + 3, b - 2:b + 3][..., band[t]], int(c))
                    for s, a, b, t, c in zip(slot, y, x, table, codes)]).astype(compute)
    ref = ((ref - offset[table, None, None].astype(compute)) * scale[table, None, None].astype(compute))
    ref = draws.apply(ref.transpose(0, 3, 1, 2), compute)
    _equal_bits(out, torch.from_numpy(np.ascontiguousarray(ref)).to(getattr(torch, out_dtype)))
