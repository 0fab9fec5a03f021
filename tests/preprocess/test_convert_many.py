"""hsgds convert-many on a real dask.distributed LocalCluster (scheduler + 2 worker processes, no mocks):
a worker killed mid-scene, reruns that convert only what is missing / changed / damaged, failing scenes
named while the others complete, and one-line manifest errors."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import hsgds  # noqa: E402
from hsgds._wording import duration  # noqa: E402
from hsgds.collection import open_collection  # noqa: E402
from hsgds.preprocess.convert import ConvertOptions  # noqa: E402
from hsgds.preprocess.convert_many import convert_many, read_manifest  # noqa: E402
from hsgds.scene import open_scene  # noqa: E402
from hsgds.synthetic import make_scene  # noqa: E402
from tests.envi import write_envi  # noqa: E402

CLASSES = ("soil", "grass", "water")
OPTS = ConvertOptions(max_patch=5, class_names=CLASSES, workers=2)


@pytest.fixture(scope="module")
def cluster():
    """One real LocalCluster for the module: a scheduler and 2 worker processes (restarted by their nanny
    when killed)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=50) as c:
        yield c


def make_sources(folder: Path, n: int = 6, big: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """``n`` seeded scenes (even: .npy with labels in data/, odd: ENVI without labels in envi/), a manifest
    with relative paths and explicit names for some; returns name -> (cube, labels)."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "envi").mkdir(exist_ok=True)
    rows, arrays = ["source,labels,name"], {}
    for i in range(n):
        cube, labels = make_scene(30 + 3 * i, 22 + i, 6, classes=3, seed=i)
        if i % 2 == 0:
            np.save(folder / f"data/cube{i}.npy", cube)
            np.save(folder / f"data/gt{i}.npy", labels)
            rows.append(f"data/cube{i}.npy,data/gt{i}.npy,")
            arrays[f"cube{i}"] = (cube, labels)
        else:
            write_envi(folder / f"envi/line{i}", cube, interleave="bsq")
            rows.append(f"envi/line{i}.hdr,,flight_{i}")
            arrays[f"flight_{i}"] = (cube, None)
    if big:  # slow enough (~44 MB, a second or more) to be caught in the middle of its conversion
        cube = np.random.default_rng(7).integers(0, 10000, (700, 600, 52), dtype=np.int16)
        np.save(folder / "data/big.npy", cube)
        rows.insert(1, "data/big.npy,,")
        arrays["big"] = (cube, None)
    (folder / "scenes.csv").write_text("\n".join(rows) + "\n")
    return arrays


def sha256(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


def check_collection(out: Path, arrays: dict, folder: Path) -> None:
    """Every store verifies and holds its source exactly; nothing partial or hidden is left in ``out``;
    collection.json lists exactly these scenes, with their sources' sha256."""
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{n}.zarr" for n in arrays] + ["collection.json"])
    listed = json.loads((out / "collection.json").read_text())["scenes"]
    assert sorted(s["name"] for s in listed) == sorted(arrays)
    c = open_collection(out)
    for name, (cube, labels) in arrays.items():
        scene = c.scene(name)
        assert scene.verify() == []
        h, w, _ = cube.shape
        np.testing.assert_array_equal(scene.read(0, h, 0, w), cube)
        if labels is not None:
            np.testing.assert_array_equal(scene.labels, labels)
            assert scene.class_names == list(CLASSES)
            src = folder / f"data/{name}.npy"
        else:
            src = folder / f"envi/line{name.split('_')[1]}.img" if name != "big" else folder / "data/big.npy"
        files = [src] if src.suffix == ".npy" else [src, src.with_suffix(".hdr")]
        assert c.entries[c.index(name)].source_sha256 == sha256(*files)


def _lock_holder(pids: dict[str, int], folder: Path) -> int | None:
    """The worker process holding an open descriptor on ``folder`` (the converter's lock), via /proc."""
    for pid in pids.values():
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(folder):
                    return pid
        except OSError:
            continue
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the converting worker through /proc")
@pytest.mark.timeout(300)
def test_worker_killed_mid_scene_then_everything_converted(cluster, tmp_path):
    arrays = make_sources(tmp_path, n=6, big=True)
    out = tmp_path / "out"
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
        except BaseException as exc:  # surfaced by the assertions below
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    with distributed.Client(cluster) as client:
        pids = client.run(os.getpid)
        worker.start()
        killed, deadline = None, time.monotonic() + 120
        while killed is None and time.monotonic() < deadline and worker.is_alive():
            for tmp in out.glob(".big.zarr.tmp-*") if out.is_dir() else []:
                if any((tmp / "tiles").rglob("*")):  # tiles are being written: the scene is half done
                    pid = _lock_holder(pids, tmp)
                    if pid is not None:
                        os.kill(pid, signal.SIGKILL)
                        killed = (pid, tmp)
                        break
            time.sleep(0.01)
        worker.join(240)
    assert killed is not None, "the big scene was never seen in the middle of its conversion"
    assert "error" not in outcome, outcome.get("error")
    first = outcome["result"]
    # Dask reschedules the killed worker's task: the run completes (a scene the cluster gave up on would be
    # named as failed and converted by the rerun below)
    assert {r.name for r in first.scenes} == set(arrays)
    for r in first.failed:
        assert "worker" in r.reason.lower() or "killed" in r.reason.lower(), r.reason
    listed = {s["name"] for s in json.loads((out / "collection.json").read_text())["scenes"]}
    assert listed == {r.name for r in first.scenes if r.status == "converted"}
    assert not killed[1].exists()  # the killed conversion's temporary folder was removed

    second = convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    assert second.failed == []
    assert {r.name for r in second.converted} == {r.name for r in first.failed}
    check_collection(out, arrays, tmp_path)


def test_rerun_converts_only_missing_changed_or_damaged(cluster, tmp_path):
    arrays = make_sources(tmp_path, n=6)
    out = tmp_path / "out"
    first = convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    assert [r.status for r in first.scenes] == ["converted"] * 6
    check_collection(out, arrays, tmp_path)

    again = convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    assert [r.status for r in again.scenes] == ["up to date"] * 6

    import shutil

    shutil.rmtree(out / "cube0.zarr")                                          # missing
    cube2, gt2 = make_scene(36, 24, 6, classes=3, seed=99)                     # changed: same size, new values
    np.save(tmp_path / "data/cube2.npy", cube2)
    arrays["cube2"] = (cube2, arrays["cube2"][1])
    tile = open_scene(out / "flight_1.zarr").tile_paths[0]                     # damaged: one flipped byte
    raw = bytearray(tile.read_bytes())
    raw[100] ^= 0xFF
    tile.write_bytes(bytes(raw))
    img = tmp_path / "envi/line3.img"                                          # touched: same bytes, new mtime
    os.utime(img, ns=(img.stat().st_atime_ns, img.stat().st_mtime_ns + 10**9))
    third = convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    status = {r.name: (r.status, r.reason) for r in third.scenes}
    assert status["cube0"] == ("converted", "its store was missing")  # listed by the last run, deleted since
    assert status["cube2"] == ("converted", "source changed (sha256)")
    assert status["flight_1"][0] == "converted" and "damaged: 1 problem (tile 0 " in status["flight_1"][1]
    assert {n for n, (s, _) in status.items() if s == "up to date"} == {"flight_3", "cube4", "flight_5"}
    check_collection(out, arrays, tmp_path)

    fourth = convert_many(tmp_path / "scenes.csv", out, ConvertOptions(max_patch=7, class_names=CLASSES),
                          scheduler=cluster.scheduler_address)
    assert {r.reason for r in fourth.scenes} == {"--max-patch 7 differs from the store's (5)"}  # every scene again
    assert {open_scene(out / f"{n}.zarr").meta.halo for n in arrays} == {3}


def _kept_files(out: Path) -> dict[Path, tuple[int, int, int]]:
    """(inode, mtime_ns, size) of every file of every store in ``out`` but the stores' root zarr.json (their
    metadata): tile chunks, labels, samples, statistics and the arrays' own zarr.json."""
    return {p: (st.st_ino, st.st_mtime_ns, st.st_size) for store in out.glob("*.zarr") for p in store.rglob("*")
            if p.is_file() and p != store / "zarr.json" for st in [p.stat()]}


def test_a_rerun_changing_only_class_names_rewrites_only_the_metadata(cluster, tmp_path, run_cli):
    """An archive converted without --class-names (unlabelled scenes for pretraining beside labelled ones),
    then the same command with them: each store's metadata is rewritten with the names (and, for a labelled
    scene, the classes they name), no file of any store is written again, zarr-python reads the new names, the
    stores verify and load together; names that do not name a labelled scene's classes fail that scene alone,
    with the conversion's one-line reason."""
    import zarr

    arrays = make_sources(tmp_path, n=4)  # cube0, cube2 labelled (classes 1..3); flight_1, flight_3 not
    assert all(int(gt.max()) == 3 for _, gt in arrays.values() if gt is not None)
    out = tmp_path / "out"
    first = convert_many(tmp_path / "scenes.csv", out, ConvertOptions(max_patch=5, workers=2),
                         scheduler=cluster.scheduler_address)
    assert [r.status for r in first.scenes] == ["converted"] * 4
    kept = _kept_files(out)
    roots = {n: json.loads((out / f"{n}.zarr/zarr.json").read_text()) for n in arrays}
    names = (*CLASSES, "road")  # a campaign's list: more classes than these scenes hold
    args = ("convert-many", tmp_path / "scenes.csv", "-o", out, "--max-patch", "5", "--scheduler",
            cluster.scheduler_address, "--class-names")
    code, stdout, stderr = run_cli(*args, ",".join(names))
    assert code == 0, stderr
    for n in arrays:
        assert (f"{n}: metadata updated (class names): --class-names soil,grass,water,road differs from the "
                "store's (not given)") in stdout
    assert "0 converted (0 tiles, 0.0 MB), 4 metadata updated (class names), 0 up to date, 0 failed of 4" in stdout
    assert _kept_files(out) == kept  # nothing re-tiled, nothing else rewritten
    for n, (_, gt) in arrays.items():
        doc = json.loads((out / f"{n}.zarr/zarr.json").read_text())
        attrs = zarr.open_group(out / f"{n}.zarr", mode="r").attrs["hsgds"]
        assert attrs["class_names"] == list(names) and attrs["num_classes"] == (0 if gt is None else 4)
        for d in (doc, roots[n]):  # all else as converted
            del d["attributes"]["hsgds"]["class_names"], d["attributes"]["hsgds"]["num_classes"]
        assert doc == roots[n]
    listed = json.loads((out / "collection.json").read_text())["scenes"]
    assert [s["class_names"] for s in listed] == [list(names)] * 4
    code, text, err = run_cli("verify", out)
    assert code == 0, err
    code, text, err = run_cli("info", out / "cube0.zarr")  # its classes named in the per-class table
    present = np.unique(arrays["cube0"][1][arrays["cube0"][1] > 0])
    assert code == 0 and all(f"{c:>5}  {names[c - 1]:<28}" in text for c in present), text
    code, text, err = run_cli("info", out / "flight_1.zarr")
    assert code == 0 and ("classes:    none (converted without --labels; the collection's class names: soil, grass, "
                          "water, road)\n") in text, text
    # the collection loads as one (every scene now has the same classes); labels as the label maps hold them
    order = [e.name for e in open_collection(out).entries]
    with hsgds.PatchLoader(out, patch_size=5, batch_size=64, split=None, return_coords=True, device="cpu") as ld:
        got = [(lb.numpy(), c.numpy()) for _, lb, c in ld]
    labels, coords = np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])
    expected = {(i, y, x) for i, n in enumerate(order) if arrays[n][1] is not None
                for y, x in zip(*np.nonzero(arrays[n][1]))}
    assert len(coords) == len(expected) and set(map(tuple, coords.tolist())) == expected
    np.testing.assert_array_equal(labels, [arrays[order[i]][1][y, x] - 1 for i, y, x in coords])  # class k: k-1

    again = convert_many(tmp_path / "scenes.csv", out, ConvertOptions(max_patch=5, class_names=names, workers=2),
                         scheduler=cluster.scheduler_address)
    assert [r.status for r in again.scenes] == ["up to date"] * 4
    # two names cannot name the labelled scenes' three classes: those fail as a conversion would, untouched
    code, stdout, stderr = run_cli(*args, "soil,grass")
    assert code == 1 and "0 converted (0 tiles, 0.0 MB), 2 metadata updated (class names), 0 up to date, 2 failed" \
        in stdout, stderr
    for n in ("cube0", "cube2"):
        assert (f"hsgds: failed: {n}: --class-names lists 2 names but the labels hold class 3; give one name per "
                "class, in label order\n") in stderr
        assert open_scene(out / f"{n}.zarr").class_names == list(names)
    assert [open_scene(out / f"{n}.zarr").class_names for n in ("flight_1", "flight_3")] == [["soil", "grass"]] * 2
    assert _kept_files(out) == kept


