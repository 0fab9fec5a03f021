"""Small standard hyperspectral classifiers for the demo and the benchmarks, and the files models are saved in
(checkpoints of these classes; torch.export programs of any model), with the settings they were trained with.

:class:`SpectralSpatialCNN` (the demo's model) reduces the spectrum per pixel with a learned 1x1
convolution, then mixes space with two 3x3 convolutions and pools: the shape of the 2-D CNNs that reach
~90% overall accuracy on Indian Pines with 10% training pixels, and cheap enough to train on a CPU.
:class:`Hamida3D` is a 3-D CNN in the style of Hamida et al. (2018, "3-D deep learning approach for remote
sensing image classification", IEEE TGRS 56(8)): 3-D convolutions over (band, y, x) whose spectral strides
replace pooling, then a linear classifier. It is sized so that a CPU trains it on Indian Pines in about a
minute; on a GPU it is small enough that a slow loader shows up in the step time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import stat
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hsgds._unset import Unset
from hsgds._wording import clipped
from hsgds.errors import ConfigError, InputError, as_count, as_fraction, as_path, control_character, one_line, shown
from hsgds.scene import BandStats

__all__ = ["CHECKPOINT_FORMAT", "MIN_BANDS", "MODELS", "Hamida3D", "LoadedModel", "SpectralSpatialCNN",
           "load_model", "make_model", "save_checkpoint", "save_program"]

#: fewest bands the spectral convolutions and strides leave at least one band for
MIN_BANDS = 37


class Hamida3D(nn.Module):
    """3-D CNN over a (N, B, p, p) patch batch (NCHW, bands as channels) -> (N, classes) logits.

    Parameters
    ----------
    bands : int
        Spectral bands B of the input.
    classes : int
        Number of output classes.
    patch_size : int
        Side p of the input patches (odd, >= 3).
    width : int
        Filters of the first block; later blocks use twice as many.
    """

    def __init__(self, bands: int, classes: int, patch_size: int, width: int = 8) -> None:
        super().__init__()
        # plain ints (numpy's too, which a checkpoint could not hold): torch's TypeError says nothing of which
        bands, classes = as_count(bands, "Hamida3D bands"), as_count(classes, "Hamida3D classes")
        patch_size, width = as_count(patch_size, "Hamida3D patch_size", minimum=3), as_count(width, "Hamida3D width")
        if bands < MIN_BANDS:
            raise ConfigError(f"the Hamida3D model needs at least {MIN_BANDS} bands (its spectral strides), "
                              f"but the store has {bands}")
        w1, w2 = width, 2 * width
        self.bands, self.classes, self.patch_size = bands, classes, patch_size
        self.config = {"bands": bands, "classes": classes, "patch_size": patch_size, "width": width}
        self.features = nn.Sequential(
            # spectral-spatial block; the spectral stride shrinks the band axis (the paper's pooling)
            nn.Conv3d(1, w1, (7, 3, 3), stride=(3, 1, 1), padding=(0, 1, 1)),
            nn.BatchNorm3d(w1),
            nn.ReLU(inplace=True),
            nn.Conv3d(w1, w1, (3, 1, 1), stride=(2, 1, 1)),  # spectral "pooling" by a strided convolution
            nn.ReLU(inplace=True),
            nn.Conv3d(w1, w2, (3, 3, 3), stride=(1, 1, 1)),  # spatial extent p -> p - 2
            nn.BatchNorm3d(w2),
            nn.ReLU(inplace=True),
            nn.Conv3d(w2, w2, (3, 1, 1), stride=(2, 1, 1)),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool3d((4, 3, 3)),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(w2 * 4 * 3 * 3, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.bands:
            raise ValueError(f"expected (N, {self.bands}, p, p) NCHW patches, got {tuple(x.shape)}")
        return self.classifier(self.features(x.unsqueeze(1)))


class SpectralSpatialCNN(nn.Module):
    """2-D CNN over a (N, B, p, p) patch batch -> (N, classes) logits.

    A 1x1 convolution reduces the B bands to ``reduce`` features per pixel (a learned, supervised
    counterpart of the PCA step of many hyperspectral pipelines), two 3x3 convolutions of ``width``
    filters mix the neighbourhood, and global average pooling makes the classifier independent of p.

    Parameters
    ----------
    bands, classes, patch_size : int
        Input bands B, output classes, patch side p (odd, >= 1).
    reduce, width : int
        Spectral features after the 1x1 convolution; filters of the spatial convolutions.
    dropout : float
        Dropout before the linear classifier.
    """

    def __init__(self, bands: int, classes: int, patch_size: int, reduce: int = 32, width: int = 64,
                 dropout: float = 0.2) -> None:
        super().__init__()
        # plain ints and a float (numpy's too, which a checkpoint could not hold): torch's TypeError for "30"
        # or 4.0 says nothing of which argument
        bands, classes = as_count(bands, "SpectralSpatialCNN bands"), as_count(classes, "SpectralSpatialCNN classes")
        patch_size = as_count(patch_size, "SpectralSpatialCNN patch_size")
        reduce, width = as_count(reduce, "SpectralSpatialCNN reduce"), as_count(width, "SpectralSpatialCNN width")
        dropout = as_fraction(dropout, "SpectralSpatialCNN dropout")
        self.bands, self.classes, self.patch_size = bands, classes, patch_size
        self.config = {"bands": bands, "classes": classes, "patch_size": patch_size, "reduce": reduce,
                       "width": width, "dropout": dropout}
        self.features = nn.Sequential(
            nn.Conv2d(bands, reduce, 1), nn.BatchNorm2d(reduce), nn.ReLU(inplace=True),
            nn.Conv2d(reduce, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.bands:
            raise ValueError(f"expected (N, {self.bands}, p, p) NCHW patches, got {tuple(x.shape)}")
        return self.classifier(self.features(x))


#: Model classes a checkpoint may name (a checkpoint never carries code: only a name from this table).
MODELS: dict[str, type[nn.Module]] = {"Hamida3D": Hamida3D, "SpectralSpatialCNN": SpectralSpatialCNN}


def make_model(bands: int, classes: int, patch_size: int, **kwargs: Any) -> nn.Module:
    """The benchmark model (:class:`Hamida3D`)."""
    return Hamida3D(bands, classes, patch_size, **kwargs)


# ------------------------------------------------------------------------- checkpoints and programs

CHECKPOINT_FORMAT = "hsgds-model"
#: 2 added the input recipe of a model trained on a band selection or shared statistics; 1 is still read
CHECKPOINT_VERSION = 2
#: every key a checkpoint holds; values are plain Python data and tensors (torch.load(weights_only=True))
_CHECKPOINT_KEYS = ("format", "version", "model", "kwargs", "state_dict", "patch_size", "normalize", "layout",
                    "bands", "classes", "class_names")
#: the input recipe: what a loader fed the model beyond its patch size (version 2 of a checkpoint, programs)
_RECIPE_KEYS = ("band_indices", "wavelengths", "wavelength_tolerance", "norm_stats")
_STATS_FIELDS = ("mean", "std", "min", "max")
#: a torch.export program saved by :func:`save_program` carries its recipe as this JSON file in the archive
PROGRAM_RECIPE = "hsgds.json"
PROGRAM_FORMAT = "hsgds-program"
_NORMALIZATIONS = ("zscore", "minmax", None)


def _recipe_state(in_bands: int | None, settings: dict[str, Any]) -> dict[str, Any]:
    """The recipe as plain data, checked against the model's ``in_bands`` (None: not fixed by the model)."""
    from hsgds.scene_set import check_tolerance, checked_stats

    bands, wavelengths, norm_stats = settings["bands"], settings["wavelengths"], settings["norm_stats"]
    wavelength_tolerance = settings["wavelength_tolerance"]

    if bands is not None and wavelengths is not None:
        raise ConfigError("pass bands= (indices) or wavelengths= (nm), not both")
    if bands is not None and not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 0
                                     for b in bands):
        raise ConfigError(f"bands must be band indices (integers >= 0), got {bands!r}")
    if wavelengths is not None and not all(isinstance(w, (int, float, np.number)) and not isinstance(w, bool)
                                           and np.isfinite(w) for w in wavelengths):
        raise ConfigError(f"wavelengths must be numbers (nm), got {wavelengths!r}")
    chosen = bands if bands is not None else wavelengths
    if chosen is not None and in_bands is not None and len(chosen) != in_bands:
        raise ConfigError(f"the model takes {in_bands} bands but {len(chosen)} "
                          f"{'band indices' if bands is not None else 'wavelengths'} were given; pass the "
                          "selection it was trained on")
    check_tolerance(wavelength_tolerance)  # the loader's rule: numpy numbers too, not a bool
    stats = None
    if norm_stats is not None:  # of the model's bands: fixed by it, by the selection, or else by the statistics
        n = in_bands if in_bands is not None else len(chosen) if chosen is not None else np.size(
            getattr(norm_stats, "mean", 0))
        stats = checked_stats(norm_stats, n)
    return {"band_indices": None if bands is None else [int(b) for b in bands],
            "wavelengths": None if wavelengths is None else [float(w) for w in wavelengths],
            "wavelength_tolerance": float(wavelength_tolerance),
            "norm_stats": None if stats is None else {f: getattr(stats, f).tolist() for f in _STATS_FIELDS}}


