"""Full-scene inference (``hsgds.predict``; the module is ``hsgds.inference`` so that the package attribute
stays the function): every pixel's patch through a model, the class map assembled on the device.

:func:`predict` reads the scene with a :class:`~hsgds.PatchLoader` over every pixel (``pixels="all"``,
in tile order, each tile read once, borders from the store's padding), runs the model on each batch
under ``torch.inference_mode()`` and scatters ``argmax + 1`` into an (H, W) map that lives on the
device; the map crosses to the host once, at the end. Per-class probabilities, when asked for, go to a
float16 (H, W, K) ``.npy`` file batch by batch (:class:`~hsgds.writers.ProbabilityFile`), never whole
in memory. Outputs are written atomically by :mod:`hsgds.writers`.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hsgds._sha256 import sha256_of
from hsgds._unset import Unset
from hsgds.augment import dihedral_batch
from hsgds.collection import Collection
from hsgds.engines.base import OUT_DTYPES, resolve_out_dtype
from hsgds.errors import ConfigError, InputError, as_count, as_flag, as_path, one_line, shown, shown_path
from hsgds.models import LoadedModel, load_model
from hsgds.scene import Scene, check_mask, open_scene

__all__ = ["RunInputs", "check_outputs", "predict", "ring_bytes_for"]


def ring_bytes_for(scene: Scene, batch_size: int, mask: np.ndarray | None = None) -> int:
    """A small ring for tile-order inference: twice the most tiles one batch can span (the reader fills
    the next tiles while the model runs), at least 4. Pixels come tile by tile, so a bigger ring would
    only hold tiles already done: the scene never has to fit in memory.

    The span counts each tile's pixels (fewer in the last tile row and column, under ``mask``, or where
    the source had no data): a batch that starts at the last pixel of tile i covers the tiles holding the
    next batch_size - 1 pixels.
    """
    return _ring_bytes(scene, batch_size, _predicted(scene, mask))


def _ring_bytes(scene: Scene, batch_size: int, keep: np.ndarray | None) -> int:
    """:func:`ring_bytes_for` with the pixels to predict known (None: every pixel)."""
    return max(4, 2 * _span(_tile_counts(scene, keep), batch_size)) * scene.grid.tile_nbytes


def _tile_counts(scene: Scene, keep: np.ndarray | None) -> np.ndarray:
    """The pixels to predict in each tile that holds any, in tile order (``keep`` None: every pixel)."""
    g = scene.grid
    counts: np.ndarray = np.zeros((g.nty, g.ntx), np.int64)
    for ty in range(g.nty):
        for tx in range(g.ntx):
            y0, y1, x0, x1 = g.core_window(ty * g.ntx + tx)
            counts[ty, tx] = (y1 - y0) * (x1 - x0) if keep is None else int(keep[y0:y1, x0:x1].sum())
    counts = counts.reshape(-1)
    return counts[counts > 0]


def _span(counts: np.ndarray, batch_size: int) -> int:
    """The most tiles one batch of ``batch_size`` pixels spans when pixels come tile by tile (``counts``)."""
    ends = np.cumsum(counts)
    last = np.minimum(np.searchsorted(ends, ends + batch_size - 1, side="left"), len(ends) - 1)
    return int((last - np.arange(len(ends))).max(initial=0)) + 1


def _batch_in_budget(scene: Scene, batch_size: int, keep: np.ndarray | None, budget: int) -> tuple[int, int]:
    """(the loader's batch size, its ring bytes) for inference within ``budget`` bytes of ring: ``batch_size``
    with :func:`ring_bytes_for`'s ring when that fits, else the largest smaller batch whose ring does. A sparse
    mask (a few pixels in each of many tiles) spreads one batch over many tiles, and its ring, resident all at
    once, could otherwise reach the whole scene (device memory on a GPU). The map does not depend on it: the
    model runs in eval mode, each pixel on its own."""
    counts, nbytes = _tile_counts(scene, keep), scene.grid.tile_nbytes
    fits = max(4, budget // nbytes)  # tiles (4: the least ring_bytes_for gives)
    low, high = 1, batch_size  # the span grows with the batch: the largest batch with 2 * span <= fits
    if 2 * _span(counts, batch_size) <= fits:
        low = high
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if 2 * _span(counts, mid) <= fits else (low, mid - 1)
    return low, max(4, 2 * _span(counts, low)) * nbytes


def _ring_budget(device: Any) -> int:
    """The most ring bytes predict sizes itself for: the loader's default cap (:func:`~hsgds.loader.ring_cap`) on a
    CUDA device given as such, else on the CPU (also for a device left to the loader)."""
    from hsgds.loader import ring_cap

    try:
        wanted = None if device is None or isinstance(device, str) and device == "auto" else torch.device(device)
    except (RuntimeError, TypeError, ValueError):  # the loader names a bad device
        wanted = None
    cuda = wanted is not None and wanted.type == "cuda" and torch.cuda.is_available()
    return ring_cap(wanted if cuda and wanted is not None else torch.device("cpu"))


def _predicted(scene: Scene, mask: np.ndarray | None) -> np.ndarray | None:
    """The pixels predict gives a class: inside ``mask`` where the source had data (None: every pixel)."""
    nodata = scene.nodata_every()
    if nodata is None:
        return mask
    return ~nodata if mask is None else mask & ~nodata


def check_outputs(scene: Scene, out: Path | None, probabilities: Any = False,
                  inputs: RunInputs | None = None, class_names: list[str] | None = None) -> Path | None:
    """Check, before any work, that predict can write the class map ``out`` and the probabilities (a path, or
    True: beside ``out``) of ``scene``: known formats, writable folders, a CRS a GeoTIFF can be written with, a
    grid an ENVI header can hold, and none of the files the run reads (``inputs``; by default ``scene`` alone:
    the store itself and the files it was made from), and class names (``class_names``, else the scene's) the
    map's format can hold. Returns the probabilities path (None: none are written)."""
    from hsgds import writers

    if out is not None:
        writers.check_output(out)
        writers.check_class_names(out, class_names if class_names is not None else scene.class_names)
    prob_path = _probability_path(probabilities, out)
    if prob_path is not None:
        writers.check_probability_output(prob_path)
        writers.check_class_names(prob_path, class_names if class_names is not None else scene.class_names)
    for path in (out, prob_path):  # a CRS GDAL cannot read would fail the GeoTIFF only after the whole scene
        if path is not None and path.suffix.lower() in (".tif", ".tiff"):
            writers.geotiff_crs(scene.meta.georeference, path)
    if out is not None and out.suffix.lower() == ".hdr" and scene.meta.georeference is not None:
        writers.envi_map_info(scene.meta.georeference, out)  # (a sheared grid, which map info cannot hold)
    (inputs or RunInputs([scene])).refuse([*(writers.files_written(out) if out is not None else []),
                                           *([prob_path] if prob_path is not None else [])], scene)
    return prob_path


class RunInputs:
    """What a predict run reads, which none of its outputs may replace: every scene's store and the cube (and
    ground truth) it was converted from, and the model file. An -o naming one of them by mistake would destroy
    data a rerun cannot give back: in a collection, one scene's map may be named as another scene's source."""

    def __init__(self, scenes: Iterable[Scene], model: str | os.PathLike | None = None) -> None:
        self.model = None if model is None else Path(model)
        self._stores: dict[Path, _MadeFrom] = {}
        # the scenes by the (case-folded) names of the files they were made from: those a target is compared with
        # besides its own scene, so that a collection's check is not every output against every scene
        self._named: dict[str, list[_MadeFrom]] = {}
        for scene in scenes:  # (kept small: a collection's scenes are not all held open)
            made = _MadeFrom.of(scene)
            self._stores[made.store] = made
            for name in made.names():
                self._named.setdefault(name.casefold(), []).append(made)

    def refuse(self, targets: list[Path], scene: Scene | None = None) -> None:
        """InputError for the first of ``targets`` that is one of the run's inputs (``scene``'s own files are
        compared whatever the target's name: a hard link names a file otherwise)."""
        own = [] if scene is None else [_MadeFrom.of(scene)]
        for target in targets:
            resolved = target.resolve()
            if self.model is not None and (resolved == self.model.resolve() or _same_file(resolved, self.model)):
                raise InputError(f"cannot write {shown_path(target)}: it is the model file {self.model.name} this run "
                                 "reads; choose another output path")
            stores = {m.store: m for m in own}
            inside = next((self._stores.get(p) or stores[p] for p in (resolved, *resolved.parents)
                           if p in self._stores or p in stores), None)
            if inside is not None:
                raise InputError(f"cannot write {shown_path(target)}: it is inside the store {inside.path}; choose an "
                                 "output path outside it")
            if not resolved.is_file():
                continue
            named = self._named.get(resolved.name.casefold(), []) + self._named.get(target.name.casefold(), [])
            compared = {m.store: m for m in own + named}
            for made in compared.values():
                made.refuse(target, resolved)


@dataclass(frozen=True)
class _MadeFrom:
    """What a store was converted from, as its metadata records it: the source cube (with the bytes its pixels
    fill) and the ground truth."""

    path: Path  # the store, as given (for messages)
    store: Path  # resolved
    records: tuple[tuple[str, dict[str, Any], int | None], ...]

    @classmethod
    def of(cls, scene: Scene) -> _MadeFrom:
        h, w, b = scene.shape
        cube_bytes = h * w * b * np.dtype(scene.meta.dtype).itemsize
        records = (("source cube", scene.meta.source, cube_bytes), ("ground truth", scene.meta.labels_source, None))
        return cls(scene.path, scene.path.resolve(), tuple((what, r, n) for what, r, n in records if r))

    def names(self) -> list[str]:
        """The names of the files it was made from: as recorded (or, before they were, the one named), and the
        last parts of their recorded paths (resolved: a symlink given to the converter names its target)."""
        names: list[str] = []
        for _, record, _ in self.records:
            names += _recorded_names(record)
            names += [Path(p).name for p in record.get("paths") or [] if isinstance(p, str) and p]
        return names

    def refuse(self, target: Path, resolved: Path) -> None:
        """InputError when ``target`` (an existing file, ``resolved``) is its cube or ground truth."""
        for what, record, data_bytes in self.records:
            if _is_recorded_source(resolved, record, data_bytes, self.store.parent):
                raise InputError(f"cannot write {shown_path(target)}: it is the {what} {self.path.name} was converted "
                                 "from; writing there would destroy it: choose another output path")


def _same_file(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and os.path.samefile(a, b)


def _recorded_names(record: dict[str, Any]) -> list[str]:
    """The file names a source record lists: its files (or, written before they were, the one named)."""
    return [str(n) for n in (record.get("files") or [record.get("name")]) if n]


def _is_recorded_source(target: Path, record: dict[str, Any], data_bytes: int | None, base: Path) -> bool:
    """Whether ``target`` (resolved) is one of the files of a store's source ``record`` (its paths, names,
    total size, sha256).

    A file at one of the recorded ``paths`` (relative to ``base``, the store's folder) is, whatever it holds
    now: the content may have changed since the conversion (an ENVI header edited by hand). Otherwise (an older
    store, or a store moved without its sources) the files are found beside the target by name, compared by
    identity (a case-insensitive file system or a hard link names them otherwise); those no longer there (an
    EnMAP image's METADATA.XML deleted since) leave the others recognised. The cube is recognised by its size
    alone: the recorded total, or a file holding all its pixels (``data_bytes``; an ENVI header edited by hand
    since changes the total), which no class map reaches; the ground truth, which a uint8 class map can match
    in size, by its sha256."""
    paths = [base / p for p in record.get("paths") or [] if isinstance(p, str) and p]
    if any(target == p or _same_file(target, p) for p in paths):
        return True
    beside = [p for p in (target.parent / n for n in _recorded_names(record)) if p.is_file()]
    if not any(os.path.samefile(target, p) for p in beside):
        return False
    sizes = [p.stat().st_size for p in beside]
    if data_bytes is not None:
        return sum(sizes) == record.get("size") or max(sizes) >= data_bytes
    return sum(sizes) == record.get("size") and sha256_of(beside)[0] == record.get("sha256")


def _probability_path(probabilities: Any, out: Path | None) -> Path | None:
    if probabilities is None or isinstance(probabilities, (bool, np.bool_)) and not probabilities:
        return None
    if isinstance(probabilities, (bool, np.bool_)):  # (numpy's too, as for tta: a flag read from an array)
        if out is None:
            raise ConfigError("probabilities=True writes beside `out`; pass out=... or a path for the probabilities")
        # beside a GeoTIFF map, a GeoTIFF (a GIS opens both); beside any other, the .npy
        return out.with_name(out.stem + (".probabilities.tif" if out.suffix.lower() in (".tif", ".tiff") else
                                         ".probabilities.npy"))
    if not isinstance(probabilities, (str, os.PathLike)):
        raise ConfigError(f"probabilities must be True, False or a .npy or .tif path, got {shown(probabilities)}")
    path = Path(probabilities)
    if out is not None and path.resolve() == out.resolve():
        raise ConfigError(f"probabilities and the class map would both be written to {shown_path(path)}; name another "
                          "file")
    return path


_UNSET: Any = Unset("the model file's, else PatchLoader's default")  # an input setting not given
_INPUT_DEFAULTS: dict[str, Any] = {"layout": "NCHW", "normalize": "zscore", "bands": None, "wavelengths": None,
                                   "wavelength_tolerance": 5.0, "norm_stats": None}


def _model_file_input(loaded: LoadedModel, name: str, scene: Scene, given: dict[str, Any]) -> dict[str, Any]:
    """The input model file ``name`` was saved with; a setting passed too is refused (the same patch size
    excepted, or one the file leaves open), as is a scene whose bands the model cannot be fed."""
    patch_size = given.pop("patch_size")
    clashing = [k for k, v in given.items() if v is not _UNSET]
    if clashing:
        raise ConfigError(f"{name} carries the input it was trained with; drop {', '.join(k + '=' for k in clashing)}"
                          " (or pass its torch.nn.Module, hsgds.models.load_model(path).module, to feed another)")
    patch_size = loaded.fitted_patch_size(name, None if patch_size is _UNSET else patch_size, "patch_size=")
    loaded.check_scene(name, str(scene.path), scene.shape[2], scene.wavelengths, scene.bad_bands)
    return {"patch_size": patch_size, "layout": loaded.layout, "normalize": loaded.normalize,
            "bands": loaded.band_indices, "wavelengths": loaded.wavelengths,
            "wavelength_tolerance": loaded.wavelength_tolerance, "norm_stats": loaded.norm_stats}


def _placement(model: nn.Module, device: Any, dtype: Any, follow_model: bool) -> tuple[Any, torch.dtype]:
    """The loader's device and dtype: as given, else the module's: where its parameters and buffers all are
    (``follow_model``; a model file's module is moved to the loader's device instead) and their floating
    dtype when they share one (float32 otherwise). A given device the module is not on is refused."""
    tensors = [*model.parameters(), *model.buffers()]
    devices = {t.device for t in tensors}
    floats = {t.dtype for t in tensors if t.is_floating_point()}
    if dtype is None:
        dtype = floats.pop() if len(floats) == 1 and next(iter(floats)) in OUT_DTYPES else torch.float32
    where = devices.pop() if len(devices) == 1 else None
    if follow_model and where is not None and where.type in ("cpu", "cuda"):
        if device is None or (isinstance(device, str) and device == "auto"):  # (an array: no == here)
            device = str(where)
        else:
            try:
                wanted = torch.device(device)
            except (RuntimeError, TypeError, ValueError):  # (ValueError: an index past int64)
                raise ConfigError(f"device={shown(device)} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
            if wanted.type != where.type or (wanted.index is not None and wanted.index != (where.index or 0)):
                raise ConfigError(f"the model is on {where} but device={shown(str(device))}; move it there "
                                  f"(model.to({str(wanted)!r})) or leave device unset")
    return device, dtype


def _set_mode(model: nn.Module, training: bool) -> None:
    """model.train(training); a torch.export module refuses mode changes (its mode was fixed at export)."""
    try:
        model.train(training)
    except NotImplementedError:
        pass


def _logits(model: nn.Module, batch: torch.Tensor, layout: str, patch_size: int, classes: int | None,
            done: int) -> torch.Tensor:
    """The model's logits for ``batch``, checked: a failure or a wrong output is one line. ``classes``: the K of
    the batches before (None: the first), ``done``: the pixels predicted so far."""
    try:
        logits = model(batch)
    except Exception as exc:
        bands_in = batch.shape[1 if layout == "NCHW" else 3]
        hint = (f"check that it takes {bands_in} bands and {patch_size}x{patch_size} patches"
                if classes is None else f"after {done} pixels were predicted")
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):  # (the bands and patch size are not to blame)
            n = batch.shape[0]
            hint = f"it ran out of memory on {n} patches at once: pass a smaller batch_size (e.g. {max(1, n // 4)})"
        # a torch.export program's module() exported without a dynamic batch dimension: batch_size= alone would
        # fail on the last, partial batch, which only a program file gets padded
        fixed_at = re.search(r"size\(\)\[0\] == (\d+)", str(exc))
        if fixed_at:
            hint = (f"it takes batches of exactly {fixed_at[1]} patches (fixed at export): pass its .pt2 file "
                    "(torch.export.save) as the model, which pads the last batch, or export with dynamic_shapes")
        raise InputError(f"the model failed on a {tuple(batch.shape)} {batch.dtype} {layout} patch batch "
                         f"({one_line(exc, with_type=True)}); {hint}") from None
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[0] != batch.shape[0]:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise InputError(f"the model returned {got} for {batch.shape[0]} patches; it must return (N, K) logits")
    if logits.dtype == torch.bool or logits.is_complex():  # (argmax takes neither)
        raise InputError(f"the model returned {logits.dtype} logits; it must return real numbers")
    # every batch, not only the first: more classes later would overflow the map's dtype (class 300 written
    # as 44 in a uint8 map) or miss the probabilities file's shape
    if classes is not None and logits.shape[1] != classes:
        raise InputError(f"the model returned {tuple(logits.shape)} for {batch.shape[0]} patches after returning "
                         f"{classes} logits per pixel; it must return the same K for every batch")
    return logits


def _tta_probabilities(run: Callable[[torch.Tensor], torch.Tensor], patches: torch.Tensor, logits: torch.Tensor,
                       layout: str) -> torch.Tensor:
    """Mean softmax over the 8 dihedral variants of the batch (``logits``: the model's on variant 0; ``run``
    calls the model and checks its output, as for variant 0)."""
    mean = torch.softmax(_widened(logits), dim=1)
    for code in range(1, 8):
        # contiguous, as the loader's batches are: a quarter turn is a transposed view, which a model's
        # x.view(n, -1) refuses
        mean += torch.softmax(_widened(run(dihedral_batch(patches, code, layout).contiguous())), dim=1)
    return mean / 8


def _widened(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` in float32 for a softmax, or float64 when they are: in float32 those past its range (3.4e38)
    would be inf, their probabilities NaN."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


DEFAULT_BATCH = 1024


def _fixed_batch(name: str, fixed: int | None, batch_size: int | None,
                 bounds: tuple[int, int | None] | None = None) -> int:
    """The batch size to predict with: ``batch_size`` (default 1024), or the one a program was exported with
    (it takes no other; a partial last batch is padded to it); within the ``bounds`` a program's dynamic batch
    dimension was exported with (the default cut to its highest; a last batch under its lowest is padded)."""
    if fixed is None:
        if bounds is None:
            return DEFAULT_BATCH if batch_size is None else batch_size
        low, high = bounds
        if batch_size is None:
            return max(low, DEFAULT_BATCH if high is None else min(DEFAULT_BATCH, high))
        if batch_size < low or (high is not None and batch_size > high):
            span = f"{low} to {high}" if high is not None else f"at least {low}"
            raise ConfigError(f"{name} takes batches of {span} patches (bounded at export), not {batch_size}; pass a "
                              "batch size in that range, or drop it")
        return batch_size
    if batch_size not in (None, fixed):
        raise ConfigError(f"{name} takes batches of exactly {fixed} patches (exported without a dynamic batch "
                          f"size); drop the batch size, or export with dynamic_shapes=({{0: torch.export.Dim('n')}},)")
    return fixed


def _padded(patches: torch.Tensor, size: int | None) -> torch.Tensor:
    """``patches`` with its last patch repeated up to ``size`` rows (when fewer), for a program of a fixed batch
    size or one of a lowest batch size."""
    n = patches.shape[0]
    if size is None or n >= size:
        return patches
    return torch.cat([patches, patches[-1:].expand(size - n, *patches.shape[1:])])


def predict(store: Any, model: Any, *, patch_size: Any = _UNSET, batch_size: int | None = None, device: Any = None,
            dtype: Any = None, layout: Any = _UNSET, normalize: Any = _UNSET,
            mask: Any = None, probabilities: Any = False, out: str | os.PathLike | None = None,
            engine: str = "auto", reader: str = "auto", ring_bytes: int | None = None, tta: bool = False,
            bands: Any = _UNSET, wavelengths: Any = _UNSET, wavelength_tolerance: Any = _UNSET,
            norm_stats: Any = _UNSET, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Classify every pixel of a store with ``model``; return the (H, W) class map.

    Parameters
    ----------
    store : path or Scene
        One scene's store; for a collection, predict each of its scenes (``for scene in coll``), or run
        ``hsgds predict FOLDER -o 'maps/{name}.tif'``.
    model : torch.nn.Module, or a model file (path or :class:`~hsgds.models.LoadedModel`)
        A module takes a patch batch as :class:`~hsgds.PatchLoader` yields it ((N, B, p, p) for NCHW) and
        returns (N, K) logits. It is run in eval mode (its mode is restored afterwards) under
        ``torch.inference_mode()``, where its parameters are (``device`` must agree). A model file
        (``.pt2`` program or checkpoint, as ``hsgds predict --model`` takes) is fed the input it was saved
        with: its patch size, layout, normalization, band selection and statistics (passing any of them too
        is refused, except the same ``patch_size``), and runs on ``device`` (default: CUDA when usable) in
        ``dtype`` (default float32).
    device, dtype
        Where the patches are cut and in which floating dtype; by default where the module's parameters are
        and in their dtype (float32 when they are not all of one).
    patch_size, batch_size, layout, normalize, engine, reader, ring_bytes
        As for :class:`~hsgds.PatchLoader` (defaults: batch_size 1024, layout "NCHW", normalize "zscore"); use
        the settings the model was trained with. ``patch_size`` is required with a module. A program exported
        with a fixed batch size takes batches of exactly that size (the last one padded, the padding dropped);
        one whose dynamic batch dimension was bounded at export, batches in its range (likewise padded).
        Without ``ring_bytes``, the ring holds twice the tiles a batch spans, within the loader's cap
        (``HSGDS_RING_CPU_BYTES``, or ``HSGDS_RING_GPU_FRACTION`` of the free memory of a CUDA ``device``):
        where a sparse ``mask`` spreads a batch over more tiles than that, the model gets smaller batches.
    bands, wavelengths, wavelength_tolerance, norm_stats
        As for :class:`~hsgds.PatchLoader`: the bands the model takes (indices, or each wavelength's nearest
        band of this scene that its source does not flag bad) and the statistics to normalize with. By default the scene is normalized with
        its own train statistics, those of its current split; a model trained with ``norm_scope="collection"``,
        on another scene or before a ``resplit`` expects its training loader's: pass
        ``norm_stats=loader.norm_stats``, or save the model with them (``save_checkpoint(..., loader=loader)``)
        and pass the file.
    mask : (H, W) bool array or None
        Predict only where True; other pixels are 0 in the map (and in the probabilities; NaN, the declared
        nodata, in a probabilities GeoTIFF). Pixels where the
        source had no data (a format v3 store's nodata map) are never predicted either: 0 there too.
    probabilities : bool or path
        Also write the softmax of the logits as float16 (H, W, K) ``.npy``, or with a ``.tif`` path as a
        float32 GeoTIFF of K bands with the store's georeference: True puts it beside ``out``
        (``<out stem>.probabilities.tif`` beside a GeoTIFF map, else ``<out stem>.probabilities.npy``), a path
        puts it there.
    progress : callable or None
        Called after every batch with (pixels predicted so far, pixels to predict); ``hsgds predict`` draws
        its progress bar with it.
    out : path or None
        Write the map too, in the format of its suffix (``.tif``, ``.png``, ``.hdr``, ``.npy``; see
        :mod:`hsgds.writers`). Checked before any work; written atomically.
    tta : bool
        Test-time augmentation: the class is the argmax of the mean of the model's probabilities over
        the 8 flips / quarter turns of each patch (8 model calls per batch; one at patch size 1, whose
        variants are all the patch itself); the probabilities written are that mean.

    Each call maps the whole scene, also under ``torch.distributed`` (its rank and world size are not read):
    ranks share the work by predicting different scenes.

    Returns
    -------
    numpy.ndarray
        (H, W) uint8 (uint16 beyond 255 classes) in the stored-label convention: logit index k is
        written as class k + 1; 0 marks pixels not predicted (outside ``mask``, or without data).
    """
    from hsgds import writers
    from hsgds.loader import PatchLoader

    if isinstance(store, Collection):  # (a path's check would say only "got Collection")
        raise ConfigError(f"predict maps one scene, got a collection of {len(store)} scenes: predict each, "
                          f"e.g. for name, scene in zip(coll.names, coll): hsgds.predict(scene, model, "
                          f"out=f'maps/{{name}}.tif'), or run hsgds predict {shown_path(store.root)} --model MODEL "
                          f"-o 'maps/{{name}}.tif'")
    scene = store if isinstance(store, Scene) else open_scene(store)
    given = {"patch_size": patch_size, "layout": layout, "normalize": normalize, "bands": bands,
             "wavelengths": wavelengths, "wavelength_tolerance": wavelength_tolerance, "norm_stats": norm_stats}
    from_file = isinstance(model, (str, os.PathLike, LoadedModel))
    fixed = None  # the batch size of a program that takes no other (or no fewer): batches padded to it
    model_file = None  # the model's file (an input no output may replace)
    class_names = scene.class_names  # the map's legend: the model's own names when its file carries them
    if from_file:
        loaded = model if isinstance(model, LoadedModel) else load_model(model)
        name = "the model" if isinstance(model, LoadedModel) else str(model)
        settings = _model_file_input(loaded, name, scene, given)
        model, fixed, model_file = loaded.module, loaded.batch_size, loaded.path
        class_names = loaded.class_names or class_names
        batch_size = _fixed_batch(name, fixed, batch_size, loaded.batch_range)
        if fixed is None and loaded.batch_range is not None and loaded.batch_range[0] > 1:
            fixed = loaded.batch_range[0]  # (the last batch padded up to the lowest the program takes)
    elif isinstance(model, nn.Module):
        batch_size = DEFAULT_BATCH if batch_size is None else batch_size
        settings = {**_INPUT_DEFAULTS, **{k: v for k, v in given.items() if v is not _UNSET}}
        if "patch_size" not in settings:
            raise ConfigError("pass patch_size= (the patch side the model was trained on)")
    else:
        raise ConfigError(f"model must be a torch.nn.Module or a model file (.pt2 or checkpoint path), "
                          f"got {type(model).__name__}")
    patch_size, layout = settings["patch_size"], settings["layout"]
    batch_size, tta = as_count(batch_size, "batch_size"), as_flag(tta, "tta")
    if batch_size >= 1 << 63:  # pixel offsets are int64 (numpy raised OverflowError past it)
        raise ConfigError(f"batch_size must be below 2**63, got {shown(batch_size)}")
    if progress is not None and not callable(progress):  # (it is first called after the first batch)
        raise ConfigError(f"progress must be a function of (pixels predicted, pixels to predict) or None, got "
                          f"{type(progress).__name__} {shown(progress)}")
    # the 8 variants of a 1x1 patch are the patch itself: 7 more model calls would add nothing (!= rather
    # than >: the loader checks patch_size's type)
    tta = tta and patch_size != 1
    device, dtype = _placement(model, device, dtype, follow_model=not from_file)
    out = None if out is None else as_path(out, "out")
    prob_path = check_outputs(scene, out, probabilities, RunInputs([scene], model_file), class_names)
    h, w = scene.shape[:2]
    mask = check_mask(mask, scene, str(scene.path))
    if mask is not None:
        if not mask.any():
            raise ConfigError("mask selects no pixel; nothing to predict")
    keep = _predicted(scene, mask)
    if keep is not None and not keep.any():
        where = "inside the mask" if mask is not None else "in the scene"
        raise ConfigError(f"{scene.path}: every pixel {where} has no data (the source's nodata value); nothing "
                          "to predict")
    expected = h * w if keep is None else int(keep.sum())
    was_training = model.training
    _set_mode(model, False)
    probs = None
    # the model is called on the loader's batches: smaller than batch_size only when a sparse mask's ring would
    # outgrow the budget (a fixed-batch program gets them padded)
    cut = batch_size
    if ring_bytes is None:
        cut, ring_bytes = _batch_in_budget(scene, batch_size, keep, _ring_budget(device))
    try:
        # one rank, whatever torch.distributed says: the map is the whole scene's (ranks split the scenes)
        with PatchLoader(scene, batch_size=cut, split=None, pixels="all",
                         shuffle=False, return_coords=True, mask=mask, device=device, dtype=dtype,
                         engine=engine, reader=reader, **settings, ring_bytes=ring_bytes,
                         rank=0, world_size=1) as loader:
            dev = loader.device
            if from_file:  # a module loaded here (on the CPU, float32) runs where the loader cuts, in its dtype
                model.to(dev, resolve_out_dtype(dtype))
            classmap = torch.zeros((h, w), dtype=torch.int32, device=dev)
            classes = None
            done = 0
            nonfinite = torch.zeros((), dtype=torch.int64, device=dev)  # summed on the device: no sync per batch
            with torch.inference_mode():
                for patches, _, coords in loader:
                    n = patches.shape[0]
                    patches = _padded(patches, fixed)
                    logits = _logits(model, patches, layout, patch_size, classes, done)
                    if classes is None:
                        classes = int(logits.shape[1])
                        if not 1 <= classes <= 65535:
                            raise InputError(f"the model returns {classes} logits per pixel; 1..65535 are supported")
                        if prob_path is not None:
                            probs = writers.ProbabilityFile(prob_path, (h, w, classes),
                                                            georeference=scene.meta.georeference,
                                                            pixel_is_point=scene.meta.pixel_is_point,
                                                            class_names=class_names)
                    run = functools.partial(_logits, model, layout=layout, patch_size=patch_size, classes=classes,
                                            done=done)
                    scores = (_tta_probabilities(run, patches, logits, layout) if tta else logits)[:n]
                    logits = logits[:n]
                    # (with tta, a variant's NaN or inf reaches the mean of the probabilities)
                    nonfinite += (~(torch.isfinite(logits).all(1) & torch.isfinite(scores).all(1))).sum()
                    y, x = coords[:, 0], coords[:, 1]
                    classmap[y, x] = scores.argmax(1).to(torch.int32) + 1
                    if probs is not None:
                        p = (scores if tta else torch.softmax(_widened(logits), dim=1)).to(torch.float16).cpu().numpy()
                        probs.write(y.cpu().numpy(), x.cpu().numpy(), p)
                    done += n
                    if progress is not None:
                        progress(done, expected)
                    # drop this batch before the loader cuts the next: the engine then reuses its buffer
                    # (peak memory holds one batch, not two)
                    del patches, logits, scores
            if done != expected:  # the loader's contract; a mismatch would be a bug, never a silent hole
                raise RuntimeError(f"predicted {done} pixels, expected {expected}")
            if int(nonfinite):  # argmax of NaN logits is class 1: a map that looks valid
                raise InputError(f"the model returned NaN or infinite logits for {int(nonfinite)} of {done} pixels; "
                                 "nothing was written (check its weights, and that it was trained on this input)")
            result = classmap.cpu().numpy()  # the one device-to-host copy of the map
    except BaseException:
        if probs is not None:
            probs.abort()
        raise
    finally:
        _set_mode(model, was_training)
    k = max(classes or 1, scene.num_classes)
    result = result.astype(np.uint8 if k <= 255 else np.uint16)
    # the map first, the probabilities committed only once it is written: a map that cannot be written (a full
    # disk, its folder gone) leaves no new probabilities beside an old map
    if out is not None:
        try:
            writers.write_class_map(out, result, num_classes=k, class_names=class_names,
                                    georeference=scene.meta.georeference,
                                    pixel_is_point=scene.meta.pixel_is_point,
                                    ground_truth=scene.labels if scene.meta.num_samples else None,
                                    title=f"{scene.path.name}: predicted classes")
        except BaseException:
            if probs is not None:
                probs.abort()
            raise
    if probs is not None:
        probs.commit()
    return result