def test_failing_scene_is_named_and_the_others_complete(cluster, tmp_path, run_cli):
    arrays = make_sources(tmp_path, n=3)
    (tmp_path / "data/broken.npy").write_bytes(np.lib.format.MAGIC_PREFIX + b"\x01\x00garbage")
    with open(tmp_path / "scenes.csv", "a") as f:
        f.write("data/broken.npy,,\n")
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("convert-many", tmp_path / "scenes.csv", "-o", out, "--max-patch", "5",
                                   "--class-names", ",".join(CLASSES), "--scheduler", cluster.scheduler_address)
    assert code == 1
    failed = [line for line in stderr.splitlines() if line.startswith("hsgds: failed: ")]
    assert len(failed) == 1 and failed[0].startswith("hsgds: failed: broken: ") and "broken.npy" in failed[0]
    assert "hsgds: error: 1 of 4 scenes failed (broken)" in stderr
    assert "3 converted" in stdout and "1 failed of 4 scenes" in stdout
    check_collection(out, arrays, tmp_path)  # broken is neither listed nor left half-written


#: a progress line of convert-many in a log: scenes done of all, those up to date and failed, seconds per scene
#: (per scene converted once some were up to date, if any was), time left ("up to" once some were up to date)
PROGRESS_LINE = re.compile(r"^hsgds: convert-many: (?P<done>[\d,]+) of (?P<total>[\d,]+) scenes done"
                           r"(?: \((?:(?P<up_to_date>[\d,]+) up to date)?(?:, )?(?:(?P<failed>[\d,]+) failed)?\))?"
                           r"(?:, (?P<pace>[\d.]+) s per scene(?: converted)?|, [\d,]+ scenes(?: converted)? per s)?"
                           r"(?P<left>, (?:about|up to) (?P<time>\S+) left)?$")  # (under 10 ms: as a rate)


def test_a_batch_jobs_log_gets_progress_lines_at_most_every_interval(cluster, tmp_path, run_cli, hsgds_env):
    """On a stderr that is not a terminal (captured here, as in a batch job's log) no bar is drawn, and the command
    said nothing until the end: it now writes a line as a scene finishes, at most every HSGDS_PROGRESS_LOG_S
    seconds, and one when the last finishes. At 0 a line per scene (never per tile: the scenes have several
    tiles), counting the scenes done of the manifest's, and as failed as many as the "hsgds: failed:" lines
    before it; the last says no time left. At a day only the last line. A bad value is one line."""
    make_sources(tmp_path, n=3)
    (tmp_path / "data/broken.npy").write_bytes(np.lib.format.MAGIC_PREFIX + b"\x01\x00garbage")
    with open(tmp_path / "scenes.csv", "a") as f:
        f.write("data/broken.npy,,\n")
    scenes = len(read_manifest(tmp_path / "scenes.csv"))
    assert scenes == 4
    args = ("convert-many", tmp_path / "scenes.csv", "-o", tmp_path / "out", "--max-patch", "5", "--tile", "28",
            "--class-names", ",".join(CLASSES), "--scheduler", cluster.scheduler_address)

    def progress_lines(stderr: str) -> list[tuple[int, int, int, bool]]:
        """(done, total, failed, time left said) of each progress line, checking each line's failed count
        against the failures named before it."""
        found, failures = [], 0
        for line in stderr.splitlines():
            failures += line.startswith("hsgds: failed: ")
            m = PROGRESS_LINE.match(line)
            if m:
                failed = int((m["failed"] or "0").replace(",", ""))
                assert failed == failures, stderr
                found.append((int(m["done"]), int(m["total"]), failed, m["left"] is not None))
        return found

    hsgds_env("HSGDS_PROGRESS_LOG_S", "0")
    code, stdout, stderr = run_cli(*args)
    assert code == 1 and "3 converted" in stdout, stderr
    assert sum(len(open_scene(tmp_path / "out" / f"{n}.zarr").tile_paths) for n in ("cube0", "flight_1", "cube2")) > 4
    lines = progress_lines(stderr)
    assert [(done, total) for done, total, _, _ in lines] == [(k, scenes) for k in range(1, scenes + 1)], stderr
    assert lines[-1][2] == 1 and [left for *_, left in lines] == [True] * (scenes - 1) + [False], stderr

    hsgds_env("HSGDS_PROGRESS_LOG_S", "86400")  # the run takes less than a day: the last line alone
    code, stdout, stderr = run_cli(*args)
    assert code == 1 and "3 up to date, 1 failed" in stdout, stderr
    assert progress_lines(stderr) == [(scenes, scenes, 1, False)], stderr
    assert "scenes done (3 up to date, 1 failed)\n" in stderr, stderr  # none converted: no pace to give

    hsgds_env("HSGDS_PROGRESS_LOG_S", "-1")
    code, _, stderr = run_cli(*args)
    assert code == 2 and stderr.count("\n") == 1 and "HSGDS_PROGRESS_LOG_S='-1' is not seconds in [0, 86400]" in stderr


def test_a_reruns_log_gives_the_pace_of_the_scenes_converted_and_the_time_left_at_most(hsgds_env, capsys):
    """A rerun's scenes found up to date finish in a fraction of a second and come first: the mean over every
    scene made the time left far too low. The line counts them and gives the wall-clock pace of the scenes
    converted (the wall clock shared by the seconds the workers spent on each: two workers side by side) and the
    time left were every scene left converted ("up to"); nothing about time before one was converted. Checked
    with a clock of the test's own against the arithmetic done here; a run without such scenes reads as before."""
    from hsgds.cli import _SceneLog

    hsgds_env("HSGDS_PROGRESS_LOG_S", "0")
    now = [100.0]
    log = _SceneLog(clock=lambda: now[0])
    # 8 scenes up to date (0.1 s of a worker's each, two at a time: 0.05 s of wall clock), then 12 to convert
    # (10 s each, two at a time: 5 s of wall clock), one of which fails at once
    for k in range(1, 9):
        now[0] += 0.05
        log.scene_done("up to date", 0.1, k, 20)
    for k in range(9, 12):
        now[0] += 5.0
        log.scene_done("converted", 10.0, k, 20)
    log.scene_done("failed", 0.0, 12, 20)
    lines = capsys.readouterr().err.splitlines()
    assert lines[:8] == [f"hsgds: convert-many: {k} of 20 scenes done ({k} up to date)" for k in range(1, 9)]
    elapsed = 8 * 0.05 + 3 * 5.0
    share = 30.0 / (8 * 0.1 + 30.0)  # the converted scenes' part of the workers' seconds
    each = elapsed * share / 3
    assert each == pytest.approx(5.0, rel=0.01)  # the two workers' pace, not the mean over all (1.4 s)
    assert lines[10] == f"hsgds: convert-many: 11 of 20 scenes done (8 up to date), {each:.3g} s per scene converted, " \
                        f"up to {duration(each * 9)} left" == ("hsgds: convert-many: 11 of 20 scenes done (8 up to date), "
                                                              "5 s per scene converted, up to 45s left")
    assert lines[11] == ("hsgds: convert-many: 12 of 20 scenes done (8 up to date, 1 failed), 5 s per scene converted, "
                         "up to 40s left")

    fresh = _SceneLog(clock=lambda: now[0])  # no scene up to date: the mean over all, "about", as before
    for k in (1, 2):
        now[0] += 5.0
        fresh.scene_done("converted", 10.0, k, 4)
    assert capsys.readouterr().err.splitlines()[-1] == ("hsgds: convert-many: 2 of 4 scenes done, 5 s per scene, "
                                                        "about 10s left")


def test_a_rerun_with_most_scenes_up_to_date_logs_them_and_the_time_left_at_most(cluster, tmp_path, run_cli,
                                                                                  hsgds_env):
    """A real rerun, in a log, of 6 scenes of which 4 are up to date: every line counts the scenes up to date
    so far (ending at 4), says no pace or time left until a scene was converted, then the pace per scene
    converted and "up to" the time left at that pace for every scene left (checked against the line's own
    numbers, not the clock)."""
    import shutil

    make_sources(tmp_path, n=6)
    out = tmp_path / "out"
    args = ("convert-many", tmp_path / "scenes.csv", "-o", out, "--max-patch", "5", "--class-names",
            ",".join(CLASSES), "--scheduler", cluster.scheduler_address)
    code, stdout, stderr = run_cli(*args)
    assert code == 0 and "6 converted" in stdout, stderr
    for name in ("cube4", "flight_5"):
        shutil.rmtree(out / f"{name}.zarr")
    hsgds_env("HSGDS_PROGRESS_LOG_S", "0")
    code, stdout, stderr = run_cli(*args)
    assert code == 0 and "2 converted" in stdout and "4 up to date" in stdout, stderr
    lines = [m for m in map(PROGRESS_LINE.match, stderr.splitlines()) if m]
    assert [int(m["done"]) for m in lines] == list(range(1, 7)), stderr
    up_to_date = [int(m["up_to_date"] or 0) for m in lines]
    assert up_to_date[-1] == 4 and up_to_date == sorted(up_to_date), stderr
    for m, kept in zip(lines, up_to_date):
        converted = int(m["done"]) - kept
        if converted == 0:  # nothing converted yet: no pace, no time left
            assert m["pace"] is None and m["left"] is None, stderr
            continue
        if kept == 0:  # the scenes converted came first: as a first run says it
            assert " converted" not in m[0] and "about" in m[0], stderr
            continue
        assert " converted" in m[0] and (m["left"] is None) == (m["done"] == "6"), stderr
        if m["left"] and m["pace"]:  # the time left: the pace said for each scene left (a rate: too fast to say)
            pace, left = float(m["pace"]), 6 - int(m["done"])
            half = 0.5 * 10 ** (np.floor(np.log10(pace)) - 2)  # the pace is said to 3 digits
            assert "up to" in m["left"] and m["time"] in {duration((pace + d) * left) for d in (-half, 0, half)}, stderr
    assert lines[-1]["pace"] and " s per scene converted" in lines[-1][0], stderr


def test_time_left_reads_as_seconds_minutes_or_hours():
    from hsgds._wording import duration

    assert [duration(s) for s in (0.2, 42.4, 59.6, 307, 3599.4, 4380, 96000)] == [
        "1s", "42s", "1m00s", "5m07s", "59m59s", "1h13m", "26h40m"]


def test_local_cluster_from_the_cli(tmp_path, run_cli):
    """Without --scheduler the command starts its own LocalCluster with --workers processes."""
    arrays = make_sources(tmp_path, n=2)
    code, stdout, stderr = run_cli("convert-many", tmp_path / "scenes.csv", "-o", tmp_path / "out", "--workers", "1",
                                   "--max-patch", "5", "--class-names", ",".join(CLASSES))
    assert code == 0, stderr
    assert "2 converted" in stdout
    check_collection(tmp_path / "out", arrays, tmp_path)


