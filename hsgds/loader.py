"""PatchLoader: the PyTorch-facing iterable of (patches, labels) batches, cut on the device.

No Python runs per patch and no worker process is started: a thread reads whole tiles into the ring
(kvikio into device memory, or POSIX into host memory), and one engine call per batch gathers,
casts, normalizes and lays out every patch of the batch.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from hsgds import defaults
from hsgds._gc import gc_paused
from hsgds._unset import Unset
from hsgds._version import __version__
from hsgds._wording import counted, listed
from hsgds.augment import MAX_EPOCH, Augment, AugmentBatch, Augmenter, draw
from hsgds.batches import BatchPrep, PinnedStaging, Prepared
from hsgds.collection import DeferredScene
from hsgds.engines import cpu_cut, make_engine
from hsgds.engines.base import TORCH_DTYPES, PatchSpec, PendingCut, resolve_out_dtype
from hsgds.errors import ConfigError, HsgdsError, as_count, as_flag, shown
from hsgds.io import make_reader
from hsgds.pixels import (
    PIXELS,
    GridSamples,
    ListedSamples,
    all_pixels,
    check_mask,
    excluded_pixels,
    labelled_pixels,
    listed_samples_apply,
    sampled_labels,
)
from hsgds.rank_settings import compare_across_ranks
from hsgds.ring import TileRing
from hsgds.sampling import EpochPlan, Samples, SampleSet, check_ring, plan_epoch, share_sizes
from hsgds.scene import BandStats, Scene
from hsgds.scene_set import (
    NORM_SCOPES,
    SceneSet,
    band_selection,
    check_output_range,
    normalization,
    normalization_rows,
    open_scene_set,
    scene_tables,
    shared_stats,
)

__all__ = ["LoaderStats", "PatchLoader", "normalization_constants"]

NORMALIZATIONS = ("zscore", "minmax", None)
# 2: shuffle windows that ramp up, each with a generator of its own (hsgds.sampling); a version-1 state
# named a position in an order this version no longer makes; 3: ranks share the samples equally, a tile
# on a cut read by two ranks (a version-2 state of one rank is the same position)
STATE_VERSION = 3


_HOST_WINDOW = 1024  # batches kept for the host-time medians
_CLOSED = "this PatchLoader was closed; its iterators yield nothing more: create a new loader"


@dataclass
class LoaderStats:
    """What the loader did and with what: throughput, waits, ring use, and the reader / engine that ran."""

    device: str
    reader: str
    engine: str
    slots: int
    ring_bytes: int
    batches: int = 0
    patches: int = 0
    elapsed_s: float = 0.0
    first_batch_s: float | None = None
    bytes_read: int = 0
    tiles_loaded: int = 0
    tiles_reused: int = 0
    consumer_wait_s: float = 0.0
    reader_wait_s: float = 0.0
    mean_occupancy: float = 0.0
    max_resident: int = 0
    reasons: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # per batch, the recent ones: time on the consuming thread inside next(loader) other than waiting
        # for tiles, and the engine call's share of it (seconds)
        self._host: deque[float] = deque(maxlen=_HOST_WINDOW)
        self._cut: deque[float] = deque(maxlen=_HOST_WINDOW)

    @property
    def patches_per_s(self) -> float:
        return self.patches / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def host_us_median(self) -> float | None:
        """Median time (µs) a recent batch spent on the consuming thread inside ``next(loader)``, waits for
        tiles excluded: the loader's own per-batch cost, the engine call included (on the CPU that call
        is the whole cut, or with the setting ``cut_ahead`` the start of the next batch's cut and the wait
        for this one's; on CUDA it only launches it)."""
        return 1e6 * float(np.median(self._host)) if self._host else None

    @property
    def cut_us_median(self) -> float | None:
        """Median time (µs) of the engine calls within :attr:`host_us_median` (starting the batch's cut,
        and waiting for it where the engine's threads cut it)."""
        return 1e6 * float(np.median(self._cut)) if self._cut else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "patches_per_s": self.patches_per_s, "host_us_median": self.host_us_median,
                "cut_us_median": self.cut_us_median}

    def __str__(self) -> str:  # print(loader.stats); repr() keeps every field
        return describe_stats(self.as_dict())


def describe_stats(stats: dict[str, Any]) -> str:
    """One line from :meth:`LoaderStats.as_dict` (as ``hsgds demo``'s report keeps it): what ran, how fast,
    what was read, and the waits."""
    host = stats.get("host_us_median")
    per_batch = "" if host is None else (f"; median per batch: {host:.0f} µs on this thread, "
                                         f"{stats.get('cut_us_median') or 0:.0f} µs of it cutting")
    first = stats["first_batch_s"]
    return (f"{stats['device']}, reader {stats['reader']}, engine {stats['engine']}, {stats['slots']} ring slots "
            f"({stats['ring_bytes'] / 2**20:.1f} MiB); {stats['patches']} patches in {stats['batches']} batches, "
            f"{stats['patches_per_s']:,.0f} patches/s; {stats['bytes_read'] / 2**20:.1f} MiB read "
            f"({stats['tiles_loaded']} tile reads, {stats['tiles_reused']} reused); first batch "
            f"{'-' if first is None else f'{1e3 * first:.0f} ms'}; waited {stats['consumer_wait_s']:.3f} s for tiles"
            f"{per_batch}")


_UNSET: Any = Unset("'train'; None with pixels='all'")  # split's default depends on ``pixels``


@dataclass
class _Started:
    """A batch whose cut has started (or whose start failed: ``error``, raised when the batch is reached)."""

    prep: Prepared | None
    index: torch.Tensor | None
    pending: PendingCut | None
    aug: AugmentBatch | None
    cut_s: float  # time spent starting the cut on the consuming thread
    error: Exception | None


def _scene_masks(ss: SceneSet, mask: Any) -> list[np.ndarray | None]:
    """The loader's ``mask`` as one checked boolean (H, W) array (or None) per scene."""
    if mask is not None and ss.is_collection:
        if not isinstance(mask, (list, tuple)) or len(mask) != len(ss):
            raise ConfigError(f"for a collection, mask must be a list of {len(ss)} boolean (H, W) arrays (or None "
                              f"entries), one per scene; got {type(mask).__name__}")
        masks = list(mask)
    else:
        masks = [mask] * len(ss)
    return [check_mask(m, scene, f"scene {name!r}") for m, scene, name in zip(masks, ss.scenes, ss.names)]


def _masks_digest(masks: list[np.ndarray | None]) -> str | None:
    """A fingerprint of the masks (their bits, scene by scene), None without any: a saved position is only
    the same pixels' under the same masks, which the samples digest cannot tell for several scenes. Packed
    bits, hashed once at start-up: ~0.07 s for 1,000 masks of 512x512."""
    if all(m is None for m in masks):
        return None
    h = hashlib.sha256()
    for m in masks:
        h.update(b"-" if m is None else np.array(m.shape, dtype=np.int64).tobytes() + np.packbits(m).tobytes())
    return h.hexdigest()[:16]