_UNSET: Any = Unset("the loader's with loader=, else the default")  # a setting not given
_SETTING_DEFAULTS: dict[str, Any] = {"normalize": "zscore", "bands": None, "wavelengths": None,
                                     "wavelength_tolerance": 5.0, "norm_stats": None}


def save_checkpoint(path: str | os.PathLike, model: nn.Module, *, loader: Any = None, patch_size: Any = _UNSET,
                    normalize: Any = _UNSET, class_names: Sequence[str] | None = None, bands: Any = _UNSET,
                    wavelengths: Any = _UNSET, wavelength_tolerance: Any = _UNSET,
                    norm_stats: Any = _UNSET) -> Path:
    """Save ``model`` (a class from :data:`MODELS` with a ``config`` dict) so that :func:`load_model` can
    rebuild it without unpickling code: class name, constructor arguments, weights, and the input it was
    trained on, which ``hsgds predict`` then feeds every scene.

    ``loader=`` (the :class:`~hsgds.PatchLoader` it was trained with) records that input whole: patch size,
    normalization, band selection and the statistics the loader normalized with (``loader.norm_stats``:
    its scene's train statistics, or the pooled ones of ``norm_scope="collection"``), so a later
    ``hsgds resplit`` of the store or another scene does not change what the model is fed; and the store's
    class names unless ``class_names`` is given. Without it, give the settings as for the loader
    (``patch_size`` is required; ``norm_stats=None`` means each scene's own current train statistics).
    Other models: :func:`save_program`. Written atomically."""
    from hsgds.writers import atomic_path

    path = _target(path)
    name = type(model).__name__
    if MODELS.get(name) is not type(model) or not isinstance(getattr(model, "config", None), dict):
        raise ConfigError(f"only the models in hsgds.models.MODELS can be saved as checkpoints, not {name}; "
                          "save other models with torch.export and hsgds.models.save_program")
    config: dict[str, Any] = model.config  # type: ignore[assignment]  # checked to be a dict above
    for key, value in config.items():
        _check_plain(key, value)
    settings = _settings(loader, class_names, patch_size=patch_size, normalize=normalize, bands=bands,
                         wavelengths=wavelengths, wavelength_tolerance=wavelength_tolerance, norm_stats=norm_stats)
    _check_loader_fits(settings, int(config["bands"]), int(config.get("patch_size", settings["patch_size"])),
                       "the model")
    _check_names_fit(settings["class_names"], int(config["classes"]), "the model")
    state = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model": name, "kwargs": dict(config),
             "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
             "patch_size": settings["patch_size"], "normalize": settings["normalize"], "layout": "NCHW",
             "bands": int(config["bands"]), "classes": int(config["classes"]),
             "class_names": settings["class_names"], **_recipe_state(int(config["bands"]), settings),
             "trained_on": settings.get("trained_on")}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(state, f)
    return Path(path)