@pytest.mark.parametrize("manifest, message", [
    ("labels\ngt.npy\n", "has no 'source' column"),
    ("source,lables\na.npy,gt.npy\n", "unknown column 'lables'; columns are source, labels, name, key, labels_key"),
    ("source,name\na.npy,x\nb.npy,X\n", "line 3: scene name 'X' is already used on line 2"),
    ("source\na.npy\nsub/a.npy\n", "line 3: scene name 'a' is already used on line 2"),
    # the same name composed and decomposed (e + U+0300): one file name where names are normalized (macOS)
    ("source,name\na.npy,sc\u00e8ne\nb.npy,Sce\u0300ne\n", "line 3: scene name 'Sce\u0300ne' is already used on line 2"),
    ("source\nmissing.npy\n", r"line 2: source .*missing.npy does not exist; fix the path"),
    ("source,labels\na.npy,nogt.npy\n", r"line 2: labels .*nogt.npy does not exist"),
    ("source\nsub\n", "is a folder"),
    ("source,name\na.npy,../x\n", "name '../x' cannot be a store name"),
    # control characters (C0, DEL, C1) became store folder names and collection.json entries
    ("source,name\na.npy,a\tb\n", r"line 2: name 'a\\tb' holds the control character '\\t'; give the scene a name "
                                    r"without control characters \(tab, line break, \.\.\.\) in the name column$"),
    ('source,name\na.npy,"x\ny"\n', r"line 3: name 'x\\ny' holds the control character '\\n'"),
    # a carriage return inside a quoted value was read as a line break (the file was read with newline translation)
    ('source,name\na.npy,"x\ry"\n', r"line 3: name 'x\\ry' holds the control character '\\r'"),
    ("source,name\na.npy,x\x01y\n", r"line 2: name 'x\\x01y' holds the control character '\\x01'"),
    ("source,name\na.npy,\x1b[31mred\n", r"line 2: name '\\x1b\[31mred' holds the control character '\\x1b'"),
    ("source,name\na.npy,del\x7f\n", r"line 2: name 'del\\x7f' holds the control character '\\x7f'"),
    ("source,name\na.npy,nel\x85x\n", r"line 2: name 'nel\\x85x' holds the control character '\\x85'"),
    # longer than a file name may be with the converter's temporary suffix: every conversion failed, blaming -o
    ("source,name\na.npy," + "n" * 237 + "\n", r"line 2: name 'n{40} \.\.\.' is 237 bytes long; a store name may "
                                             r"have at most 236 \(in UTF-8\); shorten it in the name column"),
    ("source,name\na.npy," + "\u00e9" * 119 + "\n", "line 2: name .* is 238 bytes long"),
    ("source,name\na.npy\n", "line 2 has 1 fields, the header has 2; quote values that contain commas"),
    # trailing commas: their empty fields were called an unknown column '', or a value holding a comma
    ("source,name,\na.npy,x,\n", r"m.csv: the header's field 3 is empty \(a trailing comma\?\); name every column "
                                 r"\(source, labels, name, key, labels_key, band_axis, wavelengths, nodata\) and nothing"),
    ("source,name\na.npy,x,,\n", "line 2 has 4 fields, the header has 2; remove the commas at its end$"),
    ("source,name\na.npy,x,b.npy\n", "line 2 has 3 fields, the header has 2; quote values that contain commas$"),
    ("source,name\n,x\n", "line 2: source is empty"),
    ("source,band_axis\na.npy,sideways\n", "line 2: band_axis 'sideways' is not one of first, middle, last; leave "
                                           "it empty"),
    ("source\n", "lists no scenes"),
    ("", "is empty"),
])
def test_manifest_errors_are_one_line(tmp_path, run_cli, manifest, message):
    (tmp_path / "sub").mkdir()
    for p in ("a.npy", "b.npy", "sub/a.npy", "gt.npy"):
        np.save(tmp_path / p, np.zeros((4, 4, 2), np.int16))
    (tmp_path / "m.csv").write_text(manifest)
    code, _, stderr = run_cli("convert-many", tmp_path / "m.csv", "-o", tmp_path / "out")
    assert code == 2
    assert stderr.count("\n") == 1 and stderr.startswith("hsgds: error: manifest ")
    assert __import__("re").search(message, stderr), stderr
    assert not (tmp_path / "out").exists()  # nothing written for a bad manifest


def test_a_source_stem_holding_a_control_character_is_refused_as_the_scene_name(tmp_path, run_cli):
    """Without a name column the scene is named by its source's stem, which a file name may fill with tabs or
    line breaks: refused like a name column's, before anything is written, saying to give a name."""
    np.save(tmp_path / "flight\t1.npy", np.zeros((4, 4, 2), np.int16))
    (tmp_path / "m.csv").write_text('source\n"flight\t1.npy"\n')
    code, _, stderr = run_cli("convert-many", tmp_path / "m.csv", "-o", tmp_path / "out")
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "line 2: name 'flight\\t1' holds the control character '\\t'; give the scene a name" in stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "m.csv").write_text('source,name\n"flight\t1.npy",flight_1\n')  # the fix the message names
    assert [r.name for r in read_manifest(tmp_path / "m.csv")] == ["flight_1"]


def test_a_name_of_the_longest_length_allowed_converts(tmp_path):
    """The limit on a name's length is what the file system needs, not less: a name of 236 bytes converts."""
    from hsgds.preprocess.convert_many import convert_scene

    cube, _ = make_scene(10, 10, 2, classes=2, seed=0)
    np.save(tmp_path / "a.npy", cube)
    (tmp_path / "m.csv").write_text("source,name\na.npy," + "n" * 236 + "\n")
    (row,) = read_manifest(tmp_path / "m.csv")
    result = convert_scene(row, tmp_path, ConvertOptions(max_patch=3))
    assert result.status == "converted", result.reason
    np.testing.assert_array_equal(open_scene(tmp_path / f"{'n' * 236}.zarr").read(0, 10, 0, 10), cube)


def test_help_gives_the_manifest_header_as_one_csv_line(run_cli):
    """`hsgds convert-many --help` names the manifest's columns as the header a user writes (the README's
    form): the docstring broke it across two lines, which click joined as 'wavelengths, nodata'."""
    from hsgds.preprocess.convert_many import COLUMNS

    code, out, _ = run_cli("convert-many", "--help")
    assert code == 0
    header = f"{COLUMNS[0]}[,{','.join(COLUMNS[1:])}]"
    assert header in out, out


def test_manifest_paths_are_relative_to_its_folder(tmp_path):
    make_sources(tmp_path / "campaign", n=2)
    rows = read_manifest(tmp_path / "campaign/scenes.csv")
    assert [r.name for r in rows] == ["cube0", "flight_1"]
    assert rows[0].source == (tmp_path / "campaign/data/cube0.npy").resolve()
    assert rows[0].labels == (tmp_path / "campaign/data/gt0.npy").resolve() and rows[1].labels is None


def test_manifest_as_spreadsheets_and_hands_write_it(tmp_path):
    """A BOM, CRLF line ends, blank lines, spaces around the commas and quoted paths (holding a comma, or
    after a space): the same rows as a plain manifest."""
    (tmp_path / "my data").mkdir()
    for p in ("my data/a, b.npy", "my data/gt a.npy", "c.npy"):
        np.save(tmp_path / p, np.zeros((4, 4, 2), np.int16))
    (tmp_path / "m.csv").write_bytes(b'\xef\xbb\xbfsource , labels,name\r\n\r\n'
                                     b'"my data/a, b.npy", "my data/gt a.npy" ,\r\n'
                                     b' c.npy ,, "see"\r\n\r\n')
    rows = read_manifest(tmp_path / "m.csv")
    assert [(r.name, r.source, r.labels) for r in rows] == [
        ("a, b", (tmp_path / "my data/a, b.npy").resolve(), (tmp_path / "my data/gt a.npy").resolve()),
        ("see", (tmp_path / "c.npy").resolve(), None)]


def test_manifest_paths_holding_line_breaks_are_read_whole(tmp_path):
    """A quoted path holding a newline, and paths holding U+2028 or U+0085 (file names may hold any of them):
    the rows were cut at each (str.splitlines), a path losing its newline or split over two rows."""
    names = ["two\nlines.npy", "sep\u2028a.npy", "nel\x85b.npy"]
    for name in names:
        np.save(tmp_path / name, np.zeros((4, 4, 2), np.int16))
    (tmp_path / "m.csv").write_text("source,name\n" + "".join(f'"{n}",s{i}\n' for i, n in enumerate(names)),
                                    encoding="utf-8")
    rows = read_manifest(tmp_path / "m.csv")
    assert [(r.name, r.source) for r in rows] == [(f"s{i}", (tmp_path / n).resolve()) for i, n in enumerate(names)]


def test_without_distributed_the_error_names_the_extra(tmp_path):
    make_sources(tmp_path, n=1)
    code = ("import sys; sys.modules['distributed'] = None\n"  # as if it were not installed
            "from hsgds.cli import main\n"
            f"main(['convert-many', {str(tmp_path / 'scenes.csv')!r}, '-o', {str(tmp_path / 'out')!r}])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == ("hsgds: error: hsgds convert-many needs distributed, which is not installed; "
                                   'install it with pip install "hsgds[dask]"')


def test_bad_shared_option_is_refused_once_and_nothing_is_written(tmp_path, run_cli):
    make_sources(tmp_path, n=2)  # a labelled and an unlabelled scene: --train 1.5 used to fail only the first
    for args, message in ((("--train", "1.5"), "--train fraction must be in (0, 1), got 1.5"),
                          (("--threads", "0"), "--threads must be >= 1, got 0"),
                          (("--class-names", "a,,b"), "--class-names has an empty name")):
        code, stdout, stderr = run_cli("convert-many", tmp_path / "scenes.csv", "-o", tmp_path / "out", *args)
        assert code == 2 and stderr.count("\n") == 1 and message in stderr, stderr
        assert not (tmp_path / "out").exists()


def test_label_options_need_a_labelled_scene(tmp_path, run_cli):
    np.save(tmp_path / "a.npy", np.zeros((8, 8, 2), np.int16))
    (tmp_path / "m.csv").write_text("source\na.npy\n")
    code, _, stderr = run_cli("convert-many", tmp_path / "m.csv", "-o", tmp_path / "out", "--split", "blocks")
    assert code == 2 and stderr.strip() == (
        f"hsgds: error: --split blocks needs labelled scenes, and {tmp_path / 'm.csv'} lists none (no labels column "
        "values); add the ground truth in its labels column, or drop --split blocks"), stderr
    assert not (tmp_path / "out").exists()


def test_unreachable_scheduler_leaves_no_folder(tmp_path, run_cli, monkeypatch):
    import hsgds.preprocess.convert_many as many

    monkeypatch.setattr(many, "CONNECT_TIMEOUT", "2s")  # nothing listens on port 1: no need to wait 20 s
    make_sources(tmp_path, n=1)
    code, _, stderr = run_cli("convert-many", tmp_path / "scenes.csv", "-o", tmp_path / "out", "--scheduler",
                              "tcp://127.0.0.1:1")
    assert code == 2 and stderr.startswith("hsgds: error: cannot reach the Dask scheduler at tcp://127.0.0.1:1")
    assert not (tmp_path / "out").exists()