def _sample_sets(ss: SceneSet, pixels: str, stride: int, split: str | None, checked: list[np.ndarray | None],
                 guard: int = 0) -> Samples:
    """The samples of every scene, with global tile ids (scene's first tile id + tile id), inside its mask in
    ``checked`` (:func:`_scene_masks`); ``guard`` r: with pixels="all" and a split, no centre within r of
    another split's labelled pixel."""
    unmasked = all(m is None for m in checked)
    split_all = pixels == "all" and split is not None and any(scene.num_samples for scene in ss.scenes)
    # (a scene of a collection whose listing counts nodata pixels: GridSamples would open it for its map)
    nodata_all = pixels == "all" and any(getattr(scene, "nodata_pixels", 0) for scene in ss.scenes)
    if (pixels == "labelled" or ((split_all or nodata_all) and stride == 1 and not guard)) and unmasked and \
            listed_samples_apply(ss.scenes, pixels):
        # a collection's samples, counted per tile in collection.json: each store's sample table (or pixels
        # with data) is read when the loader first takes one of its samples, so starting does not open the stores
        return ListedSamples(list(ss.scenes), list(ss.names), split, pixels)  # type: ignore[arg-type]
    if pixels == "all" and unmasked:
        # every s-th pixel of every scene (less the other splits' labelled ones and the nodata pixels),
        # computed per batch from the tile geometry: memory per tile and per run of left-out pixels, not
        # per pixel (a whole scene for inference, an archive for self-supervised training never centred on
        # a test pixel); a collection's scene with nodata pixels is opened now to read its nodata map
        return GridSamples([scene.grid for scene in ss.scenes], stride,
                           [sampled_labels(scene, stride) for scene in ss.scenes],
                           [excluded_pixels(scene, stride, split, guard) for scene in ss.scenes])
    parts = [all_pixels(scene, stride, split, m, guard) if pixels == "all" else labelled_pixels(scene, split, m)
             for scene, m in zip(ss.scenes, checked)]
    if len(parts) == 1:
        return parts[0]
    # whole-array operations, not one per scene (an archive lists thousands)
    starts = ss.tile_starts()
    samples = np.array([len(p) for p in parts], dtype=np.int64)
    cat = {f: np.concatenate([getattr(p, f) for p in parts]) for f in ("y", "x", "label", "scene_y", "scene_x")}
    tile = np.concatenate([p.tile for p in parts]).astype(np.int64) + np.repeat(starts[:-1], samples)
    before = np.concatenate([[0], np.cumsum(samples)])  # samples of the scenes before each
    offsets = np.concatenate([[0], np.concatenate([p.offsets[1:] for p in parts])
                              + np.repeat(before[:-1], np.diff(starts))])
    return SampleSet(tile=tile if starts[-1] > np.iinfo(np.int32).max else tile.astype(np.int32),
                     offsets=offsets.astype(np.int64), **cat)