def save_program(path: str | os.PathLike, program: Any, *, loader: Any = None, patch_size: Any = _UNSET,
                 normalize: Any = _UNSET, class_names: Sequence[str] | None = None, bands: Any = _UNSET,
                 wavelengths: Any = _UNSET, wavelength_tolerance: Any = _UNSET,
                 norm_stats: Any = _UNSET) -> Path:
    """Save a ``torch.export`` program of any model (taking one (N, B, p, p) NCHW batch) as a ``.pt2`` file
    that also carries the input it was trained on, given as for :func:`save_checkpoint` (``loader=``, or
    the settings), in a ``hsgds.json`` entry of the archive: ``hsgds predict`` then feeds every scene as in
    training (a ``.pt2`` without it is fed all bands, z-scored with each scene's own statistics). Written
    atomically."""
    from hsgds.writers import atomic_path

    path = _target(path)
    if not isinstance(program, torch.export.ExportedProgram):
        raise ConfigError(f"program must be a torch.export.ExportedProgram (torch.export.export(model, (batch,))), "
                          f"got {type(program).__name__}")
    if Path(path).suffix.lower() != ".pt2":
        raise ConfigError(f"a torch.export program is saved as .pt2; name the file {Path(path).stem}.pt2")
    settings = _settings(loader, class_names, patch_size=patch_size, normalize=normalize, bands=bands,
                         wavelengths=wavelengths, wavelength_tolerance=wavelength_tolerance, norm_stats=norm_stats)
    shape = _program_input(program)
    if shape is None:
        raise ConfigError("the program must take one (N, B, p, p) batch; export the model with one 4-D input")
    p = settings["patch_size"]
    _check_loader_fits(settings, shape[1], next((d for d in shape[2:] if d is not None), p), "the program")
    if any(d is not None and d != p for d in shape[2:]):
        raise ConfigError(f"the program takes {shape[2]}x{shape[3]} patches, not patch_size={p}")
    sides = _patch_range(program)
    if not _fits_range(p, sides):
        raise ConfigError(f"the program takes patches of {_sides(sides)} (its dynamic range at export), not "
                          f"patch_size={p}; pass the patch size it was trained on, or export it with a range that holds it")
    _check_names_fit(settings["class_names"], _program_classes(program), "the program")
    recipe = {"format": PROGRAM_FORMAT, "version": 1, "patch_size": p, "normalize": settings["normalize"],
              "layout": "NCHW", "class_names": settings["class_names"], **_recipe_state(shape[1], settings),
              "trained_on": settings.get("trained_on")}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: torch wants .pt2 names otherwise
        torch.export.save(program, f, extra_files={PROGRAM_RECIPE: json.dumps(recipe)})
    return Path(path)


