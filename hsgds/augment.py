"""Seeded augmentation: a pure function of (seed, epoch, sample index) -> per-sample parameters.

Every random number comes from Philox4x32-10 (Salmon et al., SC'11), a counter-based generator: the
counter is (sample index, epoch, purpose) (words: index low, index high, epoch low, purpose + 4 * epoch
high, so that epochs up to 2^62 never repeat one another's draws) and the key is the loader's seed, so a sample draws the same
parameters whatever the batch size, world size, ring size or resume point (all but mixture noise's
partner, taken from the sample's batch: see below), and nothing carries state from one batch to the next. Parameters are computed on the host per batch with exact uint64 numpy
arithmetic (a few hundred microseconds for a batch of 256) and applied on the device:

- flips and quarter turns are one of the 8 dihedral codes ``c = 4*t + 2*v + h`` (t: transpose,
  v: flip rows, h: flip columns). Output pixel (i, j) of a p×p patch reads the source offset (a, b)
  with (a, b) = (j, i) if t else (i, j), then a = p-1-a if v, b = p-1-b if h. The engines apply it
  inside the cut as index arithmetic (no extra pass). flip=True draws v and h; rot90=True draws one of
  the 4 rotations {0, 90, 180, 270 degrees} = codes {0, 6, 3, 5}; both together give all 8 equally often.
- radiation noise (probability ``radiation_noise``, as DeepHyperX): x <- alpha * x + noise_std * n,
  alpha ~ U(radiation_scale), n ~ N(0, 1) per output value; x is the value the loader yields (normalized,
  or as stored with ``normalize=None``), so ``noise_std`` is in its units. The normals come from a bank of 2^20
  Philox/Box-Muller normals keyed on the seed; a sample reads a window of it that starts at a
  per-sample random multiple of 64 (a window longer than the bank reads it cyclically), read in the patch's pixel-major order (NHWC element order: value
  (i, j, b) of the output adds window[(i * p + j) * B + b]), so both layouts and engines add the same
  numbers and the fused CPU cut reads the window front to back as it gathers each pixel. Windows of two
  samples may overlap (their noises are then shifted copies); within a patch the values are independent.
- mixture noise (probability ``mixture_noise``): the patch's centre spectrum c becomes
  (a1 * c + a2 * c2) / (a1 + a2), a1, a2 ~ U(0.01, 1) (DeepHyperX's rule), where c2 is the centre
  spectrum of another sample of the same class in the same batch (every sample of a batch is resident
  in the ring). The partner is the next sample of that class when the batch's samples of the class are
  ordered by a per-sample Philox key; a sample alone of its class in its batch is left unmixed, and so is
  an unlabelled one (label -1 with ``pixels="all"``: it has no class). A sample twice in a batch (a rank's
  share padded with its first sample, when it fits in one batch) counts once: both copies get its partner. This
  is the one choice that depends on the batch's composition (whether to mix and the weights do not).
- band dropout (probability ``band_dropout`` per band): the band is zeroed after normalization and
  after the noises above, so a dropped band is exactly 0.

Where they are applied: flips and turns always inside the cut. Radiation noise and band dropout inside
the cut too where the engine can (``engine.fuses_noise``: the torch engine's fused CPU kernel, which adds
the noise before the one rounding to the output dtype; dropout there only without mixture noise, which
comes between them); otherwise, and for mixture noise, by :class:`Augmenter` right after the cut.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hsgds import defaults
from hsgds._numba_cache import import_kernels
from hsgds.errors import ConfigError, as_flag, shown

__all__ = ["Augment", "AugmentBatch", "apply_after_cut", "dihedral_batch", "dihedral_offsets", "draw", "philox4x32"]

_MASK = np.uint64(0xFFFFFFFF)
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)

# what a Philox call is for (the counter's last word, below the epoch's high word), so streams never overlap
_SCALARS, _MIXTURE, _BANK, _BANDS = 0, 1, 2, 3
_PURPOSE_BITS = 2
#: epochs draw distinct parameters below this: their high word shares the last counter word with the purpose
MAX_EPOCH = 1 << (64 - _PURPOSE_BITS)
BANK_SIZE = 1 << 20
BANK_STEP = 64  # granularity of a noise window's start in the bank
ROTATIONS = np.array([0, 6, 3, 5], dtype=np.int8)  # 0, 90, 180, 270 degrees in the code convention
_F32_MAX, _F32_TINY = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)


def philox4x32(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10. ``counter``: (..., 4) uint32-valued array; returns (..., 4) uint32 random words.
    Compiled (hsgds._philox_kernel) when numba imports and the setting ``numba`` is on; the same words
    either way."""
    compiled = _compiled_philox()
    if compiled is not None:
        rows = np.ascontiguousarray(np.asarray(counter).reshape(-1, 4), dtype=np.uint32)
        out = np.empty_like(rows)
        compiled(rows, np.uint64(key[0] & 0xFFFFFFFF), np.uint64(key[1] & 0xFFFFFFFF), out)
        return out.reshape(np.shape(counter))
    return philox4x32_numpy(counter, key)


