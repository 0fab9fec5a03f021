"""hsgds: GPU-direct streaming of hyperspectral patches into PyTorch training.

Heavy modules (torch, zarr, kvikio, DALI) are imported lazily, so ``import hsgds`` is cheap and
works without a GPU.
"""

from __future__ import annotations

from typing import Any

from hsgds._version import __version__
from hsgds.collection import Collection, open_collection
from hsgds.errors import (
    ChecksumError,
    ConfigError,
    DependencyError,
    HsgdsError,
    InputError,
    StoreError,
    TileReadError,
)
from hsgds.scene import BandStats, Scene, open_scene

__all__ = [
    "Augment",
    "BandStats",
    "ChecksumError",
    "Collection",
    "ConfigError",
    "DependencyError",
    "HsgdsError",
    "InputError",
    "PatchLoader",
    "Scene",
    "StoreError",
    "TileReadError",
    "__version__",
    "normalization_constants",
    "open_collection",
    "open_scene",
    "predict",
]

#: submodules whose functions the documentation calls as hsgds.<module>.<function>; loaded on first use
_SUBMODULES = ("models", "io", "synthetic", "datasets", "writers")


def __getattr__(name: str) -> Any:
    if name == "PatchLoader":  # imports torch
        from hsgds.loader import PatchLoader

        return PatchLoader
    if name == "normalization_constants":  # imports torch
        from hsgds.loader import normalization_constants

        return normalization_constants
    if name == "Augment":  # imports torch
        from hsgds.augment import Augment

        return Augment
    if name == "predict":  # imports torch
        from hsgds.inference import predict

        return predict
    if name in _SUBMODULES:  # hsgds.models.save_checkpoint(...) after a plain `import hsgds`
        import importlib

        return importlib.import_module(f"hsgds.{name}")
    raise AttributeError(f"module 'hsgds' has no attribute {name!r}")