def _target(path: Any) -> Path:
    """``path`` to save a model file at, checked before any work: its folder exists, and it is new or a regular
    file (the atomic rename would replace a folder's entry, a device or a FIFO with the file)."""
    target = as_path(path, "the file to save")
    folder = target.parent
    if not folder.is_dir():
        raise ConfigError(f"cannot save {target}: {folder} {'is not a folder' if folder.exists() else 'does not exist'}; "
                          "name a file in an existing folder")
    try:
        mode = os.stat(target).st_mode  # of what a symlink points at
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise ConfigError(f"cannot save {target}: {one_line(exc)}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"cannot save {target}: it is a folder; name a file in it")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"cannot save {target}: it exists and is not a regular file (a device, FIFO or socket), "
                          "which saving would replace; name another file")
    return target


def _check_plain(key: str, value: Any) -> None:
    """Refuse (ConfigError) a model argument that a checkpoint cannot hold: load_model reads checkpoints with
    torch.load(weights_only=True), which takes plain Python data only (not a function, a numpy scalar...)."""
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
    except Exception:  # pickle's errors for a lambda, a local class, a lock... are of several types
        why = "cannot be pickled"
    else:
        buffer.seek(0)
        try:
            torch.load(buffer, weights_only=True)
            return
        except Exception:
            why = "would not load with torch.load(weights_only=True)"
    raise ConfigError(f"the model's config[{key!r}] ({type(value).__name__} {value!r:.40}) {why}; build the model "
                      "with plain Python numbers, strings, lists and dicts")


def _settings(loader: Any, class_names: Sequence[str] | None, **given: Any) -> dict[str, Any]:
    """The input a model file records: the given settings (defaults for the rest), or the training loader's."""
    chosen = {k: v for k, v in given.items() if v is not _UNSET}
    if loader is None:
        if "patch_size" not in chosen:
            raise ConfigError("pass loader= (the PatchLoader the model was trained with) or patch_size= and the "
                              "other settings it was trained with")
        settings = {**_SETTING_DEFAULTS, **chosen}
    else:
        from hsgds.loader import PatchLoader

        if not isinstance(loader, PatchLoader):
            raise ConfigError(f"loader must be the hsgds.PatchLoader the model was trained with, "
                              f"got {type(loader).__name__}")
        if chosen:
            raise ConfigError(f"pass loader= or {', '.join(k + '=' for k in chosen)}, not both: the loader's "
                              "settings are what the model was trained on")
        if loader.layout != "NCHW":
            raise ConfigError(f"the loader yields {loader.layout} batches, and hsgds predict feeds models NCHW "
                              "(N, B, p, p) ones; train with layout='NCHW' (or permute inside the model)")
        settings = {"patch_size": loader.patch_size, "normalize": loader.normalize, "bands": loader.bands,
                    "wavelengths": loader.wavelengths, "wavelength_tolerance": loader.wavelength_tolerance,
                    "norm_stats": loader.norm_stats}
        settings["loader_bands"] = loader.out_bands
        settings["trained_on"] = _trained_on(loader)
        if class_names is None:
            class_names = next((s.class_names for s in loader.scenes.scenes if s.class_names), None)
    _check_settings(settings["patch_size"], settings["normalize"], settings["norm_stats"])
    settings["patch_size"] = int(settings["patch_size"])
    settings["class_names"] = _given_names(class_names)
    return settings


def _given_names(names: Any) -> list[str] | None:
    """``class_names=`` as saved: None, or a sequence of non-empty strings (a str would be split into letters)."""
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not isinstance(names, (Sequence, np.ndarray)):
        raise ConfigError(f"class_names must be a sequence of names (one per class), got {type(names).__name__} "
                          f"{names!r:.60}")
    if not all(isinstance(n, str) and n.strip() for n in names):
        raise ConfigError(f"class_names must be non-empty strings, got {list(names)!r:.80}")
    for k, name in enumerate(names, start=1):
        if (ch := control_character(name)) is not None:
            raise ConfigError(f"class_names: the name of class {k} ({shown(name)}) holds the control character {ch}; "
                              "give names without newlines, tabs or other control characters")
    return [str(n) for n in names]


def _check_names_fit(names: list[str] | None, classes: int | None, what: str) -> None:
    """One name per class the model returns (``classes``: None when not fixed), else a ConfigError."""
    if names is not None and classes is not None and len(names) != classes:
        raise ConfigError(f"{what} returns {classes} classes but {len(names)} class names were given (class_names=, "
                          "else the loader's scene's); pass one name per class")


def _check_loader_fits(settings: dict[str, Any], in_bands: int | None, side: int, what: str) -> None:
    """With ``loader=``: the model takes the loader's batches (its bands and patch size), else a one-line
    error; the loader may not be the one it was trained with."""
    yields = settings.get("loader_bands")
    if yields is None:
        return
    if in_bands is not None and in_bands != yields:
        raise ConfigError(f"{what} takes {in_bands} bands but the loader yields {yields}; pass the loader it was "
                          "trained with")
    if side != settings["patch_size"]:
        p = settings["patch_size"]
        raise ConfigError(f"{what} takes {side}x{side} patches but the loader yields {p}x{p}; pass the loader it "
                          "was trained with")


