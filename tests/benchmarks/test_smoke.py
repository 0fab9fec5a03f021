"""Each benchmark runs at a tiny size, so none of them can rot. Nothing here is timed or asserts a speed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hsgds
from hsgds.bench import STALL_INPUT_BOUND, BenchReport, format_report

# benchmark subprocesses at tiny sizes: fast on an idle machine, minutes on a loaded one (never a hang)
pytestmark = pytest.mark.timeout(400)

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _run(args: list[str], tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HSGDS_DEVICE": "cpu", "HSGDS_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_bench_loader_tiny(tmp_path):
    pytest.importorskip("tensorly")
    out = tmp_path / "out"
    proc = _run([str(BENCH / "bench_loader.py"), "--scenes", "indian_pines", "--patch", "5", "--batch", "32",
                 "--batches", "2", "--dtypes", "bfloat16", "--cache", "warm,cold", "--workers", "1",
                 "--shm-workers", "1", "--e2e-steps", "1", "--e2e-patch", "3", "--e2e-batch", "16",
                 "--device", "cpu", "--out", str(out)], tmp_path)
    doc = json.loads(proc.stdout)  # the JSON document is all of stdout
    assert doc["machine"]["cores"] >= 1 and doc["ceilings"]["memcpy"]["GBps"] > 0
    rows = {(r["cache"], r["contender"]): r for r in doc["loader"]}
    for cache in ("warm", "cold"):
        for name in ("naive", "tuned", "shm_ring", "hsgds[torch,posix]"):
            row = rows[(cache, name)]
            assert row["status"] == "ok", row
            assert row["patches"] == 64 and row["patches_per_s"] > 0 and row["GBps"] > 0
            assert row["bytes_read_per_epoch"] > 0 and row["time_to_first_batch_s"] > 0
    assert "x_naive" in rows[("warm", "hsgds[torch,posix]")]
    e2e = doc["e2e"]
    assert e2e["compute_only"]["steps"] == 1
    assert {r["contender"] for r in e2e["rows"] if r["status"] == "ok"} >= {"naive", "tuned", "shm_ring"}
    assert any(t["target"].startswith("CPU loader bfloat16") for t in doc["targets"])
    table = (out / "table.md").read_text()
    assert "| naive |" in table and "End to end" in table and "Targets" in table
    assert json.loads((out / "results.json").read_text())["args"]["patch"] == 5
    if (out / "plot.png").exists():  # matplotlib is in the bench/test extras
        assert (out / "plot.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_loader_trains_the_demo_model_end_to_end(tmp_path):
    """--e2e-model SpectralSpatialCNN: the end-to-end rows train the demo's model (the GPU check's fast step)."""
    pytest.importorskip("tensorly")
    proc = _run([str(BENCH / "bench_loader.py"), "--scenes", "indian_pines", "--patch", "5", "--batch", "32",
                 "--batches", "2", "--dtypes", "float32", "--contenders", "hsgds", "--e2e-contenders", "hsgds",
                 "--e2e-model", "SpectralSpatialCNN", "--e2e-steps", "2", "--device", "cpu"], tmp_path)
    e2e = json.loads(proc.stdout)["e2e"]
    assert e2e["model"] == "SpectralSpatialCNN" and e2e["compute_only"]["steps"] == 2
    assert [r["status"] for r in e2e["rows"]] == ["ok"] and e2e["rows"][0]["steps"] == 2


def test_profile_batches_prints_a_profile_per_case(tmp_path):
    """benchmarks/profile_batches.py (run on the GPU machine) profiles each case; one that cannot run on this
    device (posix-pinned needs CUDA) says why and the others still run."""
    pytest.importorskip("tensorly")
    proc = _run([str(BENCH / "profile_batches.py"), "--device", "cpu", "--batches", "4", "--top", "5",
                 "--cases", "torch-posix,augment,verify-off"], tmp_path, timeout=360)
    heads = [ln for ln in proc.stdout.splitlines() if ln.startswith("===== ")]
    assert [h.split(":")[0] for h in heads] == ["===== torch-posix", "===== augment", "===== verify-off"]
    assert "failed: ConfigError" in heads[0] and "posix-pinned" in heads[0]
    for head in heads[1:]:
        assert "us/batch under cProfile (4 batches)" in head and "engine torch" in head
    assert proc.stdout.count("Ordered by: internal time") == 2


def test_contenders_cut_the_same_patches(tmp_path, monkeypatch):
    """The contenders' Dataset and the shared-memory ring cut what hsgds cuts (same normalization)."""
    import numpy as np
    import torch

    monkeypatch.syspath_prepend(str(BENCH))  # spawned ring workers import contenders from here too
    from contenders import PatchDataset, ShmRingLoader

    import hsgds
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    cube, gt = make_scene(30, 26, 8, classes=3, dtype="uint16", seed=3)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", gt)
    store = convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "g.npy", max_patch=5))
    scene = hsgds.open_scene(store)
    off, sc = hsgds.normalization_constants(scene, "zscore")
    padded = np.pad(cube, ((2, 2), (2, 2), (0, 0)), mode="reflect")
    with hsgds.PatchLoader(store, patch_size=5, batch_size=1000, split=None, device="cpu", shuffle=False,
                           return_coords=True) as loader:
        ref, _, coords = next(iter(loader))
    ys, xs = coords[:, 0].numpy(), coords[:, 1].numpy()
    labels = np.zeros(len(ys), np.int64)
    ds = PatchDataset(padded, ys, xs, labels, 5, off, sc, torch.float32)
    for i in (0, len(ys) // 2, len(ys) - 1):
        torch.testing.assert_close(ds[i][0], ref[i], rtol=1e-5, atol=1e-5)
    with ShmRingLoader(padded, ys[:40], xs[:40], np.arange(40), 5, off, sc, torch.float32, 16, workers=1) as ring:
        got = torch.cat([x for x, _ in ring])
        order = torch.cat([y for _, y in ring])  # a second epoch: same patches, another order
    assert sorted(order.tolist()) == list(range(40))
    assert got.shape == (40, 8, 5, 5)
    torch.testing.assert_close(torch.sort(got.flatten(1), dim=0)[0], torch.sort(ref[:40].flatten(1), dim=0)[0],
                               rtol=1e-5, atol=1e-5)


def test_bench_engines_tiny(tmp_path):
    proc = _run([str(BENCH / "bench_engines.py"), "--seconds", "0.05", "--warmup", "1", "--slots", "2", "--side", "32",
                 "--bands", "16", "--batch", "16", "--engines", "torch", "--devices", "cpu"], tmp_path)
    doc = json.loads(proc.stdout)
    assert {r["out_dtype"] for r in doc["results"]} == {"float32", "bfloat16"}


def test_hsgds_bench_cli(tmp_path, run_cli):
    import numpy as np

    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    cube, gt = make_scene(36, 30, 12, classes=3, dtype="int16", seed=4)  # few bands: any model must take them
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", gt)
    store = convert(tmp_path / "c.npy", tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "g.npy", max_patch=5,
                                                                               train=0.5))
    scene = hsgds.open_scene(store)
    table = scene.sample_table()
    train_tiles = len(np.unique(table["tile"][table["split"] == 1]))  # tiles holding train samples (code 1)
    assert train_tiles > 0
    code, out, err = run_cli("bench", store, "--patch-size", "5", "--batch-size", "32", "--steps", "1",
                             "--device", "cpu")
    assert code == 0, err
    assert f"s to read {train_tiles} tiles (" in out
    assert "t_compute:" in out and "end to end:" in out
    assert len([line for line in out.splitlines() if line.startswith("verdict:")]) == 1
    # without --patch-size: 13, or the largest the store serves (5 here)
    code, out, err = run_cli("bench", store, "--batch-size", "32", "--steps", "1",
                             "--device", "cpu", "--dtype", "bfloat16", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["patch_size"] == 5
    assert doc["dtype"] == "bfloat16" and doc["compute_step_s"] > 0 and doc["steps"] == 1
    assert doc["tiles"] == train_tiles and doc["tile_bytes"] == scene.grid.tile_nbytes and doc["t_io_s"] > 0
    assert doc["io_GBps"] == pytest.approx(train_tiles * scene.grid.tile_nbytes / doc["t_io_s"] / 1e9)
    assert 0 <= doc["e2e_stall_fraction"] <= 1
    # the derived fields follow from the measured ones
    assert doc["best_speedup_from_input"] == pytest.approx(max(1.0, doc["e2e_step_s"] / doc["compute_step_s"]))
    assert doc["input_bound"] is (doc["loader_batch_s"] > doc["compute_step_s"]
                                  or doc["e2e_stall_fraction"] > STALL_INPUT_BOUND)


def test_hsgds_bench_on_an_unlabelled_store_times_every_pixel(tmp_path, run_cli):
    """An unlabelled store (pretraining) failed with "no train pixels (split='train', pixels='labelled')" and the
    command had no way to time every pixel. Without --pixels the error names it; with --pixels all every tile
    (each holds pixels) is read and the demo model trains on the unlabelled pixels (label -1) as class 0, where
    cross-entropy refused -1 before."""
    import numpy as np
    import zarr

    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    cube, _ = make_scene(36, 30, 8, classes=3, dtype="int16", seed=6)
    np.save(tmp_path / "c.npy", cube)
    store = convert(tmp_path / "c.npy", tmp_path / "u.zarr", ConvertOptions(max_patch=5, tile=12))
    assert zarr.open_array(store / "samples" / "tile", mode="r").shape == (0,)  # no labelled sample
    tiles = hsgds.open_scene(store).tile_paths
    assert len(tiles) > 1 and all(p.is_file() for p in tiles)
    code, out, err = run_cli("bench", store, "--patch-size", "5", "--batch-size", "32", "--steps", "1",
                             "--device", "cpu")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "no labelled pixels to time" in err and "--pixels all" in err
    code, out, err = run_cli("bench", store, "--pixels", "all", "--patch-size", "5", "--batch-size", "32",
                             "--steps", "1", "--device", "cpu", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["pixels"] == "all" and doc["tiles"] == len(tiles) and doc["steps"] == 1
    assert doc["io_GBps"] == pytest.approx(sum(p.stat().st_size for p in tiles) / doc["t_io_s"] / 1e9)
    assert doc["loader_patches_per_s"] > 0 and doc["compute_step_s"] > 0 and doc["e2e_step_s"] > 0
    code, out, err = run_cli("bench", store, "--pixels", "all", "--patch-size", "5", "--batch-size", "32",
                             "--steps", "1", "--device", "cpu")
    assert code == 0 and "every pixel, unlabelled ones trained as class 0" in out, err


def test_hsgds_bench_over_several_stores_reports_them_and_their_bytes(tmp_path, run_cli):
    """Over stores whose tiles differ in size (16 and 32 pixels a side here; convert-many picks each scene's
    tile from its shape), `hsgds bench` read every tile into a whole ring slot and failed: "tile 0 (...) has
    4096 bytes, expected 4096: the store is damaged". It also reported its first scene as the store and counted
    every tile at the first scene's size. Each tile is read into its own view of the slot now, and the report
    names what was measured, its bytes checked against the tile files and the train samples zarr-python reads."""
    import numpy as np
    import zarr

    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    stores = []
    for name, tile, seed in (("a", 12, 4), ("b", 28, 5)):
        cube, gt = make_scene(36, 30, 8, classes=3, dtype="int16", seed=seed)
        np.save(tmp_path / f"{name}.npy", cube)
        np.save(tmp_path / f"{name}_gt.npy", gt)
        stores.append(convert(tmp_path / f"{name}.npy", tmp_path / f"{name}.zarr",
                              ConvertOptions(labels=tmp_path / f"{name}_gt.npy", max_patch=5, tile=tile, train=0.5)))
    expected_bytes = expected_tiles = 0
    for store in stores:
        tiles = zarr.open_array(store / "samples" / "tile", mode="r")[:]
        split = zarr.open_array(store / "samples" / "split", mode="r")[:]
        read = np.unique(tiles[split == 1])  # tiles holding train samples (code 1)
        paths = hsgds.open_scene(store).tile_paths
        expected_tiles += len(read)
        expected_bytes += sum(paths[t].stat().st_size for t in read)
    sizes = {hsgds.open_scene(s).grid.tile_nbytes for s in stores}
    assert len(sizes) == 2  # tiles of two sizes
    report = hsgds.bench.bench_store(stores, patch_size=5, batch_size=32, steps=1, device="cpu")
    assert report.store == "2 scenes" and report.tiles == expected_tiles
    assert report.io_GBps == pytest.approx(expected_bytes / report.t_io_s / 1e9)
    assert "store:        2 scenes" in format_report(report)
    # the command over a collection of the two: it ran, and names the collection
    from hsgds.collection import SceneEntry, write_collection

    write_collection(tmp_path, [SceneEntry.of_scene(s.stem, hsgds.open_scene(s)) for s in stores])
    code, out, err = run_cli("bench", tmp_path, "--patch-size", "5", "--batch-size", "32", "--steps", "1",
                             "--device", "cpu")
    assert code == 0 and f"store:        {tmp_path}\n" in out and f"to read {expected_tiles} tiles" in out, err


def test_hsgds_bench_over_scenes_of_two_sensors_selects_bands_by_wavelength(tmp_path, run_cli):
    """A collection of two sensors (8 and 6 bands) could not be benched: the loader asked for wavelengths=[...],
    which the command had no option for. --wavelengths selects each scene's nearest band, the demo model takes
    that many, and every tile holding train samples (zarr-python's sample table) is read."""
    import numpy as np
    import zarr

    from hsgds.collection import SceneEntry, write_collection
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    stores = []
    for name, bands, first, seed in (("a", 8, 400.0, 4), ("b", 6, 405.0, 5)):
        cube, gt = make_scene(30, 28, bands, classes=3, dtype="int16", seed=seed)
        np.save(tmp_path / f"{name}.npy", cube)
        np.save(tmp_path / f"{name}_gt.npy", gt)
        nm = tuple(first + 50.0 * k for k in range(bands))
        stores.append(convert(tmp_path / f"{name}.npy", tmp_path / f"{name}.zarr",
                              ConvertOptions(labels=tmp_path / f"{name}_gt.npy", max_patch=5, train=0.5,
                                             wavelengths=nm)))
    write_collection(tmp_path, [SceneEntry.of_scene(s.stem, hsgds.open_scene(s)) for s in stores])
    expected_tiles = 0
    for store in stores:
        tiles = zarr.open_array(store / "samples" / "tile", mode="r")[:]
        split = zarr.open_array(store / "samples" / "split", mode="r")[:]
        expected_tiles += len(np.unique(tiles[split == 1]))
    args = ("bench", tmp_path, "--patch-size", "5", "--batch-size", "32", "--steps", "1", "--device", "cpu")
    code, out, err = run_cli(*args)
    assert code == 2 and "scenes have different band counts (a: 8, b: 6)" in err, err
    code, out, err = run_cli(*args, "--wavelengths", "450, 552,650", "--wavelength-tolerance", "6")
    assert code == 0 and f"to read {expected_tiles} tiles" in out, err
    code, out, err = run_cli(*args, "--wavelengths", "450,552,650", "--wavelength-tolerance", "3")
    assert code == 2 and "scene 'b' has no band within 3 nm of 450 nm (nearest: 455 nm)" in err, err
    code, out, err = run_cli(*args, "--wavelengths", "450,x")
    assert code == 2 and "'450,x': give 2 comma-separated numbers (band centres in nm)" in err


def test_hsgds_bench_errors_name_the_command_line_options(tmp_path, run_cli):
    """The loader's errors about a parameter that an option of `hsgds bench` sets name the option, as typed
    (--wavelengths, --wavelength-tolerance 5, --batch-size), not the Python parameter (wavelengths=[...],
    wavelength_tolerance=5, batch_size); the rest of the message stays the loader's."""
    import numpy as np

    from hsgds.collection import SceneEntry, write_collection
    from hsgds.preprocess.convert import ConvertOptions, convert
    from hsgds.synthetic import make_scene

    stores = []
    for name, bands, first, seed in (("a", 8, 400.0, 4), ("b", 6, 405.0, 5)):
        cube, gt = make_scene(30, 28, bands, classes=3, dtype="int16", seed=seed)
        np.save(tmp_path / f"{name}.npy", cube)
        np.save(tmp_path / f"{name}_gt.npy", gt)
        stores.append(convert(tmp_path / f"{name}.npy", tmp_path / f"{name}.zarr",
                              ConvertOptions(labels=tmp_path / f"{name}_gt.npy", max_patch=5, train=0.5,
                                             wavelengths=tuple(first + 50.0 * k for k in range(bands)))))
    write_collection(tmp_path, [SceneEntry.of_scene(s.stem, hsgds.open_scene(s)) for s in stores])
    args = ("bench", tmp_path, "--patch-size", "5", "--steps", "1", "--device", "cpu")
    for given, message in (
            ((), "scenes have different band counts (a: 8, b: 6); pass --wavelengths ... (nm) to take each scene's "
                 "band nearest each wavelength"),
            (("--wavelengths", "450,552,650", "--wavelength-tolerance", "3"),
             "scene 'b' has no band within 3 nm of 450 nm (nearest: 455 nm); raise --wavelength-tolerance or drop "
             "that wavelength (1 of 2 scenes lack a band within 3 nm of one; --wavelength-tolerance 5 gives each "
             "scene a band near every one)"),
            (("--wavelengths", "450", "--wavelength-tolerance", "-1"),
             "--wavelength-tolerance must be a number >= 0 (nm), got -1.0"),
            (("--wavelengths", "450", "--batch-size", "0"), "--batch-size must be an integer >= 1, got 0"),
            (("--wavelengths", "450", "--steps", "0"), "steps must be >= 1, got 0")):  # (warmup is no option)
        code, _, err = run_cli(*args, *given)
        assert code == 2 and err == f"hsgds: error: {message}\n", err


def _report(**times):
    fields = dict(store="s", device="cpu", reader="posix", engine="torch", patch_size=5, batch_size=32,
                  dtype="float32", tiles=4, tile_bytes=1000, t_io_s=0.1, io_GBps=4e-5, loader_batch_s=0.01,
                  loader_patches_per_s=3200.0, compute_step_s=0.02, e2e_step_s=0.03, e2e_stall_fraction=0.0,
                  steps=3)
    return BenchReport(**{**fields, **times})


def test_bench_verdict():
    """The verdict and its bounds from the times, on hand-made reports (no timing involved)."""
    slow_loader = _report(loader_batch_s=0.05, compute_step_s=0.02, e2e_step_s=0.06)
    assert slow_loader.input_bound and slow_loader.best_speedup_from_input == pytest.approx(3.0)
    assert "INPUT-BOUND" in format_report(slow_loader) and "at most 3.00x" in format_report(slow_loader)
    stalled = _report(loader_batch_s=0.01, compute_step_s=0.02, e2e_step_s=0.025, e2e_stall_fraction=0.2)
    assert stalled.input_bound and "INPUT-BOUND" in format_report(stalled)
    fast_loader = _report(loader_batch_s=0.01, compute_step_s=0.04, e2e_step_s=0.05, e2e_stall_fraction=0.01)
    text = format_report(fast_loader)
    assert not fast_loader.input_bound and "compute-bound" in text and "INPUT-BOUND" not in text
    assert "at most 1.25x" in text and "up to 5.0x" in text
    # noise can make the loop faster than the model alone: a speedup bound below 1 is reported as 1
    assert _report(e2e_step_s=0.015, compute_step_s=0.02).best_speedup_from_input == 1.0


def test_hsgds_demo_cli(tmp_path, run_cli, hsgds_env, monkeypatch):
    pytest.importorskip("tensorly")
    hsgds_env("HSGDS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # the default output folder, hsgds-demo/, goes there and not into the checkout
    code, out, err = run_cli("demo", "--epochs", "1", "--patch-size", "3", "--batch-size", "256", "--device", "cpu")
    assert code == 0, err
    assert "verify:     all tiles intact" in out
    assert "OA " in out and "AA " in out and "kappa " in out and "loader:" in out
    assert (tmp_path / "cache" / "indian_pines.zarr" / "zarr.json").is_file()
    assert {f.name for f in (tmp_path / "hsgds-demo").iterdir()} == {"report.json", "model.ckpt", "classmap.png"}


def test_bench_epoch_tiny(tmp_path):
    pytest.importorskip("tensorly")
    proc = _run([str(BENCH / "bench_epoch.py"), "--epochs", "1"], tmp_path)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 4 and all("patches/s" in line or "skipped" in line for line in lines), proc.stdout
    assert "1027 patches per epoch" in lines[0]


def test_bench_convert_many_tiny(tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "out"
    proc = _run([str(BENCH / "bench_convert_many.py"), "--scenes", "2", "--shape", "20,16,8", "--workers", "1",
                 "--repeats", "1", "--tmp", str(tmp_path), "--out", str(out)], tmp_path, timeout=110)
    doc = json.loads(proc.stdout)
    assert [r["workers"] for r in doc["results"]] == [1]
    assert all(r["scenes_per_s"] > 0 and r["tiles"] == 2 for r in doc["results"])
    assert json.loads((out / "results.json").read_text()) == doc and (out / "table.md").is_file()


def test_bench_predict_tiny(tmp_path):
    proc = _run([str(BENCH / "bench_predict.py"), "--scenes", "synthetic", "--synthetic", "40x32x16", "--repeats", "1",
                 "--window-rows", "8", "--batch", "256", "--patch", "3", "--threads", "1", "--work", str(tmp_path / "w")],
                tmp_path, timeout=300)
    doc = json.loads(proc.stdout)
    scene = doc["scenes"][0]
    assert scene["shape"] == [40, 32, 16]
    assert {r["status"] for rs in scene["runs"].values() for r in rs} == {"ok"}
    assert scene["runs"]["predict"][0]["pixels"] == 40 * 32 and scene["sliding_window"]["pixels"] == 8 * 32
    assert scene["predict_vs_loader"] > 0 and scene["predict_vs_sliding_window"] > 0
    assert scene["memory"]["predict_peak_rss_mb"] > scene["memory"]["baseline_rss_mb"] > 0


def test_bench_collection_tiny(tmp_path):
    proc = _run([str(BENCH / "bench_collection.py"), "--scenes", "4", "--cols", "2", "--stride", "16", "--repeats", "1",
                 "--ring-mib", "20", "--stream-repeats", "1", "--listings", "25,1200", "--memory-scenes", "20",
                 "--work", str(tmp_path / "work")], tmp_path, timeout=600)
    doc = json.loads(proc.stdout)
    labelled = doc["startup"]["labelled"]["rows"]
    assert [r["scenes"] for r in labelled] == [25, 1200]
    assert all(r["collection s"] > 0 for r in labelled)
    assert [r["list of stores s"] is None for r in labelled] == [False, True]
    memory = doc["memory"]["rows"]
    assert [(r["scenes"], r["pixels"]) for r in memory] == [(20, "all"), (20, "labelled")]
    for r in memory:  # every scene visited each epoch; stores open bounded by max_open_scenes
        assert r["batches_epoch1"] == r["batches_epoch2"] > 0 and 0 < r["scenes_open"] <= r["max_open_scenes"]
        assert r["scenes_cached"] == 20 and 0 < r["cache_mib"] <= r["sample_cache_mib"]
    best = doc["throughput"]["best"]
    assert best["collection"]["patches"] == best["single"]["patches"] == 4 * 8 * 8
    assert best["collection"]["bytes_read"] == best["single"]["bytes_read"] > 0
    stream = doc["streaming"]
    assert stream["collection_over_ring"] > 1 and stream["slots"] == 2
    assert stream["loader_cold"]["bytes_read_per_epoch"] == stream["collection_bytes"]
    assert stream["raw_warm"]["bytes"] == stream["collection_bytes"] and stream["peak_rss_mib"] > stream["baseline_rss_mib"]


def test_bench_verify_tiny(tmp_path):
    """benchmarks/bench_verify.py runs end to end (it runs unattended in the GPU check) and reports both
    loaders side by side over the same epochs; --tiny alone picks batch sizes its ring holds (its default
    batches, 256 and 4096, stopped it: a batch of 4096 needs more tiles resident than its ring of 8)."""
    proc = _run([str(BENCH / "bench_verify.py"), "--tiny", "--epochs", "2"], tmp_path, timeout=240)
    doc = json.loads(proc.stdout)
    assert doc["reader"] == "posix" and doc["store"]["tiles"] == 16 and doc["store"]["ring_tiles"] == 8
    rows = {(r["batch"], r["verify"]): r for r in doc["rows"]}
    assert set(rows) == {(64, True), (64, False), (256, True), (256, False)}
    for row in rows.values():
        # more tiles read per epoch than the ring holds: the checks run every epoch
        assert row["patches_per_epoch"] == 96 * 96 and row["tiles_read_last_epoch"] > 8
        assert len(row["patches_per_s"]) == 2 and row["median_patches_per_s"] > 0
    for batch in ("64", "256"):
        ratio = doc["ratio_checked_vs_unchecked"][batch]
        on, off = rows[(int(batch), True)]["median_patches_per_s"], rows[(int(batch), False)]["median_patches_per_s"]
        assert abs(ratio - on / off) < 1e-3
        assert doc["meets_target"][batch] == (ratio >= doc["target"])
        # the ratio within each round, from the same epochs
        pairs = [c / u for c, u in zip(rows[(int(batch), True)]["patches_per_s"], rows[(int(batch), False)]["patches_per_s"])]
        spread = doc["ratio_per_round"][batch]
        assert spread["min"] <= spread["median"] <= spread["max"]
        assert abs(spread["min"] - min(pairs)) < 2e-3 and abs(spread["max"] - max(pairs)) < 2e-3


def test_bench_plan_tiny(tmp_path):
    out = tmp_path / "plan.json"
    _run([str(BENCH / "bench_plan.py"), "--side", "64", "--bands", "8", "--epochs", "2", "--batches", "5",
          "--json", str(out)], tmp_path)
    doc = json.loads(out.read_text())
    assert doc["samples"] == 64 * 64 and [r["epoch"] for r in doc["rows"]] == [0, 1]
    assert all(r["first_batch_s"] > 0 and r["batches_per_s"] > 0 and r["peak_rss_above_start_MB"] >= 0
               for r in doc["rows"])


def test_bench_plan_held_tiny(tmp_path):
    out = tmp_path / "held.json"
    _run([str(BENCH / "bench_plan.py"), "--held", "64x48", "--bands", "3", "--labelled", "0.2", "--json", str(out)],
         tmp_path)
    doc = json.loads(out.read_text())
    assert 0 < doc["samples"] < 64 * 48 and doc["listed_bytes_per_sample"] == 24  # six int32 fields
    assert 0 < doc["samples_held_MB"] < doc["listed_MB"]


def test_bench_plan_shares(tmp_path):
    """The shares section on its seeded scene: equal shares repeat fewer samples than ranks per epoch."""
    out = tmp_path / "shares.json"
    _run([str(BENCH / "bench_plan.py"), "--shares", "--json", str(out)], tmp_path)
    rows = json.loads(out.read_text())["rows"]
    assert [r["world_size"] for r in rows] == [2, 4, 8]
    assert all(r["equal_shares_repeated_max"] < r["world_size"] for r in rows)
    assert all(r["batches_per_rank"][0] == r["batches_per_rank"][1] for r in rows)  # the same every epoch
    assert all(r["whole_tiles_repeated_max"] >= r["equal_shares_repeated_max"] for r in rows)


def test_bench_large_scene_tiny(tmp_path):
    """benchmarks/bench_large_scene.py end to end on a small scene: the time to first batch per mode, and
    the streaming section through a ring smaller than the store."""
    proc = _run([str(BENCH / "bench_large_scene.py"), "--side", "1024", "--bands", "8", "--repeats", "1",
                 "--ring-mib", "12", "--work", str(tmp_path / "work")], tmp_path, timeout=600)
    doc = json.loads(proc.stdout)
    assert doc["scene"]["shape"] == [1024, 1024, 8] and doc["scene"]["convert_MBps"] > 0
    for mode in ("train", "all", "all+train"):
        run = doc["first_batch"][mode]["runs"][0]
        assert run["mode"] == mode and run["to_first_batch_s"] >= run["construction_s"] > 0
        assert run["tiles_read_by_then"] >= 1 and run["bytes_read_by_then"] > 0 and run["samples_held_bytes"] > 0
    runs = {mode: doc["first_batch"][mode]["runs"][0] for mode in ("all", "all+train")}
    assert runs["all+train"]["samples"] < runs["all"]["samples"]  # the other splits' labelled pixels left out
    # held per left-out pixel (8 bytes), not per sample as a listing would (22 bytes)
    assert runs["all+train"]["samples_held_bytes"] < 22 * runs["all+train"]["samples"] / 4
    stream = doc["streaming"]
    assert stream["collection_over_ring"] > 1
    assert stream["loader_cold"]["bytes_read_per_epoch"] == stream["collection_bytes"]


def test_bench_cut_overhead_tiny(tmp_path):
    """benchmarks/bench_cut_overhead.py: the host time before the first kernel is part of the whole cut."""
    pytest.importorskip("numba")
    out = tmp_path / "overhead.json"
    _run([str(BENCH / "bench_cut_overhead.py"), "--batches", "60", "--json", str(out)], tmp_path)
    doc = json.loads(out.read_text())
    assert 0 < doc["before_first_kernel_us"] < doc["whole_cut_us"]


def test_bench_cpu_roofline_tiny(tmp_path):
    """benchmarks/bench_cpu_roofline.py: every row measured on 1 and 2 threads, the kernel's rows included."""
    pytest.importorskip("numba")
    out = tmp_path / "roofline.json"
    _run([str(BENCH / "bench_cpu_roofline.py"), "--rounds", "1", "--json", str(out)], tmp_path)
    doc = json.loads(out.read_text())
    rows = {r["what"]: r for r in doc["rows"]}
    assert {"memcpy (np.copyto, float32 batch)", "kernel bfloat16 NCHW, plain stores",
            "rounding loop in L1 (arithmetic alone, bfloat16 output bytes)",
            "bfloat16 NCHW from normalized tiles (copy_range, streamed)"} <= set(rows)
    assert all(r["GBps_1_thread"] > 0 and r["GBps_2_thread"] > 0 for r in rows.values())
    # a difference of two timings (normalize + restoring copy, less the copy): one round under load can come
    # out below 0, so only its presence is checked, never its sign (no timed assertions in tests)
    assert math.isfinite(doc["normalize_tile_s"])
    assert all(0 < doc["floor_ratios"][k]["q25"] <= doc["floor_ratios"][k]["median"] for k in ("plain", "streamed", "copy16"))


def test_bench_band_selection_tiny(tmp_path):
    """benchmarks/bench_band_selection.py: both paths timed for every selection; register blocks where runs allow."""
    pytest.importorskip("numba")
    out = tmp_path / "bands.json"
    _run([str(BENCH / "bench_band_selection.py"), "--reps", "1", "--json", str(out)], tmp_path)
    rows = {r["selection"]: r for r in json.loads(out.read_text())["kernel"]}
    assert [r["register_blocks"] for r in rows.values()] == [True, True, True, False]
    assert all(r["blocks_us"] > 0 and r["scratch_us"] > 0 for r in rows.values())
