"""Two real torch.distributed processes (gloo, CPU): disjoint shards, complete union, equal batch counts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

WORKER = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    import hsgds

    store, rank, init, out, drop_last = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    with hsgds.PatchLoader(store, patch_size=5, batch_size=32, split=None, device="cpu", return_coords=True,
                           drop_last=drop_last, seed=11) as loader:
        assert (loader.rank, loader.world_size) == (rank, 2)
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            n = len(loader)
            coords = [c.tolist() for _, _, c in loader]
            epochs.append({"len": n, "batches": len(coords), "coords": [p for b in coords for p in b]})
    dist.barrier()
    dist.destroy_process_group()
    json.dump(epochs, open(out, "w"))
""")


@pytest.mark.parametrize("drop_last", [False, True])
def test_two_ranks_gloo(tmp_path, indian_pines_store, drop_last):
    import hsgds

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, str(script), str(indian_pines_store), str(r), init,
                               str(tmp_path / f"r{r}.json"), "1" if drop_last else "0"],
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    ranks = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    scene = hsgds.open_scene(indian_pines_store)
    y, x, _ = scene.samples(None)
    everything = set(zip(y.tolist(), x.tolist()))
    tile = scene.grid.tile
    for epoch in range(2):
        a, b = ranks[0][epoch], ranks[1][epoch]
        assert a["batches"] == b["batches"] == a["len"] == b["len"]
        tiles_a = {(yy // tile, xx // tile) for yy, xx in a["coords"]}
        tiles_b = {(yy // tile, xx // tile) for yy, xx in b["coords"]}
        assert len(tiles_a & tiles_b) <= 1  # each rank reads its own tiles, but for one on the cut between them
        pixels_a, pixels_b = {tuple(c) for c in a["coords"]}, {tuple(c) for c in b["coords"]}
        assert not pixels_a & pixels_b  # (padding repeats a rank's own samples)
        union = pixels_a | pixels_b
        if drop_last:
            assert union <= everything
            assert len(a["coords"]) == len(b["coords"]) == a["batches"] * 32 == len(everything) // 2 // 32 * 32
        else:
            assert union == everything
            # equal shares: at most one sample repeated
            assert len(a["coords"]) == len(b["coords"]) == -(-len(everything) // 2)
    assert ranks[0][0]["coords"] != ranks[0][1]["coords"]


PREDICT_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    import hsgds

    rank, world, init, stores, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:-1], sys.argv[-1]

    class CentreCoordinates(nn.Module):  # logits whose argmax is the centre pixel's y * W + x (bands 0, 1)
        def __init__(self, w):
            super().__init__()
            self.w = w

        def forward(self, x):
            c = x.shape[-1] // 2
            idx = x[:, 0, c, c].round().long() * self.w + x[:, 1, c, c].round().long()
            return nn.functional.one_hot(idx, 4096).float()

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for i in range(rank, len(stores), world):  # the scenes split among the ranks, each predicted whole
        w = hsgds.open_scene(stores[i]).shape[1]
        np.save(f"{out}/map{i}.npy", hsgds.predict(stores[i], CentreCoordinates(w), patch_size=3, batch_size=64,
                                                   device="cpu", normalize=None))
    dist.barrier()
    dist.destroy_process_group()
""")


def test_predict_per_rank_maps_whole_scenes(tmp_path):
    """Ranks of a process group, each predicting its scenes of a collection, map every pixel of each scene: predict
    reads a scene as one rank, whatever torch.distributed's world size (its loader once took a rank's share)."""
    from hsgds.preprocess.convert import ConvertOptions
    from tests.conftest import convert_quietly

    stores, shapes = [], [(37, 29), (20, 45), (30, 30)]
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(shapes):
        cube = rng.integers(0, 1000, (h, w, 4)).astype(np.int16)
        cube[:, :, 0], cube[:, :, 1] = np.arange(h)[:, None], np.arange(w)[None, :]
        np.save(tmp_path / f"cube{i}.npy", cube)
        np.save(tmp_path / f"gt{i}.npy", rng.integers(0, 3, (h, w)).astype(np.uint8))
        stores.append(str(convert_quietly(tmp_path / f"cube{i}.npy", tmp_path / f"s{i}.zarr",
                                          ConvertOptions(labels=tmp_path / f"gt{i}.npy", tile=18))))
    script = tmp_path / "predict_worker.py"
    script.write_text(PREDICT_WORKER)
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", init, *stores, str(tmp_path)],
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    for i, (h, w) in enumerate(shapes):  # each pixel's own index: every one predicted, by its own patch
        assert np.array_equal(np.load(tmp_path / f"map{i}.npy"), np.arange(h * w).reshape(h, w) + 1)