def _check_settings(patch_size: Any, normalize: Any, norm_stats: Any) -> None:
    if not isinstance(patch_size, int) or isinstance(patch_size, bool) or patch_size < 1 or patch_size % 2 == 0:
        raise ConfigError(f"patch_size must be a positive odd integer, got {shown(patch_size)}")
    if not _normalization_ok(normalize):
        raise ConfigError(f"normalize must be 'zscore', 'minmax' or None, got {shown(normalize)}")
    if normalize is None and norm_stats is not None:
        raise ConfigError("norm_stats applies with normalize='zscore' or 'minmax', not normalize=None")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for :func:`hsgds.predict`, with what is known about its input.

    ``bands`` and ``patch_size`` are None when a torch.export program leaves them dynamic. ``band_indices``
    / ``wavelengths`` (a band selection) and ``norm_stats`` (statistics shared by every scene) are the
    recipe a checkpoint or a :func:`save_program` file carries, passed to :func:`hsgds.predict` as its
    arguments of the same names."""

    module: nn.Module
    kind: str  # "checkpoint" or "export"
    bands: int | None
    patch_size: int | None
    classes: int | None
    normalize: str | None = "zscore"
    layout: str = "NCHW"
    class_names: list[str] | None = None
    band_indices: list[int] | None = None
    wavelengths: list[float] | None = None
    wavelength_tolerance: float = 5.0
    norm_stats: BandStats | None = None
    batch_size: int | None = None  # a program exported without a dynamic batch dimension takes exactly this many
    # the batch sizes (lowest, highest or None) a program of a dynamic batch dimension takes when it was
    # exported bounded (Dim("n", min=..., max=...)); None: any
    batch_range: tuple[int, int | None] | None = None
    #: the file it was loaded from (None: made otherwise): an input of predict, which its outputs never replace
    path: Path | None = None
    #: the loader's ``split`` and each labelled scene's :func:`hsgds.collection.split_record` it was trained
    #: on ({"split": ..., "scenes": [...]}), or None when not known (saved without loader=, or by an older hsgds)
    trained_on: dict[str, Any] | None = None

    def fitted_patch_size(self, name: str, given: int | None, option: str) -> int:
        """The patch size to feed the model ``name``: ``given`` or the one it fixes; a ConfigError that names
        ``option`` (``patch_size=``, ``--patch-size``) when neither fixes one or the two differ."""
        if given is None:
            if self.patch_size is None:
                raise ConfigError(f"{name} does not fix its patch size; pass {option}")
            return self.patch_size
        if not isinstance(given, int) or isinstance(given, bool) or given < 1 or given % 2 == 0:
            raise ConfigError(f"{option} must be a positive odd number (patches are pixel-centred), got {given!r}")
        if self.patch_size is not None and given != self.patch_size:
            p = self.patch_size
            raise ConfigError(f"{name} was made for {p}x{p} patches, not {given}x{given}; drop {option} or pass {p}")
        return given

    def check_scene(self, name: str, scene: str, bands: int, wavelengths: Sequence[float | None] | None,
                    bad: Sequence[int] | None = None) -> None:
        """Refuse (ConfigError) a scene of ``bands`` bands at ``wavelengths`` that model ``name`` cannot be fed:
        its band selection is not in the scene (a wavelength's only band near it flagged bad, in ``bad``,
        included), or it takes all bands of another band count."""
        from hsgds.scene_set import scene_bands

        if self.band_indices is not None or self.wavelengths is not None:
            try:
                cannot = ("the model was trained on that wavelength, so this scene cannot be predicted with it; "
                          "use a model trained on bands this scene has")
                scene_bands(scene, bands, wavelengths, self.band_indices, self.wavelengths, self.wavelength_tolerance,
                            far=cannot, bad=bad, bad_fix=cannot)
            except ConfigError as exc:
                raise ConfigError(f"{name} was trained on a band selection that scene {scene!r} cannot give: "
                                  f"{exc}") from None
        elif self.bands is not None and self.bands != bands:
            raise ConfigError(f"{name} takes {self.bands} bands but scene {scene!r} has {bands}; use a model "
                              "trained on this sensor")


def _bad(path: Path, why: str) -> InputError:
    return InputError(f"{path} is not a usable model: {why}; pass a torch.export program (.pt2, "
                      "hsgds.models.save_program) or a checkpoint saved by `hsgds demo` / hsgds.models.save_checkpoint")


def _input_shape(program: Any) -> tuple[Any, ...]:
    """The shape of the program's first input as traced: ints, and torch.SymInts where dynamic."""
    names = list(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op == "placeholder" and names and node.name == names[0]:
            return tuple(getattr(node.meta.get("val"), "shape", ()))
    return ()


def _program_input(program: Any) -> list[int | None] | None:
    """The (N, B, p, p) shape of the program's one input (None where dynamic); None when it is not that."""
    shape = [int(s) if isinstance(s, int) else None for s in _input_shape(program)]
    return shape if len(program.graph_signature.user_inputs) == 1 and len(shape) == 4 else None


def _patch_range(program: Any) -> tuple[int, int | None] | None:
    """The patch sides (lowest, highest or None for unbounded) a program with dynamic patch dimensions takes:
    the range torch.export recorded for their expressions (``program.range_constraints``, kept by
    torch.export.save); None when a dimension is static or its range is not recorded."""
    low, high = 1, None
    for side in _input_shape(program)[2:4]:
        expr = getattr(getattr(side, "node", None), "expr", None)
        bounds = program.range_constraints.get(expr) if expr is not None else None
        if bounds is None:
            return None
        # not torch's -int_oo / int_oo; and a lower bound of 2 is torch's own for every dynamic dimension (it
        # assumes sizes 0 and 1 away) and not always guarded: a program of Dim.AUTO sides runs 1x1 patches
        if getattr(bounds.lower, "is_Integer", False) and int(bounds.lower) > 2:
            low = max(low, int(bounds.lower))
        if getattr(bounds.upper, "is_Integer", False):
            high = int(bounds.upper) if high is None else min(high, int(bounds.upper))
    return low, high


def _batch_range(program: Any) -> tuple[int, int | None] | None:
    """The batch sizes (lowest, highest or None) a program of a dynamic batch dimension was exported for, when
    bounded; None when any (or the batch is static: ``batch_size``). Lower bounds of 2 are torch's own, as for
    :func:`_patch_range`."""
    shape = _input_shape(program)
    expr = getattr(getattr(shape[0], "node", None), "expr", None) if shape else None
    bounds = program.range_constraints.get(expr) if expr is not None else None
    if bounds is None:
        return None
    low = int(bounds.lower) if getattr(bounds.lower, "is_Integer", False) and int(bounds.lower) > 2 else 1
    high = int(bounds.upper) if getattr(bounds.upper, "is_Integer", False) else None
    return None if low == 1 and high is None else (low, high)


def _fits_range(p: int, sides: tuple[int, int | None] | None) -> bool:
    return sides is None or (sides[0] <= p and (sides[1] is None or p <= sides[1]))


def _program_classes(program: Any) -> int | None:
    """K of the program's one (N, K) output when fixed at export; None otherwise."""
    names = list(program.graph_signature.user_outputs)
    for node in program.graph.nodes:
        if node.op == "output" and len(names) == 1:
            for arg in node.args[0]:
                shape: Sequence[Any] = getattr(getattr(arg, "meta", {}).get("val"), "shape", ())
                if getattr(arg, "name", None) == names[0] and len(shape) == 2 and isinstance(shape[1], int):
                    return int(shape[1])
    return None


@contextlib.contextmanager
def _torch_export_log() -> Iterator[list[BaseException]]:
    """Keep torch.export's log (the "torch.export" logger and those below it) off stderr, and yield the
    exceptions it logged. On a damaged archive torch.export.load logs the real error as a warning with its
    traceback, then raises one that says "check the warnings above": the caller names the logged one instead.
    The logger's handlers, level and propagation are restored afterwards."""
    logged: list[BaseException] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info and record.exc_info[1] is not None:
                logged.append(record.exc_info[1])

    logger = logging.getLogger("torch.export")
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers, logger.propagate = [Keep()], False
    logger.setLevel(logging.WARNING)  # none of its info or debug lines either
    try:
        yield logged
    finally:
        logger.handlers, logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])


