"""Human-readable summary of a store (``hsgds info``)."""

from __future__ import annotations

import os

import numpy as np

from hsgds import format as fmt
from hsgds.scene import open_scene


def split_class_counts(scene) -> dict[str, np.ndarray]:
    """Per split name, the count of labelled pixels of each class 1..K (index 0 unused)."""
    table = scene.sample_table()
    k = scene.num_classes
    return {name: np.bincount(table["label"][table["split"] == code].astype(np.int64), minlength=k + 1)
            for name, code in fmt.SPLIT_CODES.items()}


def describe(path: str | os.PathLike) -> str:
    scene = open_scene(path)
    m, g = scene.meta, scene.grid
    h, w, b = scene.shape
    lines = [
        f"store:      {scene.path}",
        f"scene:      {h}x{w}x{b} {scene.dtype}",
        f"tiles:      {g.nty}x{g.ntx} tiles, core {g.tile}x{g.tile}, halo {g.halo} (patches up to "
        f"{2 * g.halo + 1}x{2 * g.halo + 1}), {g.tile_nbytes} bytes each, padding {m.padding}",
        f"source:     {m.source.get('name')} ({m.source.get('size')} bytes, sha256 {str(m.source.get('sha256'))[:16]}...)",
    ]
    if scene.wavelengths:
        lines.append(f"bands:      {scene.wavelengths[0]:.1f}-{scene.wavelengths[-1]:.1f} nm")
    lines.append(f"split:      {', '.join(f'{k}={v}' for k, v in m.split.items())}; "
                 f"normalization stats from {m.stats_split} pixels")
    n_classes = int(np.count_nonzero(np.bincount(scene.sample_table()["label"].astype(np.int64))[1:]))
    lines.append(f"classes:    {n_classes} (labels 1..{scene.num_classes}), {m.num_samples} labelled pixels")
    if m.num_samples:
        counts = split_class_counts(scene)
        names = [s for s in ("train", "val", "test", "none") if counts[s].sum()]
        lines.append("")
        lines.append(f"{'class':>5}  {'name':<28}" + "".join(f"{s:>8}" for s in names) + f"{'total':>8}")
        for c in range(1, scene.num_classes + 1):
            total = sum(int(counts[s][c]) for s in fmt.SPLIT_CODES)
            if total == 0:
                continue
            name = scene.class_names[c - 1] if scene.class_names else ""
            lines.append(f"{c:>5}  {name:<28}" + "".join(f"{int(counts[s][c]):>8}" for s in names) + f"{total:>8}")
        lines.append(f"{'all':>5}  {'':<28}" + "".join(f"{int(counts[s].sum()):>8}" for s in names)
                     + f"{m.num_samples:>8}")
    return "\n".join(lines)