def _compiled_philox() -> Any:
    """The numba Philox (hsgds._philox_kernel.philox_rows), or None without numba or with the setting off."""
    if not defaults.get("numba"):
        return None
    if "philox" not in _COMPILED:
        try:
            philox_rows = import_kernels("hsgds._philox_kernel").philox_rows
        except ImportError:
            philox_rows = None
        _COMPILED["philox"] = philox_rows
    return _COMPILED["philox"]


_COMPILED: dict[str, Any] = {}


def philox4x32_numpy(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 in numpy (the reference; :func:`philox4x32` without numba)."""
    c = [np.asarray(counter[..., i], dtype=np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0] & 0xFFFFFFFF), np.uint64(key[1] & 0xFFFFFFFF)
    for _ in range(10):
        p0, p1 = _M0 * c[0], _M1 * c[2]  # 32 x 32 -> 64 bits: exact in uint64
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _MASK, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _MASK]
        k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return np.stack(c, axis=-1).astype(np.uint32)


def _uniform(words: np.ndarray) -> np.ndarray:
    """uint32 words -> float64 in [0, 1) (24 random bits: exactly representable in float32 too)."""
    return (words >> np.uint32(8)).astype(np.float64) * (1.0 / (1 << 24))


def _counters(index: np.ndarray, epoch: int, purpose: int) -> np.ndarray:
    """(..., 4) uint32 Philox counters (index low word, index high word, epoch low word, purpose + 4 * epoch
    high word): epochs below 2^32 keep the counters they always had, and epoch e + 2^32 is not epoch e."""
    if not 0 <= epoch < MAX_EPOCH:
        raise ConfigError(f"epoch must be in 0..2**62-1 (augmentation keys on 62 bits of it), got {epoch}")
    index = np.asarray(index, dtype=np.uint64)
    out = np.empty(index.shape + (4,), dtype=np.uint32)
    out[..., 0] = index  # the low 32 bits (an unsafe cast keeps them)
    out[..., 1] = index >> np.uint64(32)
    out[..., 2] = epoch & 0xFFFFFFFF
    out[..., 3] = purpose | (epoch >> 32) << _PURPOSE_BITS
    return out


def _key(seed: int) -> tuple[int, int]:
    return seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF


@dataclass(frozen=True)
class Augment:
    """On-device augmentation applied by :class:`~hsgds.PatchLoader` (see the module notes for the rules).

    Parameters
    ----------
    flip : random horizontal and vertical flips.
    rot90 : random quarter turns. With ``flip`` every patch gets one of the 8 dihedral variants.
    radiation_noise : probability of x <- alpha * x + noise_std * N(0, 1), alpha ~ U(radiation_scale).
    radiation_scale : (low, high) of alpha, within float32's range (alpha is drawn and applied as float32,
        to float64 patches too).
    noise_std : standard deviation of the additive noise, in the units of the values the loader yields:
        normalized when it normalizes (its default), the stored values with ``normalize=None`` (e.g.
        reflectance already in 0..1). The default 1/25 is meant for normalized values: over raw integer
        counts it is a fraction of one count, so give it in counts there. At most float32's largest value.
    mixture_noise : probability of mixing the centre spectrum with a same-class sample's.
    band_dropout : probability of zeroing each band of a patch.
    """

    flip: bool = False
    rot90: bool = False
    radiation_noise: float = 0.0
    radiation_scale: tuple[float, float] = (0.9, 1.1)
    noise_std: float = 1 / 25
    mixture_noise: float = 0.0
    band_dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("flip", "rot90"):
            object.__setattr__(self, name, as_flag(getattr(self, name), f"Augment.{name}"))
        for name in ("radiation_noise", "mixture_noise", "band_dropout"):
            value = getattr(self, name)
            if not _real(value) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"Augment.{name} is a probability in [0, 1], got {shown(value)}")
            object.__setattr__(self, name, float(value) + 0.0)  # + 0.0: -0.0 is 0.0 (repr is in the state)
        scale = self.radiation_scale
        if isinstance(scale, np.ndarray) and scale.shape == (2,):  # (a numpy pair, as numpy scalars are taken)
            scale = tuple(scale.tolist())
        if (not isinstance(scale, (tuple, list)) or len(scale) != 2
                or not all(_finite(v) for v in scale) or not 0 < scale[0] <= scale[1]):
            raise ConfigError(f"Augment.radiation_scale must be (low, high) with 0 < low <= high, got {shown(scale)}")
        # alpha and noise_std are applied as float32 (AugmentBatch, the kernels), float64 patches included:
        # beyond float32's range they became inf or 0 there, silently
        if not scale[0] >= _F32_TINY or not scale[1] <= _F32_MAX:
            raise ConfigError(f"Augment.radiation_scale must lie in float32's range, {_F32_TINY:.4g} <= low <= high <= "
                              f"{_F32_MAX:.4g} (alpha is drawn as float32), got {shown(scale)}")
        object.__setattr__(self, "radiation_scale", (float(scale[0]), float(scale[1])))
        std = self.noise_std
        if not _finite(std) or not std >= 0:
            raise ConfigError(f"Augment.noise_std must be a finite number >= 0, got {shown(std)}")
        if not std <= _F32_MAX:
            raise ConfigError(f"Augment.noise_std must be at most float32's largest value {_F32_MAX:.4g} (the noise is "
                              f"applied in float32), got {shown(std)}")
        object.__setattr__(self, "noise_std", float(std) + 0.0)

    @property
    def geometric(self) -> bool:
        return self.flip or self.rot90


def _real(value: object) -> bool:
    """A real number (Python's or numpy's), not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _finite(value: object) -> bool:
    """A finite real number (:func:`_real`), an int beyond float range included (not finite as a float)."""
    if not _real(value):
        return False
    try:
        return math.isfinite(value)  # type: ignore[arg-type]
    except OverflowError:  # an int too large for a float
        return False