def _sides(sides: tuple[int, int | None] | None) -> str:
    low, high = sides or (1, None)
    return f"{low}x{low} to {high}x{high}" if high is not None else f"{low}x{low} or more"


def _load_export(path: Path) -> LoadedModel:
    extra = {PROGRAM_RECIPE: ""}
    with _torch_export_log() as logged:
        try:
            with open(path, "rb") as f:  # a file object: torch wants .pt2 names otherwise
                program = torch.export.load(f, extra_files=extra)
            module = program.module()
        except Exception as exc:  # a damaged or foreign archive: its exception types are not a contract
            cause = logged[0] if logged else exc  # what failed first, not "check the warnings above"
            raise _bad(path, f"torch.export.load failed ({type(cause).__name__}: {clipped(str(cause), 200)})") from None
    shape = _program_input(program)
    if shape is None:
        raise _bad(path, f"the program takes {len(program.graph_signature.user_inputs)} inputs, not one "
                         "(N, B, p, p) batch")
    batch, bands, p1, p2 = shape
    patch_size = p1 if p1 == p2 else None
    if not extra[PROGRAM_RECIPE]:  # a plain torch.export.save: all bands, each scene's own z-score
        return LoadedModel(module=module, kind="export", bands=bands, patch_size=patch_size, classes=None,
                           batch_size=batch, batch_range=_batch_range(program))
    try:
        recipe = json.loads(extra[PROGRAM_RECIPE])
    except ValueError as exc:
        raise _bad(path, f"its {PROGRAM_RECIPE} is not JSON ({exc})") from None
    if not isinstance(recipe, dict) or recipe.get("format") != PROGRAM_FORMAT or recipe.get("version") != 1:
        raise _bad(path, f"its {PROGRAM_RECIPE} is not an hsgds program recipe of version 1")
    missing = [k for k in ("patch_size", "normalize", "layout", "class_names", *_RECIPE_KEYS) if k not in recipe]
    if missing:
        raise _bad(path, f"its {PROGRAM_RECIPE} lacks {', '.join(missing)}")
    p, normalize, names = recipe["patch_size"], recipe["normalize"], recipe["class_names"]
    if not isinstance(p, int) or isinstance(p, bool) or p < 1 or p % 2 == 0 or patch_size not in (None, p):
        raise _bad(path, f"its recipe's patch size {p!r} is not the program's ({patch_size})")
    sides = _patch_range(program)
    if not _fits_range(p, sides):
        raise _bad(path, f"its recipe's patch size {p} is outside the program's {_sides(sides)}")
    if not _normalization_ok(normalize) or not _layout_ok(recipe["layout"]):
        raise _bad(path, f"its recipe's normalize {normalize!r:.40} / layout {recipe['layout']!r:.40} is not supported")
    chosen = recipe["band_indices"] if recipe["band_indices"] is not None else recipe["wavelengths"]
    if bands is None and isinstance(chosen, list):
        bands = len(chosen)
    return LoadedModel(module=module, kind="export", bands=bands, patch_size=p, classes=None, normalize=normalize,
                       class_names=_class_names(path, names, _program_classes(program)), batch_size=batch,
                       batch_range=_batch_range(program), **_recipe(path, recipe, bands),
                       trained_on=_checked_trained_on(path, recipe.get("trained_on")))