def test_a_scheduler_without_workers_is_said_and_waited_for(tmp_path):
    """A --scheduler whose workers are not started yet (or were forgotten): the command sat silent for ever.
    It says so in one line, naming the command that starts one, and waits: a worker that joins then converts
    every scene (each store holds its source exactly)."""
    arrays = make_sources(tmp_path, n=2)
    lines: list[str] = []
    said = threading.Event()
    done: dict = {}
    with distributed.LocalCluster(n_workers=0, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=50) as empty:
        address = empty.scheduler_address

        def run() -> None:
            done["result"] = convert_many(tmp_path / "scenes.csv", tmp_path / "out", OPTS, scheduler=address,
                                          notice=lambda line: (lines.append(line), said.set()))

        thread = threading.Thread(target=run)
        thread.start()
        assert said.wait(60), "no line said that the scheduler has no workers"
        assert not (tmp_path / "out" / "collection.json").exists()  # it waits: nothing converted without a worker
        empty.scale(1)
        thread.join(120)
        assert not thread.is_alive()
    assert lines == [f"the Dask scheduler at {address} has no workers yet; waiting for them (start them with "
                     f"`dask worker {address} --nthreads 1` where the manifest's paths and {tmp_path / 'out'} "
                     "are reachable, or press Ctrl-C)"]
    assert [r.status for r in done["result"].scenes] == ["converted"] * 2
    check_collection(tmp_path / "out", arrays, tmp_path)


def test_rerun_keeps_a_resplit_and_says_why_it_converts_again(cluster, tmp_path, run_cli):
    """convert-many, then a collection-wide resplit, then the same convert-many again: the re-split stores
    are up to date (converted with the command's options); other split options convert them again, saying
    which option differs."""
    make_sources(tmp_path, n=4)  # cube0, cube2 labelled
    out = tmp_path / "out"
    args = ("convert-many", tmp_path / "scenes.csv", "-o", out, "--max-patch", "5", "--class-names",
            ",".join(CLASSES), "--scheduler", cluster.scheduler_address)
    code, _, stderr = run_cli(*args)
    assert code == 0, stderr
    code, _, stderr = run_cli("resplit", out, "--split", "blocks", "--train", "0.2")
    assert code == 0, stderr
    resplit_codes = {n: open_scene(out / f"{n}.zarr").sample_table()["split"].copy() for n in ("cube0", "cube2")}
    (tmp_path / "data/broken.npy").write_bytes(np.lib.format.MAGIC_PREFIX + b"\x01\x00garbage")
    with open(tmp_path / "scenes.csv", "a") as f:  # one more row, failing: it used to undo the re-split
        f.write("data/broken.npy,,\n")
    code, stdout, stderr = run_cli(*args)
    assert code == 1 and "4 up to date, 1 failed" in stdout and "re-converted" not in stdout, (stdout, stderr)
    for name, codes in resplit_codes.items():
        scene = open_scene(out / f"{name}.zarr")
        assert scene.meta.split["method"] == "blocks" and scene.meta.converted_split["method"] == "random"
        assert np.array_equal(scene.sample_table()["split"], codes)
    listed = {e.name: e for e in open_collection(out).entries}["cube0"].tile_samples  # the current split's counts
    assert sum(listed["train"]) == np.count_nonzero(resplit_codes["cube0"] == 1)

    code, stdout, stderr = run_cli(*args, "--train", "0.2")
    assert code == 1 and "2 converted" in stdout, stderr  # the two labelled scenes; broken still fails
    lines = sorted(line for line in stdout.splitlines() if "re-converted" in line)
    assert lines == [f"{n}: re-converted: --train 0.2 differs from the store's (0.1)" for n in ("cube0", "cube2")]
    assert open_scene(out / "cube0.zarr").meta.split == open_scene(out / "cube0.zarr").meta.converted_split


def test_store_without_converted_split_is_compared_as_before(cluster, tmp_path):
    """A store written before converted_split existed: its current split is what the options are compared
    with, so after a re-split it is converted again (and the reason names the option)."""
    from hsgds.preprocess.resplit import resplit

    make_sources(tmp_path, n=1)
    out = tmp_path / "out"
    convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    store = out / "cube0.zarr"
    doc = json.loads((store / "zarr.json").read_text())
    del doc["attributes"]["hsgds"]["converted_split"]
    (store / "zarr.json").write_text(json.dumps(doc))
    assert open_scene(store).meta.converted_split is None
    resplit(store, "random", train=0.3)
    again = convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    assert [(r.status, r.reason) for r in again.scenes] == [("converted", "--train 0.1 differs from the store's (0.3)")]


