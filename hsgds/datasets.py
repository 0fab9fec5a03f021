"""The real scene embedded for demos and tests: Indian Pines, as shipped in the tensorly 0.10.0 wheel.

Indian Pines (AVIRIS, 145x145, 200 water-absorption-corrected bands, 16 classes), CC BY 3.0,
Baumgardner, Biehl & Landgrebe (2015), doi:10.4231/R7RX991C.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hsgds.errors import DependencyError

INDIAN_PINES_CLASSES = (
    "Alfalfa", "Corn-notill", "Corn-mintill", "Corn", "Grass-pasture", "Grass-trees",
    "Grass-pasture-mowed", "Hay-windrowed", "Oats", "Soybean-notill", "Soybean-mintill",
    "Soybean-clean", "Wheat", "Woods", "Buildings-Grass-Trees-Drives", "Stone-Steel-Towers",
)


def indian_pines_files() -> tuple[Path, Path]:
    """Paths of (cube .npy, ground truth .npy) inside the installed tensorly package (not imported)."""
    spec = importlib.util.find_spec("tensorly")
    if spec is None or spec.origin is None:
        raise DependencyError("the Indian Pines scene comes with tensorly: pip install tensorly==0.10.0 "
                              "(or the hsgds[test] / hsgds[bench] extra)")
    data = Path(spec.origin).parent / "datasets" / "data"
    cube, gt = data / "Indian_pines_corrected.npy", data / "Indian_pines_gt.npy"
    if not (cube.is_file() and gt.is_file()):
        raise DependencyError(f"tensorly at {data.parent.parent} lacks Indian Pines; pip install tensorly==0.10.0")
    return cube, gt