def _load_checkpoint(path: Path) -> LoadedModel:
    if not zipfile.is_zipfile(path):  # what torch.save and torch.export write are zip archives
        with open(path, "rb") as f:
            head = f.read(16)
        if head.startswith(b"PK"):
            raise _bad(path, "a truncated or damaged zip archive (save the model again)")
        raise _bad(path, f"not a zip archive as torch.save / torch.export write (it starts {head!r})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise _bad(path, f"not a torch.export program and torch.load(weights_only=True) failed "
                         f"({type(exc).__name__}: {clipped(str(exc), 160)})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise _bad(path, "not an hsgds checkpoint (no 'format': 'hsgds-model')")
    version = state.get("version")
    if version not in (1, CHECKPOINT_VERSION):
        raise _bad(path, f"checkpoint version {version!r}, this hsgds reads 1 to {CHECKPOINT_VERSION}")
    missing = [k for k in _CHECKPOINT_KEYS + (_RECIPE_KEYS if version >= 2 else ()) if k not in state]
    if missing:
        raise _bad(path, f"the checkpoint lacks {', '.join(missing)}")
    cls = MODELS.get(state["model"]) if isinstance(state["model"], str) else None
    if cls is None:
        raise _bad(path, f"unknown model class {str(state['model'])[:40]!r} (known: {', '.join(MODELS)})")
    kwargs, p = state["kwargs"], state["patch_size"]
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise _bad(path, "its model arguments are not a dict of names")
    if not isinstance(p, int) or isinstance(p, bool) or p < 1 or p % 2 == 0:
        raise _bad(path, f"patch size {p!r} is not a positive odd integer")
    bands, classes = _positive(state["bands"]), _positive(state["classes"])
    if bands is None or classes is None:
        raise _bad(path, f"its bands ({state['bands']!r:.40}) and classes ({state['classes']!r:.40}) are not both "
                         "positive integers")
    if not _normalization_ok(state["normalize"]) or not _layout_ok(state["layout"]):
        raise _bad(path, f"its normalize {state['normalize']!r:.40} / layout {state['layout']!r:.40} is not supported")
    try:
        module = cls(**kwargs)
        module.load_state_dict(state["state_dict"])
    except Exception as exc:
        raise _bad(path, f"its weights do not fit {state['model']}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]})") from None
    # what predict and info report comes from these fields, what the model does from its arguments: they must agree
    config = getattr(module, "config", {})
    if (config.get("bands"), config.get("classes")) != (bands, classes):
        raise _bad(path, f"it says {bands} bands and {classes} classes, but its {state['model']} takes "
                         f"{config.get('bands')!r:.20} bands and returns {config.get('classes')!r:.20} classes")
    return LoadedModel(module=module, kind="checkpoint", bands=bands, patch_size=p, classes=classes,
                       normalize=state["normalize"], layout=state["layout"],
                       class_names=_class_names(path, state["class_names"], classes), **_recipe(path, state, bands),
                       trained_on=_checked_trained_on(path, state.get("trained_on")))


def _trained_on(loader: Any) -> dict[str, Any]:
    """What a model trained with ``loader`` was trained on, for :attr:`LoadedModel.trained_on`: the loader's
    split and the split record of each of its labelled scenes (read from collection.json for a scene it never
    opened)."""
    from hsgds.collection import split_record

    records = [r for scene in loader.scenes.scenes if (r := split_record(scene)) is not None]
    return {"split": loader.split, "scenes": records}


def _checked_trained_on(path: Path, value: Any) -> dict[str, Any] | None:
    """A model file's ``trained_on`` record, checked (None: absent, as in files of an older hsgds)."""
    if value is None:
        return None
    scenes = value.get("scenes") if isinstance(value, dict) else None
    if (not isinstance(scenes, list) or not (value.get("split") is None or isinstance(value.get("split"), str))
            or not all(isinstance(r, dict) and isinstance(r.get("labels"), str) and isinstance(r.get("split"), str)
                       for r in scenes)):
        raise _bad(path, "its record of the splits it was trained on (trained_on) is damaged")
    return {"split": value["split"], "scenes": [{"labels": r["labels"], "split": r["split"]} for r in scenes]}


def _positive(value: Any) -> int | None:
    """``value`` if it is an integer >= 1 (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _normalization_ok(value: Any) -> bool:
    """Whether ``value`` is a normalization hsgds applies (the rule for settings, checkpoints and programs)."""
    return value is None or (isinstance(value, str) and value in _NORMALIZATIONS)


def _layout_ok(value: Any) -> bool:
    """Whether ``value`` is a layout a model file may record: hsgds predict feeds NCHW batches only."""
    return isinstance(value, str) and value == "NCHW"


def _class_names(path: Path, names: Any, classes: int | None) -> list[str] | None:
    """A model file's class names: None, or one non-empty name per class (``classes``: None when unknown)."""
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise _bad(path, f"its class names are not a list of non-empty strings ({names!r:.60})")
    for k, name in enumerate(names, start=1):
        if (ch := control_character(name)) is not None:
            raise _bad(path, f"the name of its class {k} holds the control character {ch}")
    if classes is not None and len(names) != classes:
        raise _bad(path, f"it has {len(names)} class names for the model's {classes} classes")
    return list(names)


def _recipe(path: Path, state: dict, bands: int | None) -> dict[str, Any]:
    """The band selection and shared statistics of a checkpoint (version 2; absent in 1) or a program's
    recipe, checked against the model's ``bands`` (None: not fixed by the model)."""
    out: dict[str, Any] = {}
    indices, nm = state.get("band_indices"), state.get("wavelengths")
    for key, value, kind in (("band_indices", indices, int), ("wavelengths", nm, float)):
        if value is None:
            continue
        if (not isinstance(value, list) or len(value) != bands
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise _bad(path, f"its {key} are not a list of {bands} numbers")
        out[key] = [kind(v) for v in value]
    if indices is not None and nm is not None:
        raise _bad(path, "it holds both band indices and wavelengths")
    tolerance = state.get("wavelength_tolerance", 5.0)
    if not isinstance(tolerance, (int, float)) or isinstance(tolerance, bool) or not tolerance >= 0:
        raise _bad(path, f"wavelength tolerance {tolerance!r} is not a number >= 0")
    out["wavelength_tolerance"] = float(tolerance)
    stats = state.get("norm_stats")
    if stats is not None and state.get("normalize") is None:
        raise _bad(path, "it has normalization statistics but normalize None")
    if stats is not None:
        from hsgds.scene_set import checked_stats

        if not isinstance(stats, dict) or sorted(stats) != sorted(_STATS_FIELDS):
            raise _bad(path, f"its normalization statistics are not {', '.join(_STATS_FIELDS)} lists")
        try:
            arrays = {f: np.asarray(stats[f], np.float64) for f in _STATS_FIELDS}
            out["norm_stats"] = checked_stats(BandStats(**arrays), bands if bands is not None else arrays["mean"].size)
        except (ConfigError, TypeError, ValueError) as exc:
            raise _bad(path, f"its normalization statistics do not fit ({' '.join(str(exc).split())[:160]})") from None
    return out


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Load a torch.export program (``.pt2``) or an hsgds checkpoint; any problem is a one-line InputError."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no model file {path}; pass a .pt2 program or a checkpoint saved by `hsgds demo`")
    loaded = _load_export(path) if path.suffix.lower() == ".pt2" or _is_export_archive(path) else _load_checkpoint(path)
    return dataclasses.replace(loaded, path=path)


def _is_export_archive(path: Path) -> bool:
    """Whether ``path`` is a torch.export archive whatever its name (``model.pt``, say): such archives hold
    an ``archive_format`` entry, which torch.save's checkpoints do not."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(name.rsplit("/", 1)[-1] == "archive_format" for name in z.namelist())
    except (zipfile.BadZipFile, OSError):
        return False
