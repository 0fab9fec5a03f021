"""Patch engines against an independent numpy reference, and against each other.

The reference slices ``storage[s, y-r:y+r+1, x-r:x+r+1]`` sample by sample and normalizes in float64, so it
shares no code (and no gather trick) with the engines. The engines compute in float32, so the comparison
allows float32 rounding of each term; 16-bit outputs also allow one rounding to the output dtype.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hsgds import defaults  # noqa: E402
from hsgds.engines import DaliEngine, PatchSpec, TorchEngine, make_engine  # noqa: E402
from hsgds.errors import ConfigError, DependencyError, InputError  # noqa: E402

from .kernel_pairs import FLOAT16_STORES  # noqa: E402

HALO, CORE, BANDS, SLOTS = 7, 9, 5, 3
SIDE = 2 * HALO + CORE  # 23: the padded tile side S
HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
HAS_CUDA = torch.cuda.is_available()

# numpy storage dtype -> (low, high) of the random values; ranges cross the signed/unsigned boundaries
DTYPES = {
    "uint8": (0, 256),
    "int8": (-128, 128),
    "int16": (-32768, 32768),
    "uint16": (0, 65536),  # mostly above 32767: catches a signed reinterpretation
    "int32": (-(2**31), 2**31),
    "uint32": (0, 2**32),
    "int64": (-(2**40), 2**40),
    "uint64": (0, 2**63 + 2**40),
    "float32": (-1e4, 1e4),
    "float64": (-1e4, 1e4),
}
EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52}


def _engine_param(name: str) -> pytest.param:
    marks = [pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is not installed")] if name == "dali" else []
    return pytest.param(name, marks=marks, id=name)


# "torch" cuts on the CPU with the fused numba kernel when numba is installed; "torch-ops" is the same
# engine with that kernel switched off (the torch-ops CPU path, also the fallback without numba)
ENGINE_NAMES = [_engine_param("torch"), _engine_param("torch-ops"), _engine_param("dali")]


@pytest.fixture(params=ENGINE_NAMES)
def engine_name(request: pytest.FixtureRequest):
    if request.param == "dali":
        pytest.importorskip("nvidia.dali")
    if request.param == "torch-ops":
        with defaults.set(numba=False):
            yield "torch"
        return
    yield request.param


def make_storage(dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lo, hi = DTYPES[dtype]
    shape = (SLOTS, SIDE, SIDE, BANDS)
    if dtype.startswith("float"):
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    wide = np.uint64 if dtype in ("uint32", "uint64") else np.int64
    return rng.integers(lo, hi, size=shape, dtype=wide).astype(dtype)


def make_coords(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centres in the core of each tile, so every patch (radius <= halo) stays inside it."""
    rng = np.random.default_rng(seed)
    slot = rng.integers(0, SLOTS, n)
    y = rng.integers(HALO, HALO + CORE, n)
    x = rng.integers(HALO, HALO + CORE, n)
    return slot, y, x


def make_spec(storage: np.ndarray, p: int, layout: str, out_dtype: torch.dtype, seed: int = 2) -> PatchSpec:
    """Per-band offset inside the data range and a scale that maps the range to about [-4, 4]."""
    rng = np.random.default_rng(seed)
    lo, hi = float(storage.min()), float(storage.max())
    offset = rng.uniform(lo, hi, BANDS)
    scale = 8.0 / (hi - lo) * rng.uniform(0.5, 1.5, BANDS)
    return PatchSpec(p, HALO, BANDS, SIDE, layout, out_dtype, offset, scale)


def reference(storage: np.ndarray, slot, y, x, spec: PatchSpec) -> tuple[np.ndarray, np.ndarray]:
    """(float64 result, float64 error bound of a float32 computation), both in the spec's layout."""
    r = spec.radius
    patches = np.stack(
        [storage[s, yy - r : yy + r + 1, xx - r : xx + r + 1, :] for s, yy, xx in zip(slot, y, x)]
    ).astype(np.float64)
    offset = np.asarray(spec.offset, np.float64)
    scale = np.asarray(spec.scale, np.float64)
    ref = (patches - offset) * scale
    # float32 rounds x, offset, scale, the difference and the product: each a relative 2**-24
    bound = 4 * EPS["float32"] * (np.abs(patches) + np.abs(offset)) * np.abs(scale) + 1e-30
    if spec.layout == "NCHW":
        ref, bound = ref.transpose(0, 3, 1, 2), bound.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(ref), np.ascontiguousarray(bound)