def test_class_names_are_not_written_over_a_store_rewritten_meanwhile(tmp_path):
    """convert-many rewrites a store's class names under the lock `hsgds resplit` takes, and only over the
    metadata it compared: a store re-split between the comparison and the commit fails the scene (the next run
    compares again), its re-split kept; one whose lock is held fails with the lock's one-line reason; then a
    rerun renames it, its split as re-split."""
    import fcntl

    from hsgds.errors import StoreError
    from hsgds.preprocess.convert_many import RENAMED, ManifestRow, _renamed, _rewrite_metadata, convert_scene
    from hsgds.preprocess.resplit import resplit

    cube, gt = make_scene(24, 20, 4, classes=3, seed=3)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", gt)
    row, out = ManifestRow(name="c", source=tmp_path / "c.npy", labels=tmp_path / "g.npy"), tmp_path / "out"
    out.mkdir()
    assert convert_scene(row, out, ConvertOptions(max_patch=3)).status == "converted"
    store, named = out / "c.zarr", ConvertOptions(max_patch=3, labels=row.labels, class_names=CLASSES)
    checked = open_scene(store)
    _, renamed = _renamed(checked, named)
    assert renamed is not None and renamed.class_names == list(CLASSES)
    resplit(store, "random", train=0.3, seed=1)
    resplit_meta = json.loads((store / "zarr.json").read_text())
    with pytest.raises(StoreError, match=r"changed while its metadata was compared .*; run the same command "
                                         r"again$"):
        _rewrite_metadata(store, checked.meta, renamed)
    assert json.loads((store / "zarr.json").read_text()) == resplit_meta
    fd = os.open(store, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = convert_scene(row, out, ConvertOptions(max_patch=3, class_names=CLASSES))
    finally:
        os.close(fd)
    assert (locked.status, locked.reason) == ("failed", f"another `hsgds resplit` or `hsgds convert-many` is "
                                                         f"rewriting {store}; wait for it to finish")
    done = convert_scene(row, out, ConvertOptions(max_patch=3, class_names=CLASSES))
    assert done.status == RENAMED
    meta = open_scene(store).meta
    assert meta.class_names == list(CLASSES) and meta.split["train"] == 0.3 and meta.split_generation == 1
    assert [p.name for p in store.glob(".zarr.json*")] == []


def test_given_wavelengths_are_compared_with_the_store(tmp_path):
    """--wavelengths given to a rerun: a store converted with others is converted again, and the reason says so;
    not given, the store's (e.g. a source's own) are kept."""
    from dataclasses import replace

    from hsgds.preprocess.convert import convert
    from hsgds.preprocess.convert_many import _options_differ

    cube, _ = make_scene(20, 20, 3, classes=2, dtype="int16", seed=0)
    np.save(tmp_path / "c.npy", cube)
    opts = ConvertOptions(max_patch=5, wavelengths=(450.0, 550.0, 650.0))
    meta = open_scene(convert(tmp_path / "c.npy", tmp_path / "s.zarr", opts)).meta
    assert _options_differ(meta, opts) is None
    assert _options_differ(meta, replace(opts, wavelengths=None)) is None
    assert _options_differ(meta, replace(opts, wavelengths=(450.0, 560.0, 650.0))) == \
        "--wavelengths 450,560,650 differs from the store's (450,550,650)"
    assert _options_differ(meta, replace(opts, wavelengths=(None, 550.0, 650.0))) == \
        "--wavelengths none,550,650 differs from the store's (450,550,650)"


def test_band_centres_without_a_centre_are_compared_by_position():
    """A rerun compares the source's band centres with the store's band by band: a band without a centre (None,
    null in the store) matches only one without, the others within 1e-6 nm; the reason shows each span and how
    many bands have none."""
    from hsgds.preprocess.convert_many import _nm_range, _same_wavelengths

    assert _same_wavelengths([None, 500.0, 600.0], [None, 500.0000001, 600.0])
    assert not _same_wavelengths([None, 500.0, 600.0], [500.0, None, 600.0])
    assert not _same_wavelengths([None, 500.0, 600.0], [450.0, 500.0, 600.0])
    assert not _same_wavelengths([None, 500.0, 600.0], None)
    assert _nm_range([None, 600.0, None, 500.0]) == "500-600 nm (2 bands without a centre)"


def test_a_wavelengths_column_gives_each_scene_its_band_centres(cluster, tmp_path, run_cli):
    """Two sensors' .npy scenes (5 and 7 bands), each with its wavelengths file: converted with them, and one
    loader then takes both by wavelength."""
    nm = {"five": [450.0, 500.0, 550.0, 600.0, 650.0], "seven": [440.0, 470.0, 500.0, 530.0, 560.0, 590.0, 650.0]}
    rows = ["source,wavelengths"]
    for name, centres in nm.items():
        cube, _ = make_scene(24, 20, len(centres), classes=2, seed=len(centres))
        np.save(tmp_path / f"{name}.npy", cube)
        (tmp_path / f"{name}.txt").write_text("\n".join(f"{c:g}" for c in centres) + "\n")
        rows.append(f"{name}.npy,{name}.txt")
    (tmp_path / "scenes.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    code, _, err = run_cli("convert-many", tmp_path / "scenes.csv", "-o", out, "--max-patch", "3", "--scheduler",
                           cluster.scheduler_address)
    assert code == 0, err
    for name, centres in nm.items():
        assert open_scene(out / f"{name}.zarr").wavelengths == centres
    with hsgds.PatchLoader(out, patch_size=3, batch_size=32, pixels="all", wavelengths=[500, 650], device="cpu",
                           shuffle=False) as loader:
        assert next(iter(loader))[0].shape[1] == 2
    # refused before any work: both forms at once, a bad file
    code, _, err = run_cli("convert-many", tmp_path / "scenes.csv", "-o", tmp_path / "o2", "--wavelengths", "400,500,600")
    assert code == 2 and "both by --wavelengths and by the wavelengths column" in err, err
    (tmp_path / "five.txt").write_text("450, 500, x\n")
    code, _, err = run_cli("convert-many", tmp_path / "scenes.csv", "-o", tmp_path / "o2")
    assert code == 2 and "line 2: wavelengths " in err and "'x' is not a number" in err, err
    assert not (tmp_path / "o2").exists()


def test_a_store_cast_by_dtype_is_up_to_date_only_with_that_dtype(tmp_path):
    """A store converted with --dtype holds another type than its source: a rerun with the same --dtype keeps
    it, one without (or with another) converts it again, saying why."""
    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    cube, labels = make_scene(24, 20, 4, classes=3, dtype="uint16", seed=3)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", labels)
    row = ManifestRow(name="c", source=tmp_path / "c.npy", labels=tmp_path / "g.npy")
    out = tmp_path / "out"
    out.mkdir()
    cast = ConvertOptions(max_patch=3, dtype="float32")
    assert convert_scene(row, out, cast).status == "converted"
    assert open_scene(out / "c.zarr").dtype == np.float32
    assert convert_scene(row, out, cast).status == "up to date"
    again = convert_scene(row, out, ConvertOptions(max_patch=3))
    assert (again.status, again.reason) == ("converted", "--dtype the source's uint16 differs from the store's (float32)")
    assert open_scene(out / "c.zarr").dtype == np.uint16
    assert convert_scene(row, out, ConvertOptions(max_patch=3)).status == "up to date"
    again = convert_scene(row, out, ConvertOptions(max_patch=3, dtype="int32"))
    assert (again.status, again.reason) == ("converted", "--dtype int32 differs from the store's (uint16)")


def test_a_store_written_as_v4_without_a_band_lacking_a_centre_is_kept(tmp_path, run_cli):
    """A store records the oldest format that describes it (read with zarr-python): v2 when every band has a
    centre. hsgds wrote such stores as v4 for a while: one opens and verifies, a rerun finds it up to date
    instead of converting it again for its version number (and keeps it v4), and collection.json lists it as
    the store's own v4 in a version 1 file, which opens; a freshly converted one stays v2 through reruns."""
    import zarr

    from hsgds.collection import write_collection
    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    cube, labels = make_scene(24, 20, 4, classes=3, dtype="int16", seed=12)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", labels)
    out = tmp_path / "out"
    out.mkdir()
    rows = [ManifestRow(name=name, source=tmp_path / "c.npy", labels=tmp_path / "g.npy") for name in ("old", "new")]
    opts = ConvertOptions(max_patch=3, wavelengths=(450.0, 550.0, 650.0, 750.0))
    assert [convert_scene(row, out, opts).status for row in rows] == ["converted"] * 2

    def version(name: str) -> int:
        return zarr.open_group(out / f"{name}.zarr", mode="r").attrs["hsgds"]["format_version"]

    assert (version("old"), version("new")) == (2, 2)
    doc = json.loads((out / "old.zarr" / "zarr.json").read_text())  # as that hsgds wrote it
    doc["attributes"]["hsgds"]["format_version"] = 4
    (out / "old.zarr" / "zarr.json").write_text(json.dumps(doc))
    assert open_scene(out / "old.zarr").verify() == []
    results = [convert_scene(row, out, opts) for row in rows]
    assert [(r.status, r.reason) for r in results] == [("up to date", None)] * 2
    assert (version("old"), version("new")) == (4, 2)
    write_collection(out, [r.entry for r in results])
    listing = json.loads((out / "collection.json").read_text())
    assert listing["format_version"] == 1 and [s["format_version"] for s in listing["scenes"]] == [4, 2]
    assert [s.meta.format_version for s in open_collection(out)] == [4, 2]
    code, text, err = run_cli("verify", out)
    assert code == 0 and text.startswith("ok: 2 scenes"), text + err


def test_a_store_lacking_the_sources_own_wavelengths_is_converted_again(tmp_path):
    """Without wavelengths given, a store holds its source's own band centres: one an older hsgds wrote
    without them (it read none from HDF5), or with the micrometres a header labelled as nanometres, is
    converted again, saying why; one that has them is up to date."""
    import h5py

    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    cube, _ = make_scene(24, 20, 4, classes=3, seed=3)
    with h5py.File(tmp_path / "c.nc", "w") as f:
        f["reflectance"] = cube
        f["wavelengths"] = np.array([450.0, 550.0, 650.0, 750.0])
    out = tmp_path / "out"
    out.mkdir()
    row, opts = ManifestRow(name="c", source=tmp_path / "c.nc"), ConvertOptions(max_patch=3)
    assert convert_scene(row, out, opts).status == "converted"
    assert convert_scene(row, out, opts).status == "up to date"
    for stored, had in ((None, "none"), ([0.45, 0.55, 0.65, 0.75], "0.45-0.75 nm")):  # as older versions wrote
        meta = json.loads((out / "c.zarr" / "zarr.json").read_text())
        meta["attributes"]["hsgds"]["wavelengths"] = stored
        (out / "c.zarr" / "zarr.json").write_text(json.dumps(meta))
        again = convert_scene(row, out, opts)
        assert (again.status, again.reason) == ("converted", f"band centres: the source records 450-750 nm, the "
                                                             f"store {had}")
        assert open_scene(out / "c.zarr").wavelengths == [450.0, 550.0, 650.0, 750.0]


def test_an_enmap_metadata_file_is_part_of_the_source_a_rerun_compares(tmp_path):
    """An EnMAP image's band centres come from its METADATA.XML, which the store's source record lists with the
    image: a rerun finds the scene up to date, converts it again when the metadata file's centres change (or it is
    gone), and a store written before hsgds read the file (no wavelengths, the image alone) is converted again."""
    from hsgds.preprocess.convert_many import ManifestRow, convert_scene
    from tests.sensors import ENMAP_L2A, enmap_xml, write_enmap

    cube, _ = make_scene(24, 20, 4, classes=3, seed=4)
    src = write_enmap(tmp_path, cube, enmap_xml(["418.4", "650.0", "1010.5", "2445.5"]))
    xml = tmp_path / f"{ENMAP_L2A}-METADATA.XML"
    out = tmp_path / "out"
    out.mkdir()
    row, opts = ManifestRow(name="e", source=src), ConvertOptions(max_patch=3)
    assert convert_scene(row, out, opts).status == "converted"
    assert open_scene(out / "e.zarr").meta.source["files"] == [src.name, xml.name]
    assert convert_scene(row, out, opts).status == "up to date"
    xml.write_text(enmap_xml(["418.4", "650.0", "1010.5", "2440.0"]))
    again = convert_scene(row, out, opts)
    assert (again.status, again.reason) == ("converted", "band centres: the source records 418.4-2440 nm, the store "
                                                         "418.4-2445.5 nm")
    assert open_scene(out / "e.zarr").wavelengths == [418.4, 650.0, 1010.5, 2440.0]
    meta = json.loads((out / "e.zarr" / "zarr.json").read_text())  # as an older hsgds wrote it
    meta["attributes"]["hsgds"]["wavelengths"] = None
    meta["attributes"]["hsgds"]["source"]["files"] = [src.name]
    (out / "e.zarr" / "zarr.json").write_text(json.dumps(meta))
    again = convert_scene(row, out, opts)
    assert (again.status, again.reason) == ("converted", "band centres: the source records 418.4-2440 nm, the store "
                                                         "none")
    xml.unlink()
    again = convert_scene(row, out, opts)
    assert (again.status, again.reason) == ("converted", "band centres: the source records none, the store "
                                                         "418.4-2440 nm")
    assert open_scene(out / "e.zarr").meta.source["files"] == [src.name]


def test_wavelengths_a_scene_cannot_record_come_back_as_its_warning(tmp_path):
    """A header's micrometres labelled as nanometres: the scene converts without wavelengths, and its result
    carries the one-line warning (shown by the command with the scene's name), pointing to the manifest's
    column, or to --wavelengths when that was given."""
    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    cube, _ = make_scene(24, 20, 4, classes=3, seed=3)
    src = write_envi(tmp_path / "e.hdr", cube, wavelengths=[0.4, 0.41, 0.42, 0.43])
    out = tmp_path / "out"
    out.mkdir()
    result = convert_scene(ManifestRow(name="e", source=src), out, ConvertOptions(max_patch=3))
    assert result.status == "converted"
    assert result.warnings == ("e.hdr: its wavelengths read as 0.4-0.43 nm (units Nanometers), outside "
                               "100-20000 nm; the store records no wavelengths (to match bands by wavelength, give "
                               "the band centres in nm with a wavelengths column in the manifest or fix the header)",)
    assert open_scene(out / "e.zarr").wavelengths is None
    given = ManifestRow(name="e", source=src, wavelengths=(400.0, 410.0, 420.0, 430.0))
    result = convert_scene(given, out, ConvertOptions(max_patch=3), force=True)
    assert result.warnings == () and open_scene(out / "e.zarr").wavelengths == [400.0, 410.0, 420.0, 430.0]


def _labelled_scene_row(tmp_path):
    """A small labelled scene saved as c.npy / g.npy, its manifest row (named c) and an empty output folder."""
    from hsgds.preprocess.convert_many import ManifestRow

    cube, labels = make_scene(24, 20, 4, classes=3, seed=3)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", labels)
    out = tmp_path / "out"
    out.mkdir()
    return cube, labels, ManifestRow(name="c", source=tmp_path / "c.npy", labels=tmp_path / "g.npy"), out


def test_a_store_with_damaged_statistics_is_converted_again_and_not_called_damaged_tiles(tmp_path):
    """verify() finds damage in the labels, samples and statistics too; the reason says how many problems,
    not "damaged tiles" (no tile is damaged here)."""
    from hsgds.preprocess.convert_many import convert_scene

    cube, labels, row, out = _labelled_scene_row(tmp_path)
    opts = ConvertOptions(max_patch=5, seed=1)
    assert convert_scene(row, out, opts).status == "converted"
    mean = next((out / "c.zarr" / "stats" / "all" / "mean").rglob("c/*"))  # its one chunk
    mean.write_bytes(mean.read_bytes()[:-8])  # one band short
    assert len(open_scene(out / "c.zarr").verify()) == 1
    again = convert_scene(row, out, opts)
    assert again.status == "converted" and again.reason.startswith("damaged: 1 problem (")
    assert "tiles" not in again.reason.split("(")[0]
    assert open_scene(out / "c.zarr").verify() == []


def test_another_key_or_band_axis_converts_the_scene_again(tmp_path):
    """Neither the key nor the band axis is recorded in the store: a rerun whose key column names another
    variable of the file, or whose --band-axis changed, compares the array it now opens with the store's, and
    converts the scene again instead of keeping the other array as up to date."""
    import dataclasses

    import h5py

    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    radiance, _ = make_scene(20, 16, 6, classes=2, seed=0)
    reflectance, _ = make_scene(20, 16, 4, classes=2, seed=1)
    with h5py.File(tmp_path / "line.h5", "w") as f:
        f["radiance"], f["reflectance"] = radiance, reflectance
    np.save(tmp_path / "c.npy", radiance)
    out = tmp_path / "out"
    out.mkdir()
    opts = ConvertOptions(max_patch=5)
    row = ManifestRow(name="line", source=tmp_path / "line.h5", key="radiance")
    assert convert_scene(row, out, opts).status == "converted"
    assert convert_scene(row, out, opts).status == "up to date"
    again = convert_scene(dataclasses.replace(row, key="reflectance"), out, opts)
    assert (again.status, again.reason) == ("converted", "the source (key reflectance) is 20x16x4 int16, the "
                                                         "store's 20x16x6 int16")
    np.testing.assert_array_equal(open_scene(out / "line.zarr").read(0, 20, 0, 16), reflectance)
    gone = convert_scene(dataclasses.replace(row, key="irradiance"), out, opts)
    assert gone.status == "failed" and "irradiance" in gone.reason  # not "up to date"
    row = ManifestRow(name="c", source=tmp_path / "c.npy")
    assert convert_scene(row, out, opts).status == "converted"
    again = convert_scene(row, out, dataclasses.replace(opts, band_axis="first"))
    assert (again.status, again.reason) == ("converted", "the source (band axis first) is 16x6x20 int16, the "
                                                         "store's 20x16x6 int16")
    assert open_scene(out / "c.zarr").shape == (16, 6, 20)


def test_a_band_axis_changed_over_a_cube_of_the_same_shape_either_way_converts_it_again(tmp_path):
    """A cube whose width equals its band count opens as the same shape with its bands last or in the middle:
    the shape compared alike, a rerun with the band axis changed kept the store, holding the other layout, as
    up to date. The store records the band axis it was read with, and the rerun compares it."""
    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    cube = np.random.default_rng(0).integers(0, 1000, (24, 16, 16)).astype(np.int16)
    np.save(tmp_path / "c.npy", cube)
    out = tmp_path / "out"
    out.mkdir()
    opts = ConvertOptions(max_patch=3)
    assert convert_scene(ManifestRow(name="c", source=tmp_path / "c.npy"), out, opts).status == "converted"
    row = ManifestRow(name="c", source=tmp_path / "c.npy", band_axis="middle", line=2, manifest=Path("m.csv"))
    again = convert_scene(row, out, opts)
    assert (again.status, again.reason) == (
        "converted", "the band_axis column of manifest m.csv line 2 middle differs from the store's (last)")
    np.testing.assert_array_equal(open_scene(out / "c.zarr").read(0, 24, 0, 16), cube.transpose(0, 2, 1))
    assert convert_scene(row, out, opts).status == "up to date"
    back = convert_scene(ManifestRow(name="c", source=tmp_path / "c.npy", line=2, manifest=Path("m.csv")), out, opts)
    assert (back.status, back.reason) == (  # (a cell left empty is named as the column all the same)
        "converted", "the band_axis column of manifest m.csv line 2 last differs from the store's (middle)")
    np.testing.assert_array_equal(open_scene(out / "c.zarr").read(0, 24, 0, 16), cube)


def test_a_band_axis_column_converts_prisma_beside_geotiff_scenes(tmp_path):
    """A PRISMA cube is (rows, bands, columns) and needs --band-axis middle, which a GeoTIFF refuses: as a global
    option no manifest could hold both. The band_axis column gives it to the PRISMA row alone; each store holds
    its source's (H, W, B) cube (compared with numpy)."""
    from hsgds.preprocess.convert_many import convert_scene, read_manifest
    from tests.sensors import PRISMA_VNIR, enmap_xml, write_enmap, write_prisma

    prisma, _ = make_scene(14, 12, 5, classes=2, dtype="uint16", seed=3)
    swir, _ = make_scene(14, 12, 3, classes=2, dtype="uint16", seed=4)
    src = write_prisma(tmp_path / "PRS_L2D_STD_0002.he5", prisma, swir, [800.0, 700.0, 600.0, 500.0, 450.0],
                       [2400.0, 2000.0, 1500.0])
    enmap, _ = make_scene(10, 9, 4, classes=2, dtype="int16", seed=5)
    enmap_src = write_enmap(tmp_path, enmap, enmap_xml(["450", "550", "650", "850"]))
    (tmp_path / "scenes.csv").write_text(f"source,name,key,band_axis\n{src.name},p,{PRISMA_VNIR},Middle\n"
                                         f"{enmap_src.name},e,,\n")
    rows = read_manifest(tmp_path / "scenes.csv")
    assert [r.band_axis for r in rows] == ["middle", None]
    out = tmp_path / "out"
    out.mkdir()
    opts = ConvertOptions(max_patch=3)
    assert [convert_scene(r, out, opts).status for r in rows] == ["converted"] * 2
    for name, cube in (("p", prisma), ("e", enmap)):
        h, w, _ = cube.shape
        np.testing.assert_array_equal(open_scene(out / f"{name}.zarr").read(0, h, 0, w), cube)
    assert [convert_scene(r, out, opts).status for r in rows] == ["up to date"] * 2


def test_a_deleted_or_damaged_store_is_named_when_converted_again(cluster, tmp_path, run_cli):
    """Every store a rerun replaces gets a line saying why: one deleted since the last run too (a new scene
    gets none), and a damaged one's problem is quoted cut at a word, never mid-word."""
    import shutil

    make_sources(tmp_path, n=3)
    out = tmp_path / "out"
    args = ("convert-many", tmp_path / "scenes.csv", "-o", out, "--max-patch", "5", "--class-names",
            ",".join(CLASSES), "--scheduler", cluster.scheduler_address)
    code, stdout, stderr = run_cli(*args)
    assert code == 0 and "re-converted" not in stdout, (stdout, stderr)  # new scenes: nothing to explain
    shutil.rmtree(out / "flight_1.zarr")
    tile = open_scene(out / "cube2.zarr").tile_paths[0]
    raw = bytearray(tile.read_bytes())
    raw[100] ^= 0xFF
    tile.write_bytes(bytes(raw))
    problem = open_scene(out / "cube2.zarr").verify()[0]
    assert len(problem) > 120  # quoting it whole would make the line too long: it is cut
    code, stdout, stderr = run_cli(*args)
    assert code == 0 and "2 converted" in stdout, (stdout, stderr)
    lines = sorted(line for line in stdout.splitlines() if "re-converted" in line)
    assert lines[1] == "flight_1: re-converted: its store was missing", lines
    head = "cube2: re-converted: damaged: 1 problem ("
    assert lines[0].startswith(head) and lines[0].endswith(" ...)"), lines
    quoted = lines[0][len(head):-len(" ...)")]
    assert problem.startswith(quoted) and problem[len(quoted)] == " ", (quoted, problem)  # cut at a word


def test_wavelengths_from_the_manifest_are_named_as_its_column(cluster, tmp_path, run_cli):
    """Wavelengths given by the manifest's wavelengths column, not --wavelengths: every message about them
    names the column and the file, not an option the user never passed."""
    cube, _ = make_scene(20, 18, 4, classes=2, seed=1)
    np.save(tmp_path / "s0.npy", cube)
    envi = write_envi(tmp_path / "e60", cube, wavelengths=[600.0, 610.0, 620.0, 630.0])
    (tmp_path / "wl.txt").write_text("400\n410\n420\n430\n")
    (tmp_path / "scenes.csv").write_text("source,wavelengths\ns0.npy,wl.txt\n")
    out = tmp_path / "out"
    args = ("convert-many", tmp_path / "scenes.csv", "-o", out, "--max-patch", "3", "--scheduler",
            cluster.scheduler_address)
    code, _, stderr = run_cli(*args)
    assert code == 0, stderr
    (tmp_path / "wl.txt").write_text("500\n510\n520\n530\n")
    code, stdout, stderr = run_cli(*args)
    assert code == 0, stderr
    assert [line for line in stdout.splitlines() if "re-converted" in line] == [
        "s0: re-converted: the manifest's wavelengths column (wl.txt) 500,510,520,530 differs from the store's "
        "(400,410,420,430)"]
    (tmp_path / "scenes.csv").write_text(f"source,wavelengths\ns0.npy,wl.txt\n{envi.name},wl.txt\n")
    code, _, stderr = run_cli(*args)
    assert code == 1
    assert [line for line in stderr.splitlines() if line.startswith("hsgds: failed: ")] == [
        "hsgds: failed: e60: e60.hdr records its own wavelengths (600-630 nm), which the manifest's wavelengths "
        "column (wl.txt) contradicts; leave this scene's cell empty"]
    (tmp_path / "um.txt").write_text("0.4 0.41 0.42 0.43\n")  # micrometres: refused before any work
    (tmp_path / "scenes.csv").write_text("source,wavelengths\ns0.npy,um.txt\n")
    code, _, stderr = run_cli(*args)
    assert code == 2 and stderr.startswith(f"hsgds: error: manifest {tmp_path / 'scenes.csv'} line 2: the manifest's "
                                           "wavelengths column (um.txt) must be band centres in nm"), stderr
    assert "--wavelengths" not in stderr


def test_manifest_columns_are_named_as_columns_not_options(cluster, tmp_path, run_cli):
    """A key, labels_key, band_axis or nodata a manifest row gives is named in a scene's failure as its column and
    row, not as --key, --band-axis, ... (which the user never passed: "drop --key" fixed nothing); a key or band
    axis that neither gives is suggested as the column too (a global one would reach every scene), and one that
    the global option gave is named as the option, as `hsgds convert` names its own."""
    import h5py
    import tifffile

    cube, labels = make_scene(12, 10, 3, classes=2, dtype="int16", seed=2)
    tifffile.imwrite(tmp_path / "g.tif", cube, photometric="minisblack", planarconfig="contig")
    np.save(tmp_path / "gt.npy", labels)
    np.save(tmp_path / "bhw.npy", cube.transpose(2, 0, 1))  # (B, H, W), read as (H, W, B) without a band axis
    np.save(tmp_path / "zeros.npy", np.zeros_like(cube))
    with h5py.File(tmp_path / "two.h5", "w") as f:
        f["a"], f["b"] = cube, cube
    manifest = tmp_path / "scenes.csv"
    manifest.write_text("source,labels,name,key,labels_key,band_axis,nodata\n"
                        "g.tif,,g_key,radiance,,,\n"
                        "g.tif,,g_axis,,,first,\n"
                        "two.h5,,two,,,,\n"
                        "bhw.npy,gt.npy,bhw,,,,\n"
                        "g.tif,gt.npy,gt_key,,gt,,\n"
                        "zeros.npy,,zeros,,,,0\n")
    args = ("convert-many", manifest, "-o", tmp_path / "out", "--max-patch", "3", "--scheduler",
            cluster.scheduler_address)
    code, _, stderr = run_cli(*args)
    assert code == 1, stderr
    failed = sorted(line for line in stderr.splitlines() if line.startswith("hsgds: failed: "))
    row = f"manifest {manifest} line"
    assert failed == sorted([
        f"hsgds: failed: g_key: the key column of {row} 2 selects a variable in .mat or HDF5 files; g.tif is "
        "GeoTIFF/TIFF, leave this scene's cell empty",
        f"hsgds: failed: g_axis: the band_axis column of {row} 3 applies to .npy, HDF5 and .mat arrays; g.tif is "
        "GeoTIFF/TIFF, whose band layout is recorded in the file, leave this scene's cell empty",
        "hsgds: failed: two: two.h5 holds several 3-D arrays (a (12, 10, 3), b (12, 10, 3)); choose one with the "
        f"key column of {row} 4",
        "hsgds: failed: bhw: labels gt.npy have shape (12, 10), but the cube is 3x12; if the cube's bands are its "
        f"first axis, set the band_axis column of {row} 5 to first",
        f"hsgds: failed: gt_key: the labels_key column of {row} 6 selects a variable in .mat or HDF5 files; gt.npy "
        "is NumPy .npy, leave this scene's cell empty",
        "hsgds: failed: zeros: every pixel of zeros.npy is nodata (all bands 0); check the nodata value (set the "
        f"nodata column of {row} 7 to VALUE, or none to convert every pixel)"]), stderr
    # given by the global option, the option is named (as `hsgds convert` names its own)
    manifest.write_text("source\ng.tif\n")
    code, _, stderr = run_cli(*args, "--band-axis", "first")
    assert code == 1 and "hsgds: failed: g: --band-axis applies to .npy, HDF5 and .mat arrays; g.tif is GeoTIFF/TIFF, " \
        "whose band layout is recorded in the file, drop --band-axis" in stderr, stderr
    code, _, stderr = run_cli("convert", tmp_path / "g.tif", "-o", tmp_path / "g.zarr", "--key", "radiance")
    assert code == 2 and stderr == ("hsgds: error: --key selects a variable in .mat or HDF5 files; g.tif is "
                                    "GeoTIFF/TIFF, drop --key\n"), stderr


@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT to a process group")
@pytest.mark.timeout(300)
def test_ctrl_c_exits_130_and_the_same_command_finishes(tmp_path):
    """A real SIGINT to the command's process group (what Ctrl-C in a terminal sends) while the big scene is
    being written: exit 130, not 1 ("some scenes failed"), with one line saying to run it again; which
    then finishes."""
    arrays = make_sources(tmp_path, n=2, big=True)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "hsgds.cli", "convert-many", str(tmp_path / "scenes.csv"), "-o", str(out),
               "--workers", "1", "--max-patch", "5", "--class-names", ",".join(CLASSES)]
    # SIGINT as a terminal's command has it: a test run in the background (CI) inherits it ignored
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    caught, deadline = False, time.monotonic() + 120
    while not caught and time.monotonic() < deadline and proc.poll() is None:
        tmps = list(out.glob(".big.zarr.tmp-*")) if out.is_dir() else []
        caught = any(any((t / "tiles").rglob("*")) for t in tmps if (t / "tiles").is_dir())
        time.sleep(0.01)
    if caught:
        os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert caught, "the big scene was never seen in the middle of its conversion"
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == ("hsgds: interrupted; run the same command again to finish (the "
                                               "scenes converted so far are kept)"), stderr
    assert "Aborted" not in stderr and "Traceback" not in stderr, stderr
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    check_collection(out, arrays, tmp_path)