def normalization_constants(scene: Scene, normalize: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-band (offset, scale) the loader uses for one scene: out = (x - offset) * scale."""
    if normalize is not None and (not isinstance(normalize, str) or normalize not in NORMALIZATIONS):
        raise ConfigError(f"normalize must be 'zscore', 'minmax' or None, got {shown(normalize)}")
    offset, scale, _ = normalization(open_scene_set(scene), normalize, None)
    return offset[0], scale[0]


def ring_cap(device: torch.device) -> int:
    """The most bytes a ring sized by default (``ring_bytes=None``) takes on ``device``: a fraction of the GPU
    memory free now on CUDA (HSGDS_RING_GPU_FRACTION), else HSGDS_RING_CPU_BYTES."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * defaults.get("ring_gpu_fraction"))
    return int(defaults.get("ring_cpu_bytes"))


def _normalization_digest(shared: BandStats | None, normalize: str | None, offset: np.ndarray,
                          scale: np.ndarray) -> str | None:
    """What normalization the patches get, for ranks to compare (:meth:`PatchLoader._rank_settings`): a digest
    of the per-band offset and scale applied to every scene when they are one set (``norm_stats`` given, pooled,
    or the only scene's), which ranks given other statistics differ on; "each scene's own" when each scene has
    its own (they follow from the stores, which are compared); None without normalization. Hashed once, at
    start-up (two rows of B float64)."""
    if normalize is None:
        return None
    if shared is None:
        return "each scene's own"
    h = hashlib.sha256(np.ascontiguousarray(offset[0], dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(scale[0], dtype=np.float64).tobytes())
    return f"sha256 {h.hexdigest()[:16]}"


def _same_setting(saved: Any, mine: Any) -> bool:
    """Whether a state's setting is this loader's (an array in a damaged state is not: == would not say)."""
    try:
        return bool(saved == mine)
    except (ValueError, TypeError):
        return False


def _samples_digest(names: tuple[str, ...], samples: Samples) -> str:
    """What a saved position is a position in: the scenes (in order) and their samples per tile, and for one
    scene's sample table which pixels those are. A re-split or replaced store changes it. (Several scenes'
    pixels are left out: a collection's loader may list them from collection.json, never reading them,
    and its state must resume in a loader that opened the same stores; masks are told apart by
    :func:`_masks_digest`.)"""
    h = hashlib.sha256("\0".join(names).encode())
    h.update(np.ascontiguousarray(samples.counts(), dtype=np.int64).tobytes())
    if isinstance(samples, SampleSet) and len(names) == 1:  # which pixels, not only how many in each tile
        h.update(np.ascontiguousarray(samples.scene_y).data)  # the int32 arrays as they are: no copy
        h.update(np.ascontiguousarray(samples.scene_x).data)
    return h.hexdigest()[:16]


def _left_out_digest(names: tuple[str, ...], samples: Samples) -> str | None:
    """For one scene's every pixel (pixels="all") with pixels left out (other splits' labelled pixels, nodata),
    which ones: a store re-split with a train and a val pixel of one tile swapped keeps every tile's count, and
    the rest of a saved epoch would be other pixels. None otherwise. (A key of its own, not part of
    :func:`_samples_digest`, so that states saved before it existed still load.)"""
    if not (isinstance(samples, GridSamples) and len(names) == 1):
        return None
    left_out = samples.left_out()
    return hashlib.blake2b(left_out, digest_size=8).hexdigest() if left_out else None


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None and world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if rank is None or world_size is None:  # every process that forgot one would read the same shard
        raise ConfigError(f"pass both rank and world_size (or neither, to take torch.distributed's), got rank={shown(rank)}, "
                          f"world_size={shown(world_size)}")
    rank, world_size = as_count(rank, "rank", minimum=0), as_count(world_size, "world_size")
    if not rank < world_size:
        raise ConfigError(f"rank must be in 0..world_size-1, got rank={rank}, world_size={world_size}")
    return rank, world_size


#: how a message names the settings :meth:`PatchLoader._rank_settings` compares, where not by their keys
RANK_SETTING_LABELS = {
    "hsgds": "the hsgds version", "iterations": "how many times this loader was iterated",
    "stores": "the stores (in order)", "mask": "the mask (fingerprints of its bits)",
    "num_samples": "the number of samples", "samples": "the samples (digests of the stores' samples per tile)",
    "epoch": "the epoch", "batch": "the batch to start at", "batches": "the number of batches",
    "norm_stats": "the normalization statistics (digests of each band's offset and scale)",
}
#: what to do when ranks differ on a setting, where more than building every rank's loader alike
RANK_SETTING_FIXES = {
    "hsgds": "install the same hsgds on every node",
    "iterations": "every rank must iterate a loader sharded over the group together (one iter() each, as DDP "
                  "steps together); to read one on some ranks only, build it with rank=0, world_size=1",
    "samples": "every rank must read the same stores, with the same splits (a store re-split or replaced on some "
               "nodes only?)",
    "epoch": "call loader.set_epoch(epoch) with the same epoch on every rank",
    "batch": "load the same state (rank 0's state_dict()) on every rank, or on none",
    "norm_stats": "pass every rank the same norm_stats= (e.g. rank 0's loader.norm_stats, broadcast) or none, "
                  "and the same norm_scope",
}


#: samples whose labels class_counts() takes at a time (~100 MB of index arrays for pixels="all")
CLASS_COUNT_BLOCK = 1 << 22


class PatchLoader:
    """Iterate (patches, labels) batches of pixel-centred patches from an hsgds store.

    ``labels`` are (N,) int64 class indices from 0: the store's class k (labels 1..K, 0 = unlabelled) is
    yielded as k - 1, ready for ``cross_entropy``; -1 marks an unlabelled pixel (``pixels="all"``).

    Parameters
    ----------
    store : path, Scene, list of them, or Collection
        A store written by ``hsgds convert``; several (a list, or a collection: its folder, its
        ``collection.json`` or :func:`hsgds.open_collection`'s result) are read as one (below).
    patch_size : int
        Odd patch side p, at most the store's ``2 * halo + 1``.
    batch_size : int
    split : {"train", "val", "test", "none"} or None (every labelled pixel); default "train" (None with
        ``pixels="all"``)
    device : torch device or None
        None picks CUDA when usable, else CPU (``HSGDS_DEVICE=cpu`` forces CPU). None and "cuda" mean the
        current CUDA device, as in torch: a rank's own after ``torch.cuda.set_device(local_rank)``.
    dtype : torch floating dtype of the patches. One the normalized (and radiation-noised) values could
        overflow to inf, judged from each scene's band min / max, is refused (e.g. float16 beyond 65504).
    layout : "NCHW" (N, B, p, p) or "NHWC" (N, p, p, B).
    normalize : "zscore" (train mean / population std), "minmax", or None (cast only).
    shuffle, seed, drop_last : as in torch's DataLoader; the order is a pure function of
        (seed, epoch, rank, world size, shuffle window, ring slots).
    shuffle_window : int or None
        Tiles whose samples are mixed together; default: all of them when the split fits the ring (a true
        global shuffle), otherwise half the ring's slots (the next window loads while one is consumed).
        When an epoch has several windows, its first ones ramp up (2, 4, 8, ... tiles), so that its first
        batch waits for two tiles rather than a whole window.
    ring_bytes : int or None
        Memory for resident tiles; default: the whole split, capped (settings ``ring_cpu_bytes``, 2 GiB on
        CPU, and ``ring_gpu_fraction``, a quarter of free GPU memory; see docs/settings.md). A ring smaller
        than the split must hold every tile a batch can span in any epoch: a shuffled epoch can bring tiles
        with few samples together, so the ring is sized against that worst order (from the samples per tile)
        and one too small is refused here, naming the ``ring_bytes`` and the ``batch_size`` that fit.
    engine : "auto", "torch" or "dali"; reader : "auto", "posix", "posix-pinned" or "kvikio".
    rank, world_size : default to torch.distributed's when it is initialised as the loader is built (build it
        after ``init_process_group``: one built before, iterated in a group of several ranks, is refused).
        Given with the group's world size, the ranks must read a share each (``torch.distributed.get_rank()``,
        not ``LOCAL_RANK``, which repeats on every node: refused as the iteration starts). Every rank yields
        ``len(loader)`` batches; rank 0's :meth:`state_dict` resumes every rank.
    return_coords : also yield the scene (y, x) of each patch centre: (N, 2) int64 for one store,
        (N, 3) rows (scene index in the loader's order, y, x) for a list of stores or a collection path
        (even of one scene).
    pixels : "labelled" (the store's labelled samples of ``split``) or "all": patches centred on every
        ``stride``-th pixel (rows and columns, in scene coordinates) of every scene, labelled or not (label
        -1 where unlabelled), tile by tile and in raster order inside a tile when ``shuffle=False``. With
        "all", ``split`` (default None) drops the labelled pixels of other splits; unlabelled pixels stay.
        Pixels where the source had no data (a format v3 store's nodata map) are never yielded.
    stride : int, the step between centres with ``pixels="all"``.
    footprint_guard : bool, with ``pixels="all"`` and a ``split``: also leave out every centre whose patch
        would show a labelled pixel of another split (within ``patch_size // 2`` of one), so that no
        validation or test spectrum reaches a patch (e.g. self-supervised pretraining on the scene whose test
        split is evaluated). Default False: centres are never other splits' pixels, but footprints may
        include them.
    mask : a boolean (H, W) array (for several scenes, a list with one array or None per scene): only
        pixels where it is True are yielded. A saved state resumes only in a loader with the same mask.
    bands : band indices every scene contributes (same-sensor scenes, e.g. dropping water-vapour bands), in
        0..B-1 (no negative indices), in the order given; an index given twice yields that band twice.
    wavelengths : wavelengths in nm; each scene contributes its band nearest each one, within
        ``wavelength_tolerance`` nm (default 5), never a band without a centre (PRISMA's unused bands) nor
        one its source flags bad (``Scene.bad_bands``: an ENVI ``bbl``'s water-vapour bands; a wavelength
        whose only band near it is bad is refused). A wavelength equally near two bands takes the one the
        scene lists first (the lower index); wavelengths nearest the same band each take it. ``bands``
        indices are taken as given, bad ones included. Scenes with different band counts need this, and so
        do scenes whose band centres differ by more than ``wavelength_tolerance`` at some band index (other
        sensors: taken band by band they would mix other wavelengths; refused, naming the band).
    norm_scope : "scene" (each scene's own train statistics) or "collection" (the train statistics pooled
        exactly over all scenes).
    norm_stats : hsgds.BandStats or None
        Statistics of the output bands to normalize every scene with instead of its own, e.g. the
        ``norm_stats`` of the loader a model was trained with, when it predicts or is evaluated on other scenes.
        The attribute ``loader.norm_stats`` holds the statistics a loader normalizes every scene with when
        they are one set (these, the pooled ones of ``norm_scope="collection"``, or its one scene's), else None.
    augment : hsgds.Augment or None
        On-device augmentation (flips / quarter turns inside the cut, radiation and mixture noise, band
        dropout), seeded per (seed, epoch, sample): the same whatever the batch size, world size, ring size
        or resume point, except mixture noise's partner (a same-class sample of the same batch); see
        :mod:`hsgds.augment`. Radiation noise is added in the units of the values yielded (stored ones with
        ``normalize=None``). None (the default) leaves the batches untouched.

    Several scenes (a list of stores / Scenes, or a collection) are read as one: every tile gets a
    global id, tiles of all scenes are shuffled, sharded and resumed together, and each batch is still cut,
    cast, band-selected and normalized in one engine pass (the torch engine; engine="dali" serves one
    scene with all its bands only).
    """

    @gc_paused()  # over an archive: its scenes, sample counts and the first epoch's plan, built at once
    def __init__(self, store: Any, *, patch_size: int, batch_size: int, split: str | None = _UNSET,
                 device: Any = None, dtype: torch.dtype = torch.float32, layout: str = "NCHW",
                 normalize: str | None = "zscore", shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 shuffle_window: int | None = None, ring_bytes: int | None = None, engine: str = "auto",
                 reader: str = "auto", rank: int | None = None, world_size: int | None = None,
                 return_coords: bool = False, pixels: str = "labelled", stride: int = 1, mask: Any = None,
                 bands: Any = None, wavelengths: Any = None, wavelength_tolerance: float = 5.0,
                 norm_scope: str = "scene", norm_stats: BandStats | None = None,
                 augment: Augment | None = None, footprint_guard: bool = False) -> None:
        self._closed = True  # until fully built, so close() in __del__ is safe
        self._closing = threading.Lock()  # close() against a batch's cut starting on the consuming thread
        self._preps: set[BatchPrep] = set()  # the preparing threads of live iterators, which close() stops
        if augment is not None and not isinstance(augment, Augment):
            # (the class itself, its parentheses forgotten, read "got type")
            got = ("the class itself: create one, e.g. augment=hsgds.Augment(flip=True)"
                   if isinstance(augment, type) and issubclass(augment, Augment) else type(augment).__name__)
            raise ConfigError(f"augment must be an hsgds.Augment(...) or None, got {got}")
        self.augment = augment
        if not isinstance(pixels, str) or pixels not in PIXELS:  # (an array: numpy's ambiguity error)
            raise ConfigError(f"pixels must be 'labelled' or 'all', got {shown(pixels)}")
        stride = as_count(stride, "stride (pixels between patch centres)")
        if stride != 1 and pixels != "all":
            raise ConfigError("stride applies to pixels='all'; the labelled samples are taken as they are")
        if split is _UNSET:
            split = None if pixels == "all" else "train"
        if split is not None:  # its name, here: over unlabelled scenes pixels="all" never looks it up
            Scene.split_mask(np.zeros(0, np.uint8), split)  # the one-line unknown-split error
        footprint_guard = as_flag(footprint_guard, "footprint_guard")
        if footprint_guard and (pixels != "all" or split is None):
            raise ConfigError("footprint_guard keeps pixels='all' patches clear of other splits' labelled pixels: "
                              "pass it with pixels='all' and a split (e.g. split='train')")
        self.scenes = open_scene_set(store)
        self.scenes.check()
        self.scene = self.scenes.scenes[0]
        grid = self.scene.grid
        batch_size = as_count(batch_size, "batch_size")
        if batch_size >= 1 << 63:  # batch numbers are int64 (numpy raised OverflowError past it)
            raise ConfigError(f"batch_size must be below 2**63, got {shown(batch_size)}")
        shuffle, drop_last = as_flag(shuffle, "shuffle"), as_flag(drop_last, "drop_last")
        return_coords = as_flag(return_coords, "return_coords")
        if normalize is not None and (not isinstance(normalize, str) or normalize not in NORMALIZATIONS):
            raise ConfigError(f"normalize must be 'zscore', 'minmax' or None, got {shown(normalize)}")
        if shuffle_window is not None:
            shuffle_window = as_count(shuffle_window, "shuffle_window (tiles)")
        if ring_bytes is not None:  # a float (2e9) or a string reached torch.empty, True read as 1 byte
            if not isinstance(ring_bytes, (int, np.integer)) or isinstance(ring_bytes, bool):
                raise ConfigError(f"ring_bytes must be a whole number of bytes (e.g. 1 << 30), or None for the default; "
                                  f"got {type(ring_bytes).__name__} {shown(ring_bytes)}")
            ring_bytes = int(ring_bytes)
        seed = as_count(seed, "seed", minimum=0)
        if seed >= 1 << 64:
            raise ConfigError(f"seed must be below 2**64, got {shown(seed)}")
        selection = band_selection(self.scenes, bands, wavelengths, wavelength_tolerance)
        if not isinstance(norm_scope, str) or norm_scope not in NORM_SCOPES:
            raise ConfigError(f"norm_scope must be one of {', '.join(NORM_SCOPES)}, got {shown(norm_scope)}")
        if normalize is None and norm_stats is not None:
            raise ConfigError("norm_stats applies with normalize='zscore' or 'minmax', not normalize=None")
        #: the statistics every scene is normalized with, when they are one set (pooled, given, or the only
        #: scene's); None when each scene uses its own, or without normalization. Pass them to
        #: ``hsgds.predict(..., norm_stats=)`` to normalize other scenes as the model was trained.
        self.norm_stats = None if normalize is None else shared_stats(self.scenes, selection, norm_scope, norm_stats)
        # a collection's scenes not opened yet get their normalization when a batch first reaches them
        offset, scale, later = normalization(self.scenes, normalize, selection, self.norm_stats)
        self._norm_key = _normalization_digest(self.norm_stats, normalize, offset, scale)  # (_rank_settings)
        # tiles of different shapes (band counts, tile geometry) share slots sized for the largest, each
        # laid out from its slot's start; the engine reads every tile with its scene's strides
        shapes = {s.grid.tile_shape for s in self.scenes.scenes}
        tile_nbytes = max(s.grid.tile_nbytes for s in self.scenes.scenes)
        slot_shape = grid.tile_shape if len(shapes) == 1 else (tile_nbytes // grid.itemsize,)
        # per-scene tables only where needed: one store with all its bands keeps the single-table engines
        self._tables = None
        # the scene of every global tile: the engine's table row, and the first coordinate column of a
        # collection's batches (a collection of one scene, or a list of one store, included)
        self._tile_scene = self.scenes.tile_scene()
        if len(self.scenes) > 1 or selection is not None:
            self._tables = scene_tables(self.scenes, selection, offset, scale)
        elif later:  # one table: the spec's constants are needed now
            offset[later], scale[later] = normalization_rows(self.scenes, later, str(normalize), selection)
            later = []
        self._norm_later: set[int] = set(later)  # scenes whose table rows are not in the engine yet
        self._norm_rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # their rows, once read (_later_rows)
        self._norm_lock = threading.Lock()
        self._normalize, self._selection = normalize, selection
        # patches that would overflow the output dtype to inf are refused up front, from each scene's band
        # statistics: now for the scenes already open (a single one is opened), and for a collection's
        # scenes not opened yet when a batch first reaches them (_prepare), to keep a start that opens none
        self._out_dtype = resolve_out_dtype(dtype)
        self._offset, self._scale, self._later_all = offset, scale, frozenset(later)
        self._range_later: set[int] = set()
        if len(self.scenes) > 1:
            self._range_later = {i for i, s in enumerate(self.scenes.scenes)
                                 if isinstance(s, DeferredScene) and not s.is_open}
        for i in range(len(self.scenes)):
            if i not in self._range_later:
                self._check_range(i)
        # patch size (against the smallest halo), layout, dtype, tables: the spec checks itself; over several
        # scenes those that serve smaller patches are named first (the spec's message knows no scene)
        if len(self.scenes) > 1 and type(patch_size) is int and patch_size % 2 == 1:
            short = [(n, s.grid.halo) for n, s in zip(self.scenes.names, self.scenes.scenes) if s.grid.halo < patch_size // 2]
            if short:
                largest = 2 * min(h for _, h in short) + 1
                which = (f"scene {short[0][0]!r} serves ({largest}x{largest})" if len(short) == 1 else
                         f"{len(short)} scenes serve ({listed((repr(n) for n, _ in short), 12)}; down to {largest}x{largest})")
                raise ConfigError(f"patch_size {patch_size} is larger than {which}; convert again with --max-patch "
                                  f"{patch_size} (a collection: the same convert-many command with it), or pass a "
                                  "smaller patch_size")
        out_bands = grid.bands if selection is None else len(selection[0])
        spec = PatchSpec(patch_size=patch_size, halo=min(s.grid.halo for s in self.scenes.scenes), bands=out_bands,
                         tile_side=min(s.grid.side for s in self.scenes.scenes), layout=layout, out_dtype=dtype, offset=offset[0], scale=scale[0],
                         tables=self._tables)
        self.patch_size, self.batch_size, self.split = patch_size, batch_size, split
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.shuffle_window, self.return_coords = shuffle_window, return_coords
        self.pixels, self.stride, self.norm_scope = pixels, int(stride), norm_scope
        self.footprint_guard = footprint_guard
        # the input a model trained on this loader expects (hsgds.models.save_checkpoint(..., loader=))
        self.layout, self.dtype, self.normalize = layout, dtype, normalize
        self.bands = None if bands is None else [int(b) for b in bands]
        self.wavelengths = None if wavelengths is None else [float(w) for w in wavelengths]
        self.wavelength_tolerance = float(wavelength_tolerance)
        self.rank, self.world_size = _distributed(rank, world_size)
        self._rank_from_torch = rank is None and world_size is None

        from hsgds.choice import choose
        from hsgds.probe import probe

        # "auto" / "cuda" is the current CUDA device, as in torch: each rank's own GPU after set_device (asked
        # only when CUDA is chosen without an index: a CPU loader never initialises CUDA)
        self.choice = choose(probe(), reader=reader, engine=engine, device=device,
                             current_device=torch.cuda.current_device)
        if self._tables is not None and self.choice.engine == "dali":
            from hsgds.engines.dali_engine import NO_TABLES

            if engine != "auto":
                raise ConfigError(NO_TABLES)
            from dataclasses import replace

            self.choice = replace(self.choice, engine="torch", reasons=[
                *self.choice.reasons, "engine torch: several scenes or a band selection need per-scene tables"])
        self.device = torch.device(self.choice.device)
        out_name = str(dtype).removeprefix("torch.")
        fused_cpu = self.device.type == "cpu" and self.choice.engine == "torch" and defaults.get("numba")
        # 16-bit outputs on the CPU: each tile is normalized once, as it lands in the ring, and patches are
        # copied from it (the engine confirms below). Radiation noise needs the values before rounding.
        self._normalize_tiles = bool(fused_cpu and defaults.get("normalize_tiles")
                                     and not (augment is not None and augment.radiation_noise > 0)
                                     and cpu_cut.normalizes_tiles(grid.dtype, out_name, out_bands,
                                                                  min(s.grid.bands for s in self.scenes.scenes)))
        if fused_cpu:
            # numba's import and the kernel's load (~0.65 s) overlap the sample lookup and planning below
            cpu_cut.warm_up(grid.dtype, out_name, self._normalize_tiles)
        masks = _scene_masks(self.scenes, mask)
        self._mask_key = _masks_digest(masks)  # what a saved state's mask must be (load_state_dict)
        self.samples = _sample_sets(self.scenes, pixels, int(stride), split, masks,
                                    patch_size // 2 if footprint_guard else 0)
        if len(self.samples) == 0:
            where = f"{self.scene.path} has" if len(self.scenes) == 1 else f"the {len(self.scenes)} scenes have"
            unlabelled = not any(s.num_samples for s in self.scenes.scenes)  # (its train split was no help to name)
            if footprint_guard and len(_sample_sets(self.scenes, pixels, int(stride), split, masks, 0)):
                # the guard, not the split or the mask, left nothing
                raise ConfigError(f"{where} no pixel farther than patch_size // 2 = {patch_size // 2} px from another "
                                  f"split's labelled pixels (footprint_guard=True, split={split!r}); pass a smaller "
                                  "patch_size, or footprint_guard=False")
            if mask is not None and not (pixels == "labelled" and unlabelled):
                raise ConfigError(f"{where} no pixel to yield inside the mask (split={split!r}, pixels={pixels!r}); "
                                  "widen the mask")
            if pixels == "labelled" and (split is None or unlabelled):
                raise ConfigError(f"{where} no labelled pixels; convert with --labels, or pass pixels='all' for every "
                                  "pixel (label -1)")
            what = {"none": "pixels left out of every split", None: "pixels"}.get(split, f"{split} pixels")
            raise ConfigError(f"{where} no {what} (split={split!r}, pixels={pixels!r}); see `hsgds info` for its "
                              "splits")
        self._digest: tuple[str, str | None] | None = None  # of the samples, made when a state is first saved or loaded

        self._tile_nbytes = tile_nbytes
        needed = int(np.count_nonzero(self.samples.counts()))
        self.slots = self._slots(ring_bytes, needed)
        if isinstance(self.samples, (GridSamples, ListedSamples)):
            self.samples.keep_scenes(self.slots)  # the scenes of every resident tile stay read
        self._epoch, self._batch, self._pass = 0, 0, 0
        self._cursor: int | None = None  # the pass whose batches move (epoch, batch); None: set_epoch's
        self._resume = False
        self._plans: dict[int, EpochPlan] = {}
        # every rank's ring size (index: its share), gathered as a sharded iteration starts, for state_dict():
        # rank 0's state then resumes every rank, each of whose order was made with its own ring
        self._slots_by_rank: list[int] | None = None
        if drop_last and len(self.samples) >= self.world_size:  # (fewer samples than ranks: the plan says so)
            share = min(share_sizes(len(self.samples), self.world_size))
            if share < batch_size:  # every epoch would yield nothing, silently
                of = "the epoch has" if self.world_size == 1 else f"each of the {self.world_size} ranks has"
                raise ConfigError(f"batch_size={batch_size} with drop_last=True yields no batch: {of} {counted(share, 'sample')}; "
                                  f"lower batch_size to {share} or less, or pass drop_last=False")
        # a ring too small for a batch is reported now, before anything is allocated: for every epoch (a
        # shuffled order needs more tiles in some epochs than in others), from the samples per tile
        check_ring(self.samples.counts(), batch_size=batch_size, slots=self.slots, shuffle=shuffle,
                   world_size=self.world_size, drop_last=drop_last, tile_nbytes=tile_nbytes)
        self._plan(self._epoch)
        self._reader = make_reader(self.choice.reader, self.scenes.tile_source())
        try:
            self._engine = make_engine(self.choice.engine, spec, self.device, max_batch_size=batch_size)
            self.out_bands = out_bands  # bands of each patch (all of the scenes', or the selection's)
            # radiation noise and band dropout inside the cut where the engine can (the fused CPU kernel);
            # dropout only without mixture noise, which comes between them (hsgds.augment)
            fuse = augment is not None and self._engine.fuses_noise
            self._fused_dropout = fuse and augment is not None and augment.band_dropout > 0 and augment.mixture_noise == 0
            self._fused_radiation = fuse and augment is not None and augment.radiation_noise > 0
            self._normalize_tiles = self._normalize_tiles and self._engine.normalizes_tiles(TORCH_DTYPES[grid.dtype])
            # CUDA: the per-batch index copy (and the augmentation's arrays) go through a few reused pinned
            # buffers (hsgds.batches)
            self._staging = PinnedStaging(self.device) if self.device.type == "cuda" else None
            self._augmenter = None if augment is None else Augmenter(
                augment, self.seed, layout, fused_radiation=self._fused_radiation, fused_dropout=self._fused_dropout,
                to_device=None if self._staging is None else self._staging.stage_all)
            self._ring = TileRing(self.slots, slot_shape, TORCH_DTYPES[grid.dtype], self.device, self._reader,
                                  on_load=self._normalize_tile if self._normalize_tiles else None)
            self._reader.register(self._ring.storage)  # e.g. GDS pins the ring for DMA once, not per read
            self.stats = LoaderStats(device=str(self.device), reader=self._reader.name, engine=self._engine.name,
                                     slots=self.slots, ring_bytes=self.slots * tile_nbytes,
                                     reasons=list(self.choice.reasons) + list(self._engine.reasons))
            if self._normalize_tiles:
                self.stats.reasons.append(f"tiles normalized once as they are read, into {out_name}; patches copied "
                                          "from them (setting normalize_tiles)")
            self._cut_ahead = self._engine.cuts_ahead and bool(defaults.get("cut_ahead"))
            # the fused CPU kernel takes each batch's rows as built here, the ring checked once (None: start_cut)
            self._cutter = self._engine.ring_cutter(self._ring.storage, self._normalize_tiles)
            if self._cut_ahead:
                self.stats.reasons.append("the next batch is cut on the engine's threads while this one is handed out "
                                          "(setting cut_ahead)")
        except BaseException:  # e.g. a DALI build or the ring's allocation failing: release what was built
            for name in ("_ring", "_engine", "_reader"):
                with contextlib.suppress(Exception):
                    if hasattr(self, name):
                        getattr(self, name).close()
            raise
        self._closed = False

    # -- construction helpers -------------------------------------------------------------------------
    def _check_range(self, i: int) -> None:
        """Refuse scene ``i`` if its patches would overflow the output dtype (see check_output_range)."""
        if i in self._later_all:  # normalized on first use: its rows are read (once) now
            offset, scale = self._later_rows([i])[0]
        else:
            offset, scale = self._offset[i], self._scale[i]
        check_output_range(self.scenes, i, self._selection, offset, scale, self._out_dtype, self._normalize,
                           self.augment)

    def _check_ranges_of(self, scene_of_sample: np.ndarray) -> None:
        """:meth:`_check_range` of the batch's scenes not checked yet (prep thread; a set test once all are)."""
        with self._norm_lock:
            need = [int(i) for i in np.unique(scene_of_sample) if int(i) in self._range_later]
        for i in need:
            self._check_range(i)
            with self._norm_lock:
                self._range_later.discard(i)

    def _normalize_tile(self, slot: int, tile: int) -> None:
        """The ring's ``on_load``: the tile just read rewritten as the output's values (reader thread). A
        scene normalized on first use may have no rows in the engine yet: its own are read here then."""
        table = int(self._tile_scene[tile]) if self._tables is not None else 0
        rows = self._later_rows([table])[0] if table in self._norm_later else ()
        self._engine.normalize_tile(self._ring.storage, slot, table, *rows)

    def _slots(self, ring_bytes: int | None, needed: int) -> int:
        nbytes = self._tile_nbytes
        if ring_bytes is None:
            return max(2, min(needed, ring_cap(self.device) // nbytes))
        if ring_bytes < nbytes:
            raise ConfigError(f"ring_bytes={ring_bytes} is smaller than one tile ({nbytes} bytes); "
                              f"use at least {nbytes}, or {2 * nbytes} so that reading overlaps cutting")
        return max(1, min(needed, ring_bytes // nbytes))

    def _plan(self, epoch: int) -> EpochPlan:
        plan = self._plans.get(epoch)
        if plan is None:
            plan = plan_epoch(self.samples, batch_size=self.batch_size, seed=self.seed, epoch=epoch,
                              shuffle=self.shuffle, slots=self.slots, window=self.shuffle_window,
                              rank=self.rank, world_size=self.world_size, drop_last=self.drop_last)
            self._plans = {epoch: plan}
        return plan

    # -- the PyTorch-facing API -----------------------------------------------------------------------
    def class_counts(self) -> np.ndarray:
        """(K,) int64: the samples of each class in what this loader reads, all ranks' shares together (as the
        split holds them: before ``drop_last`` drops and the repeat that pads a share; the same on every rank;
        index k: label k, the store's class k + 1), for class weights (``hsgds.train.class_weights``). Unlabelled
        samples (label -1, ``pixels="all"``) are not counted; K is the scenes' class count. Counted a block of
        samples at a time: ``pixels="all"`` over a large scene never lists every pixel at once."""
        counts = np.zeros(max(int(s.num_classes or 0) for s in self.scenes.scenes), np.int64)
        n, step = len(self.samples), CLASS_COUNT_BLOCK
        for start in range(0, n, step):
            labels = np.asarray(self.samples.take(np.arange(start, min(n, start + step)))[3], dtype=np.int64)
            got = np.bincount(labels[labels >= 0], minlength=len(counts))
            counts = np.pad(counts, (0, len(got) - len(counts))) + got
        return counts

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch."""
        return self._plan(self._epoch).num_batches

    @property
    def ring(self) -> TileRing:
        """The ring of resident tiles (its ``storage``, ``reader`` and ``stats``), for diagnostics and
        benchmarks such as ``hsgds bench``'s raw read timing; nothing may write into it while iterating."""
        return self._ring

    @property
    def epoch(self) -> int:
        return self._epoch

    def read_order(self, epoch: int | None = None) -> list[int]:
        """The tile ids (global ids for several scenes) in the order the ring reads them in ``epoch``
        (default: the current one), once per residency interval: each is a read into a slot, or a reuse of
        the tile where a slot still holds it (``stats.tiles_loaded + stats.tiles_reused``); their files are
        ``loader.ring.reader.source.paths[i]``. For staging a store on faster storage in reading order,
        or timing raw reads of the same files."""
        plan = self._plan(self._epoch if epoch is None else as_count(epoch, "epoch", minimum=0))
        return [iv.tile for iv in plan.intervals]

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch`` (a new order). Iterating a whole epoch also advances it.

        An iterator yields the epoch in force when ``iter()`` was called (as torch's DataLoader reads its
        DistributedSampler's epoch): one already made, even before its first batch, keeps its epoch's order
        and augmentation to its end, and the epoch set here starts with the next ``iter()``.

        After :meth:`load_state_dict`, setting the restored epoch keeps the restored position, so the
        usual ``for epoch in ...: loader.set_epoch(epoch)`` loop resumes where the state says.
        """
        epoch = as_count(epoch, "epoch", minimum=0)
        if epoch >= MAX_EPOCH:
            raise ConfigError(f"epoch must be below 2**62 (augmentation keys on 62 bits of it), got {epoch}")
        if self._resume and epoch == self._epoch:
            return
        self._epoch, self._batch, self._resume = epoch, 0, False
        self._cursor = None  # a live iterator finishes its own epoch without moving this position

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is (epoch, batches yielded) and the settings the order depends on.

        A loader given this state with :meth:`load_state_dict` yields exactly the rest of the sequence.
        (Iterating this same loader again without loading a state restarts the current epoch.)
        A loader sharded over a process group that has iterated (or loaded such a state) also saves every rank's
        ring size, ``slots_by_rank``: rank 0's state then resumes each rank with the ring its own order was made
        with.
        """
        return {"version": STATE_VERSION, "epoch": self._epoch, "batch": self._batch, "seed": self.seed,
                "batch_size": self.batch_size, "split": self.split, "rank": self.rank,
                "world_size": self.world_size, "num_samples": len(self.samples), "shuffle": self.shuffle,
                "drop_last": self.drop_last, "shuffle_window": self.shuffle_window, "slots": self.slots,
                "slots_by_rank": None if self._slots_by_rank is None else list(self._slots_by_rank),
                "pixels": self.pixels, "stride": self.stride, "footprint_guard": self.footprint_guard,
                "scenes": len(self.scenes),
                "augment": None if self.augment is None else repr(self.augment), "samples": self._samples_key()[0],
                "left_out": self._samples_key()[1], "mask": self._mask_key}

    def _samples_key(self) -> tuple[str, str | None]:
        """What a saved position is a position in (:func:`_samples_digest`, :func:`_left_out_digest`); hashed
        once, not at start-up."""
        if self._digest is None:
            names = self.scenes.names
            self._digest = _samples_digest(names, self.samples), _left_out_digest(names, self.samples)
        return self._digest

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise ConfigError(f"loader state must be the dict PatchLoader.state_dict() returned, got "
                              f"{type(state).__name__}")
        if state.get("version") == 1:
            raise ConfigError("loader state was saved by an older hsgds whose shuffled order differs from this one's "
                              f"(state version 1, now {STATE_VERSION}): the rest of its epoch cannot be resumed exactly; "
                              "start the next epoch instead (loader.set_epoch(epoch + 1))")
        if state.get("version") == 2 and state.get("world_size") != 1:
            raise ConfigError("loader state was saved by an older hsgds that dealt whole tiles to the ranks (state "
                              f"version 2, now {STATE_VERSION}): the rest of its epoch cannot be resumed exactly; "
                              "start the next epoch instead (loader.set_epoch(epoch + 1))")
        if state.get("version") not in (2, STATE_VERSION):  # one rank plans as in version 2
            raise ConfigError(f"loader state has version {state.get('version')!r}, expected {STATE_VERSION}; "
                              "pass a state made by PatchLoader.state_dict()")
        saved_mask = state.get("mask", self._mask_key)  # (absent in older states)
        if saved_mask != self._mask_key:  # the same counts per tile can be other pixels
            saved_as, mine_as = ("no mask" if k is None else f"mask {shown(k)}" for k in (saved_mask, self._mask_key))
            raise ConfigError(f"loader state was saved with {saved_as} but this loader has {mine_as} (fingerprints "
                              "of the masks' bits): its rest of the epoch would be other pixels; build the loader "
                              "with the same mask, or start the next epoch (loader.set_epoch(epoch + 1))")
        mine = self.state_dict()
        # states saved before these settings existed
        older = {"pixels": "labelled", "stride": 1, "scenes": 1, "footprint_guard": False}
        for key in ("seed", "batch_size", "split", "world_size", "footprint_guard", "num_samples", "shuffle",
                    "drop_last", "shuffle_window", "pixels", "stride", "scenes", "augment"):
            if not _same_setting(state.get(key, older.get(key)), mine[key]):
                saved = state.get(key)
                ranks = counted(saved, "rank") if type(saved) is int else f"{shown(saved)} ranks"
                fix = ("resume with the same settings" if key != "world_size" else  # the shares are cut per world size
                       f"relaunch with {ranks} to resume, or start the next epoch without the "
                       "state (loader.set_epoch(epoch + 1))")
                raise ConfigError(f"loader state was saved with {key}={shown(state.get(key), 200)} but this loader "
                                  f"has {key}={shown(mine[key], 200)}; {fix}")
        samples, left_out = self._samples_key()  # (each absent in older states: unchecked)
        if (state.get("samples", samples), state.get("left_out", left_out)) != (samples, left_out):
            raise ConfigError("loader state was saved over other samples (another store or scene order, or the "
                              "store was re-split or replaced since): its rest of the epoch is not this loader's; "
                              "resume on the same stores, or start the next epoch (loader.set_epoch(epoch + 1))")
        # the shuffle window, hence the order, of a rank's share depends on its own ring: a state saved in a
        # group holds every rank's (slots_by_rank; rank 0's state resumes every rank), an older or unsharded
        # one its own ring (slots)
        saved, whose, by_rank = state.get("slots"), "", state.get("slots_by_rank")
        if by_rank is not None:
            ok = isinstance(by_rank, list) and len(by_rank) == self.world_size
            saved, whose = (by_rank[self.rank] if ok else None), f" for rank {self.rank}"
        if saved != self.slots:
            fix = (f"pass ring_bytes={saved * self._tile_nbytes} ({saved} tiles of {self._tile_nbytes} bytes) to "
                   "resume the same order" if type(saved) is int and saved > 0 else "the state is damaged")
            raise ConfigError(f"loader state was saved with a ring of {shown(saved)} tiles{whose} but this loader "
                              f"has {self.slots}; {fix}")
        epoch, batch = state.get("epoch"), state.get("batch")
        if not (type(epoch) is int and type(batch) is int and 0 <= epoch < MAX_EPOCH and 0 <= batch <= len(self)):
            raise ConfigError(f"loader state has an invalid position epoch={epoch!r}, batch={batch!r} (this loader "
                              f"yields {len(self)} batches an epoch)")
        self._epoch, self._batch = epoch, batch
        if by_rank is not None:  # a state saved before this loader iterates carries every rank's ring on
            self._slots_by_rank = list(by_rank)
        self._cursor = None  # a live iterator no longer moves the position restored here
        self._resume = True

    def __iter__(self):
        if self._closed:
            raise HsgdsError("this PatchLoader is closed; create a new one")
        self._check_still_one_rank()
        with gc_paused():  # a new epoch's plan and the ring's schedule: an interval per tile
            plan = self._plan(self._epoch)
            # only a restored state resumes mid-epoch; a new iteration after an early break restarts the epoch
            start = min(self._batch, plan.num_batches) if self._resume else 0
            if self._sharded_over_group():  # before anything changes: a refused iteration leaves the loader as it was
                each = compare_across_ranks(self._rank_settings(plan, start), self.rank, self.device,
                                            RANK_SETTING_LABELS, RANK_SETTING_FIXES, carried={"slots": self.slots})
                self._slots_by_rank = [values["slots"] for values in each]
            self._resume, self._batch = False, start
            self._pass += 1
            self._cursor = self._pass
            self._ring.start(plan.intervals_from(start))
        # the epoch now, not at the first next(): the plan above is this epoch's, and so must be the
        # augmentation keyed on it (set_epoch may come in between)
        return self._batches(plan, start, self._pass, self._epoch)

    def _check_still_one_rank(self) -> None:
        """A loader built before ``init_process_group`` took rank 0 of 1: every rank would train on the whole split
        (DDP runs, on duplicated data). Refused when it is iterated in a process group of several ranks."""
        if not (self._rank_from_torch and self.world_size == 1):
            return
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ConfigError(f"this PatchLoader was built before torch.distributed was initialised, so each of the "
                              f"{dist.get_world_size()} ranks would read the whole split; build it after "
                              "init_process_group (each rank then reads its share), or pass rank=0, world_size=1 "
                              "to read all of it on purpose")

    def _sharded_over_group(self) -> bool:
        """Whether this loader reads a share of the initialised process group's ranks (its world size is the
        group's, its rank torch's or one given): then every rank iterates it, must have built it alike, and must
        read a share of its own (a rank given LOCAL_RANK reads another node's share twice). rank=0, world_size=1
        (hsgds.predict's, a whole split read on purpose) and a loader of another world size are not compared."""
        dist = torch.distributed
        return (self.world_size > 1 and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() == self.world_size)

    def _rank_settings(self, plan: EpochPlan, start: int) -> dict[str, Any]:
        """What every rank's iteration must agree on (:mod:`hsgds.rank_settings`), the likeliest cause first:
        where the iterations pair up, then the inputs of the shares (stores, samples, split, ...), then the
        order's settings, then the position; the number of batches last (it follows from the rest).
        The ring's size is not compared: it orders a rank's own share only (ranks' free GPU memory differs); the
        gather collects it beside the settings, for :meth:`state_dict`."""
        names = "\0".join(self.scenes.names)
        stores = ", ".join(self.scenes.names) if len(names) <= 100 else \
            f"{len(self.scenes)} scenes (sha256 {hashlib.sha256(names.encode()).hexdigest()[:16]})"
        return {"hsgds": __version__, "iterations": self._pass + 1, "world_size": self.world_size,
                "stores": stores, "split": self.split, "pixels": self.pixels, "stride": self.stride,
                "footprint_guard": self.footprint_guard, "mask": self._mask_key, "num_samples": len(self.samples),
                "samples": "/".join(k for k in self._samples_key() if k), "seed": self.seed, "shuffle": self.shuffle,
                "shuffle_window": self.shuffle_window, "batch_size": self.batch_size, "drop_last": self.drop_last,
                "patch_size": self.patch_size, "bands": self.bands, "wavelengths": self.wavelengths,
                "normalize": self.normalize, "norm_stats": self._norm_key, "layout": self.layout,
                "dtype": str(self.dtype),
                "augment": None if self.augment is None else repr(self.augment), "epoch": self._epoch,
                "batch": start, "batches": plan.num_batches}

    def _prepare(self, plan: EpochPlan, epoch: int) -> Callable[[int], Prepared]:
        """The per-batch index work, run ahead on the BatchPrep thread: sample lookups, the batch's
        tiles, augmentation draws, and the (R, N) int64 rows of the one host-to-device copy (row 0,
        the ring slots, is filled in by the consumer once the tiles are resident)."""
        s, tables, coords3 = self.samples, self._tables is not None, self.scenes.is_collection
        geometric = self.augment is not None and self.augment.geometric
        count = 4 + tables + geometric + (2 + coords3 if self.return_coords else 0)

        def make(b: int) -> Prepared:
            idx = plan.batch(b)
            tile, y, x, label, scene_y, scene_x = s.take(idx)
            tiles, inverse = np.unique(tile, return_inverse=True)
            rows = np.empty((count, len(idx)), dtype=np.int64)
            rows[1], rows[2], rows[3] = y, x, label
            r = 4
            if tables:
                rows[r] = self._tile_scene[tile]
                r += 1
            aug = noise = None
            if self.augment is not None:  # keyed on each sample's index in the sample set
                aug = draw(self.augment, self.seed, epoch, idx, label, self.out_bands, self.patch_size)
                if aug.dihedral is not None:
                    rows[r] = aug.dihedral
                    r += 1
                noise = self._noise(aug, len(idx))
            if self.return_coords:
                if coords3:
                    rows[r] = self._tile_scene[tile]
                    r += 1
                rows[r], rows[r + 1] = scene_y, scene_x
            if self._range_later:  # a collection's scenes reached for the first time
                self._check_ranges_of(rows[4])
            norm = self._norm_for(rows[4]) if self._norm_later else None
            return Prepared(b, idx, tiles, inverse, rows, (aug, noise, norm))

        return make

    def _norm_for(self, scene_of_sample: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(scenes, offset rows, scale rows) of the batch's scenes whose table rows the engine lacks (their
        stores opened and statistics read here, on the prep thread, once per scene), or None."""
        later = self._norm_later  # the consumer removes what it has applied
        need = [int(i) for i in np.unique(scene_of_sample) if int(i) in later]
        if not need:
            return None
        rows = self._later_rows(need)
        return np.asarray(need, np.int64), np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])

    def _later_rows(self, scenes: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(offset, scale) rows of ``scenes``, among those normalized on first use, each read once (its store
        opened for its statistics) by whichever thread needs it first: the prep thread, or a reader thread
        normalizing one of its tiles."""
        with self._norm_lock:
            new = [i for i in scenes if i not in self._norm_rows]
            if new:
                offset, scale = normalization_rows(self.scenes, new, str(self._normalize), self._selection)
                self._norm_rows.update({i: (offset[k], scale[k]) for k, i in enumerate(new)})
            return [self._norm_rows[i] for i in scenes]

    def _noise(self, aug: AugmentBatch, n: int) -> cpu_cut.Noise | None:
        """The batch's radiation noise and band dropout for the engine's cut, where it applies them."""
        if not (self._fused_radiation or self._fused_dropout):
            return None
        assert self.augment is not None and self._augmenter is not None
        window = self.out_bands * self.patch_size**2
        bank = self._augmenter.host_bank(window) if self._fused_radiation else np.zeros(0, np.float32)
        radiated = aug.radiated if self._fused_radiation else aug.radiated[:0]
        return cpu_cut.make_noise(n, radiated, aug.alpha, aug.bank_start, bank, self.augment.noise_std,
                                  aug.dropped if self._fused_dropout else None)

    def _batches(self, plan: EpochPlan, start: int, pass_id: int, epoch: int):
        coord_row = self._coord_row()
        t0 = time.perf_counter()
        base_elapsed = self.stats.elapsed_s
        # batch b+1's (and b+2's) index arrays are built on another thread while batch b is consumed
        ahead = BatchPrep(self._prepare(plan, epoch), start, plan.num_batches, depth=2)
        self._preps.add(ahead)
        taken: dict[int, Prepared] = {}  # batches taken from `ahead` whose tiles were not all resident yet
        started: _Started | None = None  # batch b+1, cut ahead on the engine's threads (setting cut_ahead)
        consumer = threading.get_ident()  # the thread iterating (this body runs on it at every next())
        try:
            for b in range(start, plan.num_batches):
                if self._closed:
                    raise HsgdsError(_CLOSED)
                if pass_id != self._pass:
                    raise HsgdsError("this iterator was superseded by a newer iteration of the same loader")
                t_in, wait_in = time.perf_counter(), self._ring.stats.consumer_wait_s
                cur = started if started is not None else self._start_batch(ahead, b, taken, wait=True)
                assert cur is not None  # waiting for the tiles, the batch always starts
                started = None
                if cur.error is not None:
                    raise cur.error
                if self._cut_ahead and b + 1 < plan.num_batches:
                    # its Python (tiles, index, checks) runs while the engine's threads cut batch b; an error
                    # is raised when batch b+1 is reached, not one batch early
                    try:
                        started = self._start_batch(ahead, b + 1, taken, wait=False)
                    except Exception as exc:  # noqa: BLE001 - kept for its own batch, raised there
                        started = _Started(None, None, None, None, 0.0, exc)
                assert cur.prep is not None and cur.index is not None and cur.pending is not None
                t_wait = time.perf_counter()
                patches = cur.pending.result()
                t_cut = cur.cut_s + time.perf_counter() - t_wait
                if cur.aug is not None and self._augmenter is not None:
                    self._augmenter(patches, cur.aug)
                index = cur.index
                labels = index[3]
                self._ring.release_batch(b)
                if self._cursor == pass_id:
                    self._batch = b + 1
                self._account(len(cur.prep.idx), t0, base_elapsed)
                self.stats._cut.append(t_cut)
                self.stats._host.append(time.perf_counter() - t_in - (self._ring.stats.consumer_wait_s - wait_in))
                del cur
                if self.return_coords:
                    yield patches, labels, index[coord_row:].t().contiguous()
                else:
                    yield patches, labels
                consumer = threading.get_ident()
                # hold no reference across the next cut: a consumer that has dropped this batch (predict
                # does) lets the engine reuse its buffer instead of allocating a second one
                del patches, labels, index
            if self._cursor == pass_id:
                self._epoch, self._batch = epoch + 1, 0
        finally:
            # an abandoned iterator that the garbage collector finalizes on another thread waits for nothing:
            # on a cutting thread, the batch cut ahead may be that thread's own job (it would wait for
            # itself), on the ring's threads stop() would join the thread it runs on; the next iter() or
            # close() stops the ring instead
            waits = threading.get_ident() == consumer
            if waits and started is not None and started.pending is not None:
                with contextlib.suppress(Exception):  # no thread may still read the ring once this pass ends
                    started.pending.result()
            ahead.close()
            self._preps.discard(ahead)
            if waits and pass_id == self._pass and not self._closed:
                self._ring.stop()

    def _coord_row(self) -> int:
        """The first row of the coordinates in a batch's index: rows slot, y, x, label, [table], [dihedral]."""
        geometric = self.augment is not None and self.augment.geometric
        return 4 + (self._tables is not None) + geometric

    def _start_batch(self, ahead: BatchPrep, b: int, taken: dict[int, Prepared], wait: bool) -> _Started | None:
        """Start cutting batch ``b``: its prepared index, its tiles' slots, the one host-to-device copy and
        the cut (on CUDA, enqueued; on the CPU with the fused kernel, left to the engine's threads). With
        ``wait=False``, None when its tiles are not all resident yet (the batch is kept in ``taken``)."""
        try:
            prep = taken.pop(b) if b in taken else ahead.get(b)  # normally ready: built ahead
        except RuntimeError:
            if self._closed:  # its preparing thread stopped by close() from another thread
                raise HsgdsError(_CLOSED) from None
            raise
        if wait:
            slots = self._ring.acquire(prep.tiles)
        else:
            got = self._ring.ready(prep.tiles)
            if got is None:
                taken[b] = prep
                return None
            slots = got
        rows = prep.rows
        rows[0] = slots[prep.inverse]
        # one host-to-device copy per batch carries the cut coordinates, labels and centres; from a
        # reused pinned buffer it is asynchronous, so it never waits for the training stream
        index = self._staging.stage(rows) if self._staging is not None else torch.from_numpy(rows)  # CUDA
        # an engine reading the coordinates on the host (DALI) gets them here, not back from the device
        cut_rows = torch.from_numpy(rows) if self._engine.host_coords else index
        aug, noise, norm = prep.extra
        if norm is not None and self._norm_later:  # scenes reached for the first time
            self._engine.set_table_rows(*norm)  # other rows than those of a batch still being cut
            self._norm_later.difference_update(norm[0].tolist())
        dihedral_row = self._coord_row() - 1 if aug is not None and aug.dihedral is not None else None
        t_start = time.perf_counter()
        with self._closing:  # close() from another thread: before this cut starts, or after it has started
            if self._closed:
                raise HsgdsError(_CLOSED)
            if self._cutter is not None:
                pending = self._cutter.start(rows[0], rows[1], rows[2], rows[4] if self._tables is not None else None,
                                             None if dihedral_row is None else rows[dihedral_row].astype(np.int8),
                                             noise)
            else:
                pending = self._engine.start_cut(self._ring.storage, cut_rows[0], cut_rows[1], cut_rows[2],
                                                 cut_rows[4] if self._tables is not None else None,
                                                 dihedral=None if dihedral_row is None else cut_rows[dihedral_row],
                                                 noise=noise, normalized=self._normalize_tiles)
        return _Started(prep, index, pending, aug, time.perf_counter() - t_start, None)

    def _account(self, n: int, t0: float, base_elapsed: float) -> None:
        st, rs = self.stats, self._ring.stats
        now = time.perf_counter()
        if st.first_batch_s is None:
            st.first_batch_s = now - t0
        st.batches += 1
        st.patches += n
        st.elapsed_s = base_elapsed + (now - t0)
        st.bytes_read, st.tiles_loaded, st.tiles_reused = rs.bytes_read, rs.tiles_loaded, rs.tiles_reused
        st.consumer_wait_s, st.reader_wait_s = rs.consumer_wait_s, rs.reader_wait_s
        st.mean_occupancy, st.max_resident = rs.mean_occupancy, rs.max_resident

    # -- shutdown -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the reader thread, free the ring and close files. Idempotent."""
        with self._closing:  # a cut being started on the consuming thread is started before the engine closes
            if self._closed:
                return
            self._closed = True
        # an iterator left suspended (not exhausted, still referenced) keeps no thread running
        for prep in list(self._preps):
            prep.close()
        self._ring.close()
        self._reader.close()
        self._engine.close()

    def __enter__(self) -> PatchLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