def check_close(out: torch.Tensor, ref: np.ndarray, bound: np.ndarray, out_dtype: torch.dtype) -> None:
    """Within float32 rounding of the reference, plus one rounding to the 16-bit output dtype."""
    name = str(out_dtype).removeprefix("torch.")
    got = out.cpu().to(torch.float64).numpy()
    tol = bound + (np.abs(ref) * EPS[name] if name in ("float16", "bfloat16") else 0.0)
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert np.all(err <= tol), f"max excess at {worst}: got {got[worst]}, want {ref[worst]} +- {tol[worst]}"


def cut(engine, storage: np.ndarray, slot, y, x, device: str = "cpu") -> torch.Tensor:
    as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return engine.cut(as_t(storage), as_t(slot.astype(np.int64)), as_t(y.astype(np.int64)), as_t(x.astype(np.int64)))


# -- numbers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("p", [1, 5, 13, 15])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float32_matches_numpy(engine_name: str, dtype: str, p: int, layout: str) -> None:
    storage = make_storage(dtype)
    slot, y, x = make_coords(12)
    spec = make_spec(storage, p, layout, torch.float32)
    with_engine = make_engine(engine_name, spec, "cpu")
    out = cut(with_engine, storage, slot, y, x)
    ref, bound = reference(storage, slot, y, x, spec)
    assert out.shape == ref.shape and out.dtype == torch.float32 and out.is_contiguous()
    check_close(out, ref, bound, torch.float32)
    # bit-exact against the float32 formula the engines promise: (float32(x) - offset32) * scale32
    r = p // 2
    f32 = np.stack([storage[s, a - r : a + r + 1, b - r : b + r + 1] for s, a, b in zip(slot, y, x)]).astype(np.float32)
    exact = (f32 - spec.offset.astype(np.float32)) * spec.scale.astype(np.float32)
    if layout == "NCHW":
        exact = exact.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(out.numpy(), exact)
    with_engine.close()


@pytest.mark.parametrize("dtype", ["uint8", "int16", "uint16", "uint32", "float32", "float64"])
@pytest.mark.parametrize("p", [1, 5, 13])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("out_name", ["float16", "bfloat16"])
def test_16bit_outputs_match_numpy(engine_name: str, dtype: str, p: int, layout: str, out_name: str) -> None:
    out_dtype = getattr(torch, out_name)
    storage = make_storage(dtype, seed=3)
    slot, y, x = make_coords(9, seed=4)
    spec = make_spec(storage, p, layout, out_dtype, seed=5)
    out = cut(make_engine(engine_name, spec), storage, slot, y, x)
    ref, bound = reference(storage, slot, y, x, spec)
    assert out.shape == ref.shape and out.dtype == out_dtype and out.is_contiguous()
    check_close(out, ref, bound, out_dtype)


def test_unsigned_and_negative_values_exact(engine_name: str) -> None:
    """uint16 above 32767 and negative int16 come out as themselves (offset 0, scale 1)."""
    for dtype, values in (("uint16", [0, 1, 32767, 32768, 40000, 65535]), ("int16", [-32768, -1, 0, 1, 32767])):
        storage = np.zeros((1, SIDE, SIDE, 1), dtype=dtype)
        storage[0, HALO, HALO : HALO + len(values), 0] = values
        spec = PatchSpec(1, HALO, 1, SIDE, "NHWC", torch.float32, np.zeros(1), np.ones(1))
        n = len(values)
        slot, y, x = np.zeros(n, int), np.full(n, HALO), np.arange(HALO, HALO + n)
        out = cut(make_engine(engine_name, spec), storage, slot, y, x)
        assert out.reshape(-1).tolist() == [float(v) for v in values]


#: every stored dtype into float32 and bfloat16 (the training outputs), and into float16 and float64 from one
#: dtype of each kind and width: each (stored, output) pair is a numba specialization compiled in ~6-9 s on a
#: cold CI machine, and the cast of the stored value and the rounding of the output are separate steps
AGREE_CASES = [(d, o) for o in ("float32", "bfloat16") for d in DTYPES] + [
    (d, o) for o in ("float16", "float64") for d in FLOAT16_STORES]


@pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is not installed")
@pytest.mark.parametrize("dtype, out_name", AGREE_CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_engines_agree_bit_for_bit(dtype: str, layout: str, out_name: str) -> None:
    storage = make_storage(dtype, seed=6)
    slot, y, x = make_coords(20, seed=7)
    spec = make_spec(storage, 13, layout, getattr(torch, out_name), seed=8)
    a = cut(TorchEngine(spec), storage, slot, y, x)
    b = cut(DaliEngine(spec, max_batch_size=20), storage, slot, y, x)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b)


# -- batches, shapes, lifetimes -------------------------------------------------------------------------


def test_smaller_and_bigger_batches(engine_name: str) -> None:
    """The last, smaller batch works; a batch above max_batch_size works too (DALI rebuilds)."""
    storage = make_storage("int16", seed=9)
    spec = make_spec(storage, 5, "NCHW", torch.float32)
    engine = make_engine(engine_name, spec, None, max_batch_size=16)
    for n in (16, 7, 1, 16, 40, 3):
        slot, y, x = make_coords(n, seed=n)
        out = cut(engine, storage, slot, y, x)
        ref, bound = reference(storage, slot, y, x, spec)
        assert out.shape == (n, BANDS, 5, 5)
        check_close(out, ref, bound, torch.float32)
    engine.close()
    engine.close()  # idempotent


def test_empty_batch(engine_name: str) -> None:
    storage = make_storage("uint16")
    spec = make_spec(storage, 5, "NHWC", torch.bfloat16)
    empty = np.zeros(0, dtype=np.int64)
    out = cut(make_engine(engine_name, spec), storage, empty, empty, empty)
    assert out.shape == (0, 5, 5, BANDS) and out.dtype == torch.bfloat16


def test_storage_change_and_reuse(engine_name: str) -> None:
    """A new storage tensor (or new contents in the same one) is read, not a cached copy."""
    storage = make_storage("uint16", seed=10)
    spec = make_spec(storage, 3, "NHWC", torch.float32)
    engine = make_engine(engine_name, spec)
    slot, y, x = make_coords(8)
    t = torch.from_numpy(storage.copy())
    co = [torch.from_numpy(a.astype(np.int64)) for a in (slot, y, x)]
    first = engine.cut(t, *co).clone()
    t.numpy()[...] = np.roll(storage, 1, axis=0)  # the ring refilled the slots in place
    second = engine.cut(t, *co)
    ref, bound = reference(t.numpy(), slot, y, x, spec)
    check_close(second, ref, bound, torch.float32)
    assert not torch.equal(first, second)
    other = make_storage("uint16", seed=11)
    ref, bound = reference(other, slot, y, x, spec)
    check_close(cut(engine, other, slot, y, x), ref, bound, torch.float32)


# -- errors ---------------------------------------------------------------------------------------------


def test_bad_specs(engine_name: str) -> None:
    storage = make_storage("int16")
    good = make_spec(storage, 5, "NCHW", torch.float32)
    bad = {
        "even patch": dict(patch_size=4),
        "patch beyond halo": dict(patch_size=17),
        "layout": dict(layout="CHW"),
        "out dtype": dict(out_dtype=torch.int16),
        "offset shape": dict(offset=np.zeros(BANDS + 1)),
        "scale nan": dict(scale=np.full(BANDS, np.nan)),
    }
    for what, change in bad.items():
        fields = {**good.__dict__, **change}
        with pytest.raises(ConfigError):
            make_engine(engine_name, PatchSpec(**fields))
            pytest.fail(what)