def test_a_scenes_warnings_are_shown_by_the_command_with_its_name(cluster, tmp_path, run_cli):
    """What a conversion warns of on a worker (labelled pixels without data) is not printed there, where the
    user does not see it (a worker's stderr, or another machine's), but by the command, one line naming the
    scene, as `hsgds convert` shows it; an up-to-date scene says nothing again."""
    cube, labels = make_scene(24, 20, 4, classes=3, seed=5)
    cube[:, :6] = -9999  # a strip without data, with labelled pixels on it
    labels[:, :6] = 1
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    (tmp_path / "m.csv").write_text("source,labels,name,nodata\nc.npy,gt.npy,strip,-9999\n")
    args = ("convert-many", tmp_path / "m.csv", "-o", tmp_path / "out", "--max-patch", "3",
            "--scheduler", cluster.scheduler_address)
    code, _, stderr = run_cli(*args)
    assert code == 0, stderr
    assert f"hsgds: warning: strip: {24 * 6} labelled pixels of gt.npy are nodata in c.npy (all bands -9999): they are " \
           "left out of the store's labels and samples" in stderr.splitlines()
    code, _, stderr = run_cli(*args)
    assert code == 0 and "warning" not in stderr, stderr


def test_a_readers_warning_on_a_worker_is_shown_by_the_command(tmp_path):
    """A source reader's warning (a GeoTIFF's user-defined CRS without rasterio) fired on a worker process was
    re-issued there, as Python's two lines on the worker's stderr; it comes back with the scene, and the
    command shows it as one line naming the scene, as it shows the converter's own."""
    from tests.preprocess.test_convert import _user_crs_tiff

    _user_crs_tiff(tmp_path / "c.tif")
    (tmp_path / "m.csv").write_text("source,name\nc.tif,albers\n")
    (tmp_path / "no_geo" / "rasterio").mkdir(parents=True)  # as if hsgds[geo] were not installed, on every process
    (tmp_path / "no_geo" / "rasterio" / "__init__.py").write_text("raise ImportError('rasterio is not installed')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "no_geo"), *sys.path[1:]])}
    done = subprocess.run([sys.executable, "-m", "hsgds.cli", "convert-many", str(tmp_path / "m.csv"), "-o",
                           str(tmp_path / "out"), "--max-patch", "3", "--workers", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "user-defined coordinate reference system" in line]
    assert warned == ["hsgds: warning: albers: c.tif has a user-defined coordinate reference system; recording it "
                      'needs rasterio (pip install "hsgds[geo]"), so the store keeps its transform only'], done.stderr
    assert "Warning" not in done.stderr, done.stderr


def _later(path: Path) -> None:
    """Move ``path``'s modification time a second on, as an edit does on any file system's clock."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_envi_labels_changed_in_the_file_not_given_are_converted_again(tmp_path):
    """--labels gt.hdr whose gt.img alone changed (new classes, same size), and --labels gt.img whose gt.hdr
    alone changed (a data ignore value): the labels are new, so a rerun given the last run's stamps converts
    the scene again and the store holds the new labels (read back with zarr-python). Before, the record and
    the stamps covered the file given alone, and the store was kept with the old labels."""
    import zarr

    from hsgds.preprocess.convert_many import ManifestRow, convert_scene
    from tests.envi import write_envi_labels

    cube, labels = make_scene(24, 20, 4, classes=3, seed=5)
    np.save(tmp_path / "c.npy", cube)
    hdr = write_envi_labels(tmp_path / "gt.hdr", labels)
    img = tmp_path / "gt.img"
    out = tmp_path / "out"
    out.mkdir()
    opts = ConvertOptions(max_patch=3)
    for given in (hdr, img):
        row = ManifestRow(name="c", source=tmp_path / "c.npy", labels=given)
        first = convert_scene(row, out, opts, force=True)
        assert first.status == "converted" and first.entry is not None
        assert convert_scene(row, out, opts, first.entry.stamps).status == "up to date"
        if given == hdr:  # classes 1 and 2 swapped in the binary: the same bytes count
            new = np.where(labels == 1, 2, np.where(labels == 2, 1, labels)).astype(np.uint8)
            img.write_bytes(new.tobytes())
            _later(img)
        else:  # the binary as it was, read with class 3 as ENVI's "no data": unlabelled
            write_envi_labels(hdr, labels, ("data ignore value = 3",))
            new = np.where(labels == 3, 0, labels)
            _later(hdr)
        again = convert_scene(row, out, opts, first.entry.stamps)
        assert (again.status, again.reason) == ("converted", "labels changed (sha256)"), given.name
        np.testing.assert_array_equal(zarr.open_group(out / "c.zarr", mode="r")["labels"][...], new)
        assert convert_scene(row, out, opts, again.entry.stamps).status == "up to date"
        write_envi_labels(hdr, labels)  # as at first, for the next case


def test_a_mask_split_is_made_again_when_a_mask_changed_or_another_is_given(tmp_path):
    """--split masks: the store records each mask's name and sha256 (read with zarr-python, hashlib as the
    reference). A rerun whose --train-mask file was edited since (same name, same size) or names another file
    converts the scene again, saying why, and the new split is the new mask's; before, a rerun compared only
    the method and the seed and kept the old split."""
    import zarr

    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    cube, labels = make_scene(24, 20, 4, classes=3, seed=7, labelled_fraction=1.0)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", labels)
    left = np.zeros(labels.shape, bool)
    left[:, :10] = True
    np.save(tmp_path / "tm.npy", left)
    np.save(tmp_path / "te.npy", ~left)
    row = ManifestRow(name="c", source=tmp_path / "c.npy", labels=tmp_path / "g.npy")
    out = tmp_path / "out"
    out.mkdir()

    def opts(train_mask: str = "tm.npy") -> ConvertOptions:
        return ConvertOptions(max_patch=3, split="masks", train_mask=tmp_path / train_mask,
                              test_mask=tmp_path / "te.npy")

    def train_pixels() -> int:
        return int(np.count_nonzero(zarr.open_array(out / "c.zarr" / "samples" / "split", mode="r")[:] == 1))

    assert convert_scene(row, out, opts()).status == "converted"
    split = zarr.open_group(out / "c.zarr", mode="r").attrs["hsgds"]["split"]
    assert split["train_mask"] == "tm.npy" and split["train_mask_sha256"] == sha256(tmp_path / "tm.npy")
    assert split["test_mask_sha256"] == sha256(tmp_path / "te.npy") and "val_mask" not in split
    assert train_pixels() == np.count_nonzero(left & (labels > 0))
    assert convert_scene(row, out, opts()).status == "up to date"
    top = np.zeros(labels.shape, bool)
    top[:8, :10] = True  # the same file, as many bytes
    np.save(tmp_path / "tm.npy", top)
    again = convert_scene(row, out, opts())
    assert (again.status, again.reason) == ("converted", "--train-mask tm.npy changed (sha256)")
    assert train_pixels() == np.count_nonzero(top & (labels > 0))
    assert convert_scene(row, out, opts()).status == "up to date"
    np.save(tmp_path / "tm2.npy", top)
    again = convert_scene(row, out, opts("tm2.npy"))
    assert (again.status, again.reason) == ("converted", "--train-mask tm2.npy differs from the store's (tm.npy)")
    # a store written before the sha256s were recorded: its names alone are compared, and it stays up to date
    doc = json.loads((out / "c.zarr" / "zarr.json").read_text())
    for record in ("split", "converted_split"):
        for key in ("train_mask_sha256", "test_mask_sha256"):
            del doc["attributes"]["hsgds"][record][key]
    (out / "c.zarr" / "zarr.json").write_text(json.dumps(doc))
    np.save(tmp_path / "tm2.npy", left)
    assert convert_scene(row, out, opts("tm2.npy")).status == "up to date"


def test_a_store_recording_only_the_given_label_file_is_converted_once_more(tmp_path):
    """A store written before labels_source listed its files records the given file alone: for ENVI labels
    the binary (or header) beside it was never compared, so a rerun converts the scene once more, saying
    why, and keeps it from then on; a one-file label map (.npy) stays up to date, its record as it was."""
    from hsgds.preprocess.convert_many import ManifestRow, convert_scene
    from tests.envi import write_envi_labels

    cube, labels = make_scene(24, 20, 4, classes=3, seed=6)
    np.save(tmp_path / "c.npy", cube)
    np.save(tmp_path / "g.npy", labels)
    hdr = write_envi_labels(tmp_path / "gt.hdr", labels)
    out = tmp_path / "out"
    out.mkdir()
    opts = ConvertOptions(max_patch=3)
    for name, given, outcome in (("e", hdr, ("converted", "labels gt.img, gt.hdr: the store, written by an older "
                                              "hsgds, records gt.hdr alone")),
                                 ("n", tmp_path / "g.npy", ("up to date", None))):
        row = ManifestRow(name=name, source=tmp_path / "c.npy", labels=given)
        assert convert_scene(row, out, opts).status == "converted"
        store = out / f"{name}.zarr"
        doc = json.loads((store / "zarr.json").read_text())
        # the record as hsgds wrote it then: the given file's name, size and sha256
        doc["attributes"]["hsgds"]["labels_source"] = {"name": given.name, "size": given.stat().st_size,
                                                       "sha256": sha256(given)}
        (store / "zarr.json").write_text(json.dumps(doc))
        again = convert_scene(row, out, opts)
        assert (again.status, again.reason) == outcome
        assert convert_scene(row, out, opts).status == "up to date"


def test_a_prisma_scene_with_unused_bands_joins_a_collection_by_wavelength(tmp_path, run_cli):
    """A PRISMA VNIR cube whose first three bands are unused (flag 0, centre 0, all zeros, as in every real
    product) beside an EnMAP image with a centre for every band: the PRISMA store (read with zarr-python) and
    collection.json hold null at the unused bands and the file's centres elsewhere; a loader over the collection
    by wavelengths=[...] takes each scene's nearest band among those with a centre (a numpy reference leaving the
    unused bands out) and its patches are the numpy cuts; a wavelength near no used band is a miss naming the
    nearest used one; z-scored alone, the unused bands read 0; `hsgds info` spans the centres there are; and a
    rerun finds both stores up to date (one an older hsgds wrote without centres is converted again)."""
    import zarr

    from hsgds.collection import write_collection
    from hsgds.errors import ConfigError
    from hsgds.preprocess.convert_many import ManifestRow, convert_scene
    from tests.sensors import PRISMA_VNIR, enmap_xml, write_enmap, write_prisma

    prisma, labels = make_scene(26, 22, 8, classes=3, dtype="uint16", seed=8, labelled_fraction=1.0)
    prisma[..., :3] = 0  # the unused bands hold nothing
    swir, _ = make_scene(26, 22, 4, classes=3, dtype="uint16", seed=9)
    cw = [0.0, 0.0, 0.0, 760.0, 650.5, 560.25, 480.0, 410.0]  # descending, as PRISMA lists them
    flags = [0, 0, 0, 1, 1, 1, 1, 1]
    np.save(tmp_path / "gt.npy", labels)
    src = write_prisma(tmp_path / "PRS_L2D_STD_0001.he5", prisma, swir, cw, [2400.0, 2000.0, 1500.0, 1000.0],
                       flags_vnir=flags)
    enmap, _ = make_scene(24, 20, 6, classes=3, dtype="int16", seed=10)
    enmap_nm = [418.4, 484.0, 556.5, 655.0, 880.0, 1010.5]
    enmap_src = write_enmap(tmp_path, enmap, enmap_xml([f"{w:g}" for w in enmap_nm]))
    out = tmp_path / "out"
    out.mkdir()
    rows = {"p": (ManifestRow(name="p", source=src, labels=tmp_path / "gt.npy", key=PRISMA_VNIR),
                  ConvertOptions(max_patch=3, band_axis="middle", dtype="float32")),
            "e": (ManifestRow(name="e", source=enmap_src), ConvertOptions(max_patch=3, dtype="float32"))}
    results = [convert_scene(row, out, opts) for row, opts in rows.values()]
    assert [(r.status, r.warnings) for r in results] == [("converted", ())] * 2
    write_collection(out, [r.entry for r in results])

    # as the file lists them (float32), null where a band has no centre
    expected = [None if not f else float(np.float32(w)) for w, f in zip(cw, flags)]
    assert zarr.open_group(out / "p.zarr", mode="r").attrs["hsgds"]["wavelengths"] == expected
    listing = json.loads((out / "collection.json").read_text())
    assert [s["wavelengths"] for s in listing["scenes"]] == [expected, enmap_nm]
    # the oldest versions that describe them: the PRISMA store v4 (a band without a centre), the EnMAP store v2,
    # and collection.json version 2 (an entry holds a null), which an hsgds reading version 1 refuses by version
    assert [s["format_version"] for s in listing["scenes"]] == [4, 2] and listing["format_version"] == 2

    want = [482, 558, 653]
    known = np.where(np.asarray(flags) == 1, np.asarray(cw, np.float32).astype(np.float64), np.nan)
    picked = [[int(np.nanargmin(np.abs(known - w))) for w in want], [int(np.argmin(np.abs(np.subtract(enmap_nm, w))))
                                                                     for w in want]]
    assert picked == [[6, 5, 4], [1, 2, 3]]
    with hsgds.PatchLoader(out, patch_size=3, batch_size=64, pixels="all", wavelengths=want, normalize=None,
                           shuffle=False, return_coords=True, device="cpu") as loader:
        batches = [(p.numpy(), c.numpy()) for p, _, c in loader]
    got, coords = np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])
    assert len(got) == 26 * 22 + 24 * 20
    for s, (cube, idx) in enumerate(zip((prisma, enmap), picked)):
        rows_s = coords[:, 0] == s
        padded = np.pad(cube.astype(np.float64), ((1, 1), (1, 1), (0, 0)), mode="reflect")
        ref = np.stack([padded[y:y + 3, x:x + 3][..., idx] for y, x in coords[rows_s, 1:]])
        np.testing.assert_array_equal(got[rows_s], ref.transpose(0, 3, 1, 2))
    with pytest.raises(ConfigError, match=r"^scene 'p' has no band within 5 nm of 900 nm \(nearest: 760 nm\); "
                                          r"raise wavelength_tolerance or drop that wavelength \(2 of 2 scenes lack "
                                          r"a band within 5 nm of one; wavelength_tolerance=140 gives each scene a "
                                          r"band near every one\)$"):  # 900 nm: 760 (used) in p, 880 in e
        hsgds.PatchLoader(out, patch_size=3, batch_size=8, pixels="all", wavelengths=[482, 900], device="cpu")

    # one PRISMA scene for training: its unused bands are constant, so z-scored they read 0, not NaN
    scene = open_scene(out / "p.zarr")
    y, x, _ = scene.samples("train")
    train = prisma[y, x].astype(np.float64)
    with hsgds.PatchLoader(out / "p.zarr", patch_size=3, batch_size=64, split="train", shuffle=False,
                           return_coords=True, device="cpu") as loader:
        batches = [(p.numpy(), c.numpy()) for p, _, c in loader]
    got, coords = np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])
    padded = np.pad(prisma.astype(np.float64), ((1, 1), (1, 1), (0, 0)), mode="reflect")
    std = train.std(0)
    ref = (np.stack([padded[y:y + 3, x:x + 3] for y, x in coords]) - train.mean(0)) / np.where(std > 0, std, 1)
    assert (std[:3] == 0).all() and not np.any(got[:, :3]) and np.isfinite(got).all()
    np.testing.assert_allclose(got, ref.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)

    code, text, err = run_cli("info", out)
    assert code == 0 and "spectrum:   410.0-1010.5 nm\n" in text, text + err
    code, text, err = run_cli("info", out / "p.zarr")
    assert code == 0 and "bands:      410.0-760.0 nm (descending); bands 0, 1, 2 have no centre (unused)\n" in text

    assert [convert_scene(row, out, opts).status for row, opts in rows.values()] == ["up to date"] * 2
    meta = json.loads((out / "p.zarr" / "zarr.json").read_text())  # as an older hsgds wrote it: no centres, v3
    meta["attributes"]["hsgds"].update(wavelengths=None, format_version=3)
    (out / "p.zarr" / "zarr.json").write_text(json.dumps(meta))
    again = convert_scene(rows["p"][0], out, rows["p"][1])
    assert (again.status, again.reason) == ("converted", "band centres: the source records 410-760 nm (3 bands "
                                                         "without a centre), the store none")
    assert open_scene(out / "p.zarr").wavelengths == expected


def test_a_store_replaced_by_another_source_of_the_same_name_and_size_is_converted_again(cluster, tmp_path):
    """The listing's stamps say the manifest's source is unchanged since the store it listed was made; a store
    replaced since by a conversion of another file of the same name and size (another folder's version of the
    scene) was kept as up to date, its sha256 never compared, and listed holding other data than its source."""
    import dataclasses

    from hsgds.preprocess.convert import convert

    arrays = make_sources(tmp_path, n=2)
    out = tmp_path / "out"
    convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    (tmp_path / "old").mkdir()
    cube, labels = arrays["cube0"]
    np.save(tmp_path / "old/cube0.npy", cube[::-1])  # same name, same size, other values
    assert (tmp_path / "old/cube0.npy").stat().st_size == (tmp_path / "data/cube0.npy").stat().st_size
    convert(tmp_path / "old/cube0.npy", out / "cube0.zarr",
            dataclasses.replace(OPTS, labels=tmp_path / "data/gt0.npy", overwrite=True))
    again = convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    assert {r.name: (r.status, r.reason) for r in again.scenes} == {
        "cube0": ("converted", "source changed (sha256)"), "flight_1": ("up to date", None)}
    check_collection(out, arrays, tmp_path)  # the store holds its source again, and is listed with its sha256


def test_a_scene_removed_from_the_manifest_is_unlisted_and_its_store_left_as_it_was(cluster, tmp_path):
    """As the README says: the rerun lists the manifest's scenes only; the removed scene's store is neither
    deleted nor touched."""
    arrays = make_sources(tmp_path, n=2)
    out = tmp_path / "out"
    convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    kept = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "flight_1.zarr").rglob("*")}
    lines = (tmp_path / "scenes.csv").read_text().splitlines()
    (tmp_path / "scenes.csv").write_text("\n".join(line for line in lines if "flight_1" not in line) + "\n")
    again = convert_many(tmp_path / "scenes.csv", out, OPTS, scheduler=cluster.scheduler_address)
    assert [(r.name, r.status) for r in again.scenes] == [("cube0", "up to date")]
    assert open_collection(out).names == ["cube0"]
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "flight_1.zarr").rglob("*")} == kept
    assert open_scene(out / "flight_1.zarr").verify() == []
    cube = arrays["flight_1"][0]
    np.testing.assert_array_equal(open_scene(out / "flight_1.zarr").read(0, cube.shape[0], 0, cube.shape[1]), cube)


def test_a_replaced_stores_old_copy_left_by_a_killed_worker_is_removed_by_the_rerun(tmp_path):
    """A worker killed while it deleted the store it had just replaced (`.NAME.zarr.old-XXXX`, the new store
    in place) left that hidden, partly deleted copy for ever: every rerun kept it. With the store in place it is
    garbage and goes; with the store missing it is the documented recovery and stays."""
    import shutil

    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    cube, _ = make_scene(24, 20, 4, classes=3, seed=3)
    np.save(tmp_path / "c.npy", cube)
    row = ManifestRow(name="c", source=tmp_path / "c.npy")
    out = tmp_path / "out"
    out.mkdir()
    opts = ConvertOptions(max_patch=3)
    assert convert_scene(row, out, opts).status == "converted"
    old = out / ".c.zarr.old-0badf00d"
    shutil.copytree(out / "c.zarr", old)
    open_scene(old).tile_paths[0].unlink()  # rmtree stopped half way
    shutil.copytree(old, out / "spare")
    assert convert_scene(row, out, opts).status == "up to date"
    assert sorted(p.name for p in out.iterdir()) == ["c.zarr", "spare"]

    shutil.rmtree(out / "c.zarr")  # killed between the two renames: the old store is all there is
    (out / "spare").rename(old)
    assert convert_scene(row, out, opts).status == "converted"
    assert old.is_dir()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damage", ["truncated", "not utf-8", "empty", "deleted"])
def test_a_store_whose_root_metadata_is_lost_is_converted_again(tmp_path, damage):
    """A store whose root zarr.json no longer reads (cut short, overwritten, gone) does not verify: the rerun
    converts it again in its place, as it does a store with damaged tiles; it said "not an hsgds store; remove
    it yourself" on every rerun."""
    from hsgds.preprocess.convert_many import convert_scene

    cube, labels, row, out = _labelled_scene_row(tmp_path)
    opts = ConvertOptions(max_patch=3, seed=1)
    assert convert_scene(row, out, opts).status == "converted"
    root = out / "c.zarr" / "zarr.json"
    if damage == "deleted":
        root.unlink()
    else:
        text = root.read_bytes()
        root.write_bytes({"truncated": text[:len(text) // 2], "not utf-8": b"\xff\xfe" + text[2:],
                          "empty": b""}[damage])
    again = convert_scene(row, out, opts)
    assert again.status == "converted", again.reason
    assert again.reason.startswith("incomplete or damaged ("), again.reason
    assert sorted(p.name for p in out.iterdir()) == ["c.zarr"]  # no hidden copy left beside it
    scene = open_scene(out / "c.zarr")
    assert scene.verify() == []
    np.testing.assert_array_equal(scene.read(0, 24, 0, 20), cube)
    np.testing.assert_array_equal(scene.labels, labels)
    assert convert_scene(row, out, opts).status == "up to date"


@pytest.mark.parametrize("folder", ["no tiles", "other tiles", "other zarr group"])
def test_a_folder_that_is_not_a_store_is_never_replaced(tmp_path, folder):
    """Only a folder holding a store's tiles array (its dimension names) is taken for a store whose root
    metadata is lost: a folder of the scene's name without it, or whose zarr.json reads as another program's
    group, is left byte for byte as it was and the scene fails saying so."""
    from hsgds.preprocess.convert_many import ManifestRow, convert_scene

    cube, _ = make_scene(24, 20, 4, classes=3, seed=3)
    np.save(tmp_path / "c.npy", cube)
    row = ManifestRow(name="c", source=tmp_path / "c.npy")
    out = tmp_path / "out"
    out.mkdir()
    opts = ConvertOptions(max_patch=3)
    assert convert_scene(row, out, opts).status == "converted"
    store = out / "c.zarr"
    tiles = json.loads((store / "tiles" / "zarr.json").read_text())
    if folder == "no tiles":
        (store / "zarr.json").write_text('{"zarr_format": 3, "node_ty')
        for p in sorted(store.iterdir()):
            if p.name != "zarr.json":
                __import__("shutil").rmtree(p)
        (store / "notes.txt").write_text("mine")
    elif folder == "other tiles":
        (store / "zarr.json").write_text('{"zarr_format": 3, "node_ty')
        tiles["dimension_names"] = ["t", "y", "x", "c", "b"]
        (store / "tiles" / "zarr.json").write_text(json.dumps(tiles))
    else:
        (store / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    before = _files(store)
    result = convert_scene(row, out, opts)
    assert result.status == "failed"
    assert "exists and is not an hsgds store" in result.reason and "remove it yourself" in result.reason
    assert _files(store) == before
    assert sorted(p.name for p in out.iterdir()) == ["c.zarr"]
