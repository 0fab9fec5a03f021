"""The README's first Python example (section "Use"), run as written on the real Indian Pines scene.

The DDP example (train_ddp.py) has its own test in tests/test_distributed.py."""

from __future__ import annotations

import re
import runpy
import shutil
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def use_example() -> str:
    """The README's ```python block that opens ip.zarr and trains on it (the first one of section "Use")."""
    section = README.read_text(encoding="utf-8").split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks and 'hsgds.open_scene("ip.zarr")' in blocks[0], "the README's Use example moved"
    return blocks[0]


@pytest.mark.timeout(300)  # a training epoch, a torch.export and two whole-scene predictions on a shared CPU
def test_readme_use_example_runs_as_written(tmp_path, indian_pines_store, monkeypatch):
    """Every call of the example works with the arguments it shows (one epoch instead of ten, the only change),
    and what its comments promise holds: (N, 200, 13, 13) bfloat16 batches with int64 labels from 0, a model
    file `hsgds predict` feeds as trained, a lazy (y, x, band) DataArray whose wavelengths and bad-band flags
    appear only when the source records them (this .npy source records neither), and (H, W) maps of classes
    1..16."""
    xr = pytest.importorskip("xarray")
    pytest.importorskip("rasterio")  # out="map.tif": a GeoTIFF class map
    code = use_example()
    assert code.count("range(10)") == 1
    for name in ("ip.zarr", "new.zarr"):
        shutil.copytree(indian_pines_store, tmp_path / name)
    monkeypatch.chdir(tmp_path)  # the example's relative paths (its scene keeps reading from there)
    (tmp_path / "example.py").write_text(code.replace("range(10)", "range(1)"), encoding="utf-8")
    ns = runpy.run_path(str(tmp_path / "example.py"), run_name="__main__")

    import torch

    patches, labels = ns["patches"], ns["labels"]
    assert patches.dtype == torch.bfloat16 and tuple(patches.shape[1:]) == (200, 13, 13)
    assert labels.dtype == torch.int64 and labels.shape == (len(patches),)
    assert int(labels.min()) >= 0 and int(labels.max()) < 16
    assert (tmp_path / "model.pt2").is_file() and (tmp_path / "map.tif").is_file()

    cube = ns["cube"]
    assert isinstance(cube, xr.DataArray) and cube.dims == ("y", "x", "band") and cube.shape == (145, 145, 200)
    assert not {"wavelength", "bad", "x", "y", "spatial_ref"} & set(cube.coords)  # none recorded by the source
    assert np.array_equal(cube[70:75, 10:12].values, ns["scene"].read(70, 75, 10, 12))

    classes = ns["classes"]  # the second call: new.zarr through the saved program
    assert classes.shape == (145, 145) and classes.min() >= 1 and classes.max() <= 16