def test_spec_validates_itself() -> None:
    """The spec is checked once, where it is made: no engine needed to reject it, one message per field."""
    good = make_spec(make_storage("int16"), 5, "NCHW", torch.float32)
    bad = {
        "patch_size must be a positive odd integer": dict(patch_size=4),
        r"patch_size 17 is larger than this store serves \(15x15, halo 7\)": dict(patch_size=17),
        "tile_side 9 is smaller than patch_size 15": dict(patch_size=15, tile_side=9),
        "bands must be >= 1": dict(bands=0, offset=np.zeros(0), scale=np.zeros(0)),
        "layout must be one of NCHW, NHWC": dict(layout="CHW"),
        "dtype must be a torch floating dtype": dict(out_dtype=torch.int16),
        r"offset must hold one value per band \(5\)": dict(offset=np.zeros(BANDS + 1)),
        "scale has non-finite values": dict(scale=np.full(BANDS, np.nan)),
    }
    for message, change in bad.items():
        with pytest.raises(ConfigError, match=message):
            PatchSpec(**{**good.__dict__, **change})
    spec = PatchSpec(**{**good.__dict__, "out_dtype": "bfloat16", "offset": [1] * BANDS, "scale": (2,) * BANDS})
    assert spec.out_dtype is torch.bfloat16
    assert spec.offset.dtype == np.float64 and spec.offset.tolist() == [1.0] * BANDS
    assert spec.scale.dtype == np.float64 and spec.scale.tolist() == [2.0] * BANDS


def test_unknown_engine() -> None:
    spec = make_spec(make_storage("int16"), 5, "NCHW", torch.float32)
    with pytest.raises(ConfigError, match="dali, torch"):
        make_engine("numba", spec)


def test_bad_inputs(engine_name: str) -> None:
    storage = make_storage("int16")
    spec = make_spec(storage, 5, "NHWC", torch.float32)
    engine = make_engine(engine_name, spec)
    slot, y, x = make_coords(4)
    with pytest.raises(InputError, match="shape"):
        cut(engine, storage[..., :3], slot, y, x)
    with pytest.raises(InputError, match="same length"):
        cut(engine, storage, slot, y[:3], x)
    with pytest.raises(InputError, match="outside"):
        cut(engine, storage, slot, np.array([1, 2, 3, 4]), x)  # y=1 < radius 2
    with pytest.raises(InputError, match="outside"):
        cut(engine, storage, np.array([0, 1, 2, SLOTS]), y, x)
    # still usable afterwards (a DALI pipeline is invalid after an error inside it)
    ref, bound = reference(storage, slot, y, x, spec)
    check_close(cut(engine, storage, slot, y, x), ref, bound, torch.float32)


def test_missing_dali_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in ("nvidia.dali", "nvidia.dali.fn", "nvidia.dali.types"):
        monkeypatch.setitem(sys.modules, mod, None)  # makes "import nvidia.dali" raise ImportError
    spec = make_spec(make_storage("int16"), 5, "NCHW", torch.float32)
    with pytest.raises(DependencyError, match=r"hsgds\[cu13\].*hsgds\[dali\]"):
        make_engine("dali", spec)


# -- GPU ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["uint8", "int16", "uint16", "uint32", "int64", "float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("out_name", ["float32", "float16", "bfloat16"])
def test_cuda_matches_numpy(engine_name: str, dtype: str, layout: str, out_name: str) -> None:
    out_dtype = getattr(torch, out_name)
    storage = make_storage(dtype, seed=12)
    spec = make_spec(storage, 13, layout, out_dtype, seed=13)
    engine = make_engine(engine_name, spec, "cuda", max_batch_size=32)
    for n in (32, 11):  # full and last, smaller batch
        slot, y, x = make_coords(n, seed=n)
        out = cut(engine, storage, slot, y, x, device="cuda")
        assert out.is_cuda and out.dtype == out_dtype and out.is_contiguous()
        ref, bound = reference(storage, slot, y, x, spec)
        check_close(out, ref, bound, out_dtype)
    engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_CUDA and HAS_DALI), reason="needs a CUDA GPU and NVIDIA DALI")
@pytest.mark.parametrize("dtype", ["int16", "uint16", "float32"])
@pytest.mark.parametrize("out_name", ["float32", "float16", "bfloat16"])
def test_cuda_engines_agree_with_cpu(dtype: str, out_name: str) -> None:
    """torch and DALI on the GPU give the CPU engines' numbers bit for bit."""
    storage = make_storage(dtype, seed=14)
    spec = make_spec(storage, 13, "NCHW", getattr(torch, out_name), seed=15)
    slot, y, x = make_coords(64, seed=16)
    want = cut(TorchEngine(spec), storage, slot, y, x)
    for engine in (TorchEngine(spec, "cuda"), DaliEngine(spec, "cuda", max_batch_size=64)):
        got = cut(engine, storage, slot, y, x, device="cuda")
        assert torch.equal(got.cpu(), want), engine.name