@dataclass
class AugmentBatch:
    """One batch's parameters (host numpy arrays, one row per sample of the batch)."""

    dihedral: np.ndarray | None  # (N,) int8 codes, None when neither flips nor turns are asked
    radiated: np.ndarray  # (R,) positions in the batch that get radiation noise
    alpha: np.ndarray  # (R,) float32
    bank_start: np.ndarray  # (R,) int64 start of each one's noise window in the bank
    mixed: np.ndarray  # (M,) positions that are mixed
    partner: np.ndarray  # (M,) their partners' positions
    weight: np.ndarray  # (M,) float32 a1 / (a1 + a2)
    dropped: np.ndarray  # (D, 2) (position, band) pairs zeroed


def draw(aug: Augment, seed: int, epoch: int, index: np.ndarray, label: np.ndarray | None, bands: int,
         patch_size: int) -> AugmentBatch:
    """The parameters of the samples ``index`` (their indices in the split: stable keys), in batch order."""
    index = np.asarray(index, dtype=np.int64)
    n, key = len(index), _key(seed)
    words = philox4x32(_counters(index, epoch, _SCALARS), key)  # (N, 4)
    dihedral = None
    if aug.geometric:
        code = (words[:, 0] & np.uint32(7)).astype(np.int8)
        if not aug.flip:
            code = ROTATIONS[code & 3]
        elif not aug.rot90:
            code = code & np.int8(3)
        dihedral = code
    u = _uniform(words[:, 1:4])
    radiated = np.flatnonzero(u[:, 0] < aug.radiation_noise)
    lo, hi = aug.radiation_scale
    alpha = (lo + (hi - lo) * u[radiated, 1]).astype(np.float32)
    window = bands * patch_size * patch_size
    # window starts on a BANK_STEP grid: every window is then a row of one strided view of the bank. A
    # window longer than the bank reads it cyclically (the bank repeated) from any start in its first copy
    starts = (BANK_SIZE - window) // BANK_STEP + 1 if window <= BANK_SIZE else BANK_SIZE // BANK_STEP
    bank_start = (words[radiated, 3].astype(np.int64) % starts) * BANK_STEP

    mixed = partner = np.zeros(0, np.int64)
    weight = np.zeros(0, np.float32)
    if aug.mixture_noise > 0 and n > 1:
        if label is None:
            raise ConfigError("Augment(mixture_noise=...) needs labelled samples (pixels='labelled')")
        m = philox4x32(_counters(index, epoch, _MIXTURE), key)
        um = _uniform(m[:, :3])
        label = np.asarray(label, dtype=np.int64)
        # a sample twice in the batch (a rank's share padded with its first sample again) counts once: both
        # copies take the partner of its first copy, another sample (the copies, of equal keys, were each
        # other's partners: mixed with itself)
        _, first_at, copy_of = np.unique(index, return_index=True, return_inverse=True)
        distinct = np.sort(first_at)  # each sample's first position, in batch order
        k = len(distinct)
        # group by class, order inside a class by a per-sample key; partner = next in the group (cyclic)
        order = distinct[np.lexsort((m[distinct, 3], label[distinct]))]
        lab = label[order]
        first = np.r_[True, lab[1:] != lab[:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(k), 0))
        last = np.r_[lab[1:] != lab[:-1], True]
        nxt = np.where(last, group_start, np.arange(k) + 1)
        partner_of = np.empty(n, np.int64)
        partner_of[order] = order[nxt]
        partner_of = partner_of[first_at[copy_of]]
        alone = index[partner_of] == index
        mixed = np.flatnonzero((um[:, 0] < aug.mixture_noise) & ~alone & (label >= 0))
        partner = partner_of[mixed]
        a1 = 0.01 + 0.99 * um[mixed, 1]
        a2 = 0.01 + 0.99 * um[mixed, 2]
        weight = (a1 / (a1 + a2)).astype(np.float32)

    dropped = np.zeros((0, 2), np.int64)
    if aug.band_dropout > 0:
        # 16 random bits per band (8 bands per Philox call): resolution 2^-16 for the drop probability
        groups = -(-bands // 8)
        ctr = _counters(index[:, None] * groups + np.arange(groups), epoch, _BANDS)  # (N, groups, 4)
        u16 = philox4x32(ctr, key).view(np.uint16).reshape(n, groups * 8)[:, :bands]
        # u / 2^16 < p  <=>  u < ceil(p * 2^16): both sides exact, so the integer test is the same rule
        hits = np.flatnonzero(u16 < np.uint32(np.ceil(aug.band_dropout * 65536)))
        dropped = np.stack(np.divmod(hits, bands), axis=1).astype(np.int64)
    return AugmentBatch(dihedral=dihedral, radiated=radiated, alpha=alpha, bank_start=bank_start, mixed=mixed,
                        partner=partner, weight=weight, dropped=dropped)


def noise_bank(seed: int) -> np.ndarray:
    """BANK_SIZE standard normals (float32, Box-Muller on Philox words), a pure function of the seed."""
    words = philox4x32(_counters(np.arange(BANK_SIZE // 4), 0, _BANK), _key(seed))  # (M/4, 4)
    u = _uniform(words.reshape(-1, 2, 2)[..., 0]), _uniform(words.reshape(-1, 2, 2)[..., 1])
    u1 = 1.0 - u[0]  # (0, 1]: log is finite
    radius = np.sqrt(-2.0 * np.log(u1))
    angle = 2.0 * np.pi * u[1]
    normals = np.stack((radius * np.cos(angle), radius * np.sin(angle)), axis=-1)
    return normals.reshape(-1)[:BANK_SIZE].astype(np.float32)


def dihedral_offsets(patch_size: int) -> np.ndarray:
    """(8, p, p, 2) source offsets (a, b) read by output pixel (i, j) under each dihedral code."""
    p = patch_size
    i, j = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    out = np.empty((8, p, p, 2), dtype=np.int64)
    for code in range(8):
        t, v, h = code >> 2 & 1, code >> 1 & 1, code & 1
        a, b = (j, i) if t else (i, j)
        out[code, ..., 0] = p - 1 - a if v else a
        out[code, ..., 1] = p - 1 - b if h else b
    return out


def apply_dihedral_numpy(patch: np.ndarray, code: int) -> np.ndarray:
    """Reference: the dihedral transform of one (p, p, ...) patch: flip the source's rows (v) and columns
    (h), then swap its two axes (t)."""
    t, v, h = code >> 2 & 1, code >> 1 & 1, code & 1
    out = patch[::-1] if v else patch
    if h:
        out = out[:, ::-1]
    return np.swapaxes(out, 0, 1) if t else out


def dihedral_batch(x: torch.Tensor, code: int, layout: str) -> torch.Tensor:
    """Every patch of a batch ((N, B, p, p) NCHW or (N, p, p, B) NHWC) under one dihedral code: the same
    transform as the cut's read order (flip the rows, the columns, then swap the two axes). Used for
    test-time augmentation, where each variant is a whole batch anyway."""
    rows, cols = (2, 3) if layout == "NCHW" else (1, 2)
    t, v, h = code >> 2 & 1, code >> 1 & 1, code & 1
    flips = [d for d, on in ((rows, v), (cols, h)) if on]
    if flips:
        x = torch.flip(x, flips)
    return x.transpose(rows, cols) if t else x


class Augmenter:
    """Applies one batch's non-geometric parameters to the cut batch in place, on its device.

    Costs are proportional to what is drawn: radiation noise touches only the chosen patches, mixture
    only their centre spectra, band dropout only the dropped (patch, band) planes. Where the engine
    applies radiation noise (``fused_radiation``) or band dropout (``fused_dropout``) inside its cut,
    those steps are skipped here; the order of the rules stays radiation, mixture, dropout, so dropout
    is fused only when there is no mixture. ``to_device``: how a batch's host arrays reach the batch's
    device (:func:`apply_after_cut`).
    """

    def __init__(self, aug: Augment, seed: int, layout: str, *, fused_radiation: bool = False,
                 fused_dropout: bool = False,
                 to_device: Callable[[list[np.ndarray]], list[torch.Tensor]] | None = None) -> None:
        if fused_dropout and aug.mixture_noise > 0:
            raise ConfigError("band dropout cannot be applied inside the cut when mixture noise follows it")
        self.aug, self.seed, self.nchw = aug, seed, layout == "NCHW"
        self.fused_radiation, self.fused_dropout = fused_radiation, fused_dropout
        self.to_device = to_device
        self._bank: dict[Any, Any] = {}

    def host_bank(self, window: int) -> np.ndarray:
        """The noise bank as a numpy array that holds every window of ``window`` values (the bank read
        cyclically when a patch is bigger than it)."""
        key = ("host", max(1, -(-window // BANK_SIZE)))
        bank = self._bank.get(key)
        if bank is None:
            bank = self._bank.get("host-base")
            if bank is None:
                bank = self._bank["host-base"] = noise_bank(self.seed)
            if window > BANK_SIZE:
                bank = np.tile(bank, -(-window // BANK_SIZE) + 1)
            self._bank[key] = bank
        return bank

    def _bank_on(self, device: torch.device) -> torch.Tensor:
        bank = self._bank.get(device)
        if bank is None:
            bank = self._bank[device] = torch.from_numpy(self.host_bank(0)).to(device)
        return bank

    def __call__(self, out: torch.Tensor, batch: AugmentBatch) -> torch.Tensor:
        radiation = len(batch.radiated) > 0 and not self.fused_radiation
        apply_after_cut(out, batch, self.aug, self.nchw, self._bank_on if radiation else None,
                        radiation=radiation, dropout=not self.fused_dropout, to_device=self.to_device)
        return out


def apply_after_cut(out: torch.Tensor, batch: AugmentBatch, aug: Augment, nchw: bool, bank_on: Any, *,
                    radiation: bool = True, dropout: bool = True,
                    to_device: Callable[[list[np.ndarray]], list[torch.Tensor]] | None = None) -> None:
    """Radiation noise, then mixture, then band dropout, on ``out`` ((N, B, p, p) or (N, p, p, B));
    ``radiation`` / ``dropout`` False: already applied in the cut. Computed in float32, or in float64 for
    float64 patches (rounding those to float32 would lose the precision they were cut with). ``to_device``:
    how the batch's host arrays reach ``out``'s device, all in one call (on CUDA the loader's pinned staging:
    one asynchronous copy, where ``.to(device)`` of each would wait for the stream's queued work each time)."""
    device = out.device
    work = torch.promote_types(out.dtype, torch.float32)
    if nchw:
        n, bands, p, _ = out.shape
        view = out  # (N, B, p, p)
    else:
        n, p, _, bands = out.shape
        view = out.permute(0, 3, 1, 2)  # a view in NCHW element order
    window = bands * p * p
    host: dict[str, np.ndarray] = {}
    if radiation and len(batch.radiated):
        host.update(rad=batch.radiated, rows=batch.bank_start // BANK_STEP, alpha=batch.alpha)
    if len(batch.mixed):
        host.update(mixed=batch.mixed, partner=batch.partner, weight=batch.weight)
    if dropout and len(batch.dropped):
        host["dropped"] = batch.dropped
    if not host:
        return
    arrays = to_device(list(host.values())) if to_device is not None else \
        [torch.from_numpy(a).to(device) for a in host.values()]
    t = dict(zip(host, arrays))
    if "rad" in t:
        bank = bank_on(device)
        if window > BANK_SIZE:  # a patch bigger than the bank reads it cyclically
            bank = bank.repeat(-(-window // BANK_SIZE) + 1)
        # each window is pixel-major (R, p, p, B): seen in the view's (R, B, p, p) order
        noise = bank.unfold(0, window, BANK_STEP).index_select(0, t["rows"]).view(-1, p, p, bands).permute(0, 3, 1, 2)
        alpha = t["alpha"].to(work).view(-1, 1, 1, 1)
        x = view[t["rad"]].to(work)
        x.mul_(alpha).add_(noise, alpha=float(np.float32(aug.noise_std)))
        view[t["rad"]] = x.to(out.dtype)
    if "mixed" in t:
        r = p // 2
        w = t["weight"].to(work).view(-1, 1)
        centre = view[:, :, r, r]  # (N, B) view
        c, c2 = centre[t["mixed"]].to(work), centre[t["partner"]].to(work)  # read both before writing any
        centre[t["mixed"]] = (w * c + (1 - w) * c2).to(out.dtype)
    if "dropped" in t:
        d = t["dropped"]
        # a zero made on the device: a Python 0 becomes a host tensor that index_put_ copies over, and
        # that copy from pageable memory waits for everything queued on the stream (the training step)
        view[d[:, 0], d[:, 1]] = view.new_zeros(())
