"""``hsgds resplit``: same result as converting with the split, no source needed, atomic for readers."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import hsgds
from hsgds import format as fmt
from hsgds.errors import ChecksumError, InputError
from hsgds.preprocess.convert import ConvertOptions, convert
from hsgds.preprocess.resplit import resplit


def tree_digest(path: Path, skip=lambda rel: False) -> dict[str, str]:
    """sha256 of every file under ``path`` by relative name (an independent snapshot of the store)."""
    out = {}
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_file() and not skip(rel):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def split_state(store: Path) -> tuple:
    """What a reader sees: (split codes, train mean) -- read the way the loader reads them."""
    scene = hsgds.open_scene(store)
    codes = scene.sample_table()["split"].tobytes()
    train = scene.stats["train"]
    return hashlib.sha256(codes).hexdigest(), None if train is None else train.mean.tobytes()


@pytest.fixture
def ip_copy(indian_pines_store, tmp_path):
    """A private copy of the session's Indian Pines store (random 10% split), free to re-split."""
    dst = tmp_path / "ip.zarr"
    shutil.copytree(indian_pines_store, dst)
    return dst


def test_resplit_equals_converting_with_that_split(ip_copy, tmp_path, run_cli):
    from hsgds.datasets import INDIAN_PINES_CLASSES, indian_pines_files

    tiles_before = tree_digest(ip_copy / fmt.TILES)
    labels_before = tree_digest(ip_copy / fmt.LABELS)
    code, out, err = run_cli("resplit", ip_copy, "--split", "blocks", "--train", "0.3", "--val", "0.1",
                             "--seed", "2")
    assert code == 0, err
    assert "dropped by the guard" in out and "hsgds: warning: block split: classes 1 (" in err
    assert "statistics: now those of the new train pixels" in out  # models that use the store's are fed differently
    cube, gt = indian_pines_files()
    ref = tmp_path / "ref.zarr"
    with pytest.warns(UserWarning, match="could not be split"):
        convert(cube, ref, ConvertOptions(labels=gt, class_names=INDIAN_PINES_CLASSES, split="blocks", train=0.3,
                                          val=0.1, seed=2))
    a, b = hsgds.open_scene(ip_copy), hsgds.open_scene(ref)
    for field in (*fmt.SAMPLE_FIELDS, "offsets"):
        np.testing.assert_array_equal(a.sample_table()[field], b.sample_table()[field])
    for group in fmt.STAT_GROUPS:
        for field in fmt.STAT_FIELDS:  # bit-identical: same accumulator, same tile order
            assert getattr(a.stats[group], field).tobytes() == getattr(b.stats[group], field).tobytes()
    assert a.meta.split == b.meta.split and a.meta.split_generation == 1 and b.meta.split_generation == 0
    assert a.meta.checksums == b.meta.checksums
    # tiles and labels untouched, and verify passes
    assert tree_digest(ip_copy / fmt.TILES) == tiles_before
    assert tree_digest(ip_copy / fmt.LABELS) == labels_before
    code, out, err = run_cli("verify", ip_copy)
    assert code == 0 and out.startswith("ok: 4 tiles"), err


def test_resplit_needs_no_source_and_keeps_one_previous_generation(npy_scene, tmp_path, run_cli):
    cp, lp, _, labels = npy_scene(h=70, w=60, b=4, seed=5)
    store = tmp_path / "s.zarr"
    convert(cp, store, ConvertOptions(labels=lp, max_patch=5))
    os.remove(cp)
    os.remove(lp)
    states = [split_state(store)]
    for i, args in enumerate([("--split", "blocks", "--train", "0.2"), ("--split", "random", "--train", "5"),
                              ("--split", "random", "--train", "0.5", "--seed", "3")], start=1):
        code, out, err = run_cli("resplit", store, *args)
        assert code == 0, err
        scene = hsgds.open_scene(store)
        assert scene.meta.split_generation == i
        states.append(split_state(store))
        # the current and the previous generation are on disk, nothing older
        names = sorted(p.name for p in (store / fmt.SAMPLES).iterdir() if p.name.startswith("split"))
        want = sorted(Path(fmt.split_array(g)).name for g in (i - 1, i))
        assert names == want
        if i == 2:  # per-class count 5 (random split): every class of >= 6 pixels has exactly 5 train pixels
            _, _, lab = scene.samples("train")
            counts = np.bincount(lab, minlength=labels.max() + 1)
            for c in range(1, labels.max() + 1):
                if np.count_nonzero(labels == c) >= 6:
                    assert counts[c] == 5
    assert len(set(states)) == 4
    # back to a known split: the same split codes as the first block re-split
    code, _, err = run_cli("resplit", store, "--split", "blocks", "--train", "0.2")
    assert code == 0, err
    assert split_state(store) == states[1]


def test_a_scene_open_across_two_resplits_says_it_was_resplit(npy_scene, tmp_path):
    """A Scene reads its split codes and train statistics on first use, of the generation it opened. One re-split
    later they are still there; two later they are gone, and that read as a damaged store ("samples/split-0
    is missing; this is not a complete hsgds store", "convert the source again") or as no train statistics
    (stats["train"] None). Each now says the store was re-split and to open it again."""
    from hsgds.errors import StoreError

    cp, lp, _, _ = npy_scene(h=70, w=60, b=4, seed=5)
    store = convert(cp, tmp_path / "s.zarr", ConvertOptions(labels=lp, max_patch=5))
    once, twice = hsgds.open_scene(store), hsgds.open_scene(store)
    twice.labels  # noqa: B018 - something read: the Scene is in use
    resplit(store, train=0.3, seed=1)
    assert once.samples("train")[0].size and once.stats["train"] is not None  # the previous generation is kept
    resplit(store, train=0.4, seed=2)
    for read in (lambda: twice.stats, lambda: twice.norm_stats, twice.sample_table):
        with pytest.raises(StoreError, match=r"was re-split \(`hsgds resplit`\) since this Scene opened it \(split "
                                             r"generation 0, now 2\); open it again"):
            read()
    assert hsgds.open_scene(store).stats["train"] is not None


def test_resplit_failure_leaves_the_store_as_it_was(ip_copy):
    before = tree_digest(ip_copy)
    scene = hsgds.open_scene(ip_copy)
    # damage a tile: the train statistics cannot be computed, and nothing may change
    victim = scene.tile_paths[3]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match="tile 3"):
        resplit(ip_copy, "random", train=0.5, seed=1)
    after = tree_digest(ip_copy)
    assert {k: v for k, v in after.items() if k != victim.relative_to(ip_copy).as_posix()} == \
        {k: v for k, v in before.items() if k != victim.relative_to(ip_copy).as_posix()}


def test_resplit_of_a_store_with_a_missing_tile_is_one_line(ip_copy, run_cli):
    before = tree_digest(ip_copy)
    hsgds.open_scene(ip_copy).tile_paths[2].unlink()
    code, _, err = run_cli("resplit", ip_copy, "--split", "random", "--train", "0.5")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(r"tile 2 \(.*\) cannot be read \(No such file or directory\): the store is damaged.*hsgds verify", err)
    assert set(tree_digest(ip_copy).items()) <= set(before.items())  # nothing else changed


def _resplit_cmd(store: Path, seed: int) -> list[str]:
    return [sys.executable, "-c", "from hsgds.cli import main; main()", "resplit", str(store), "--split", "blocks",
            "--train", "0.3", "--seed", str(seed)]


def test_resplit_killed_at_any_point_leaves_old_or_new(ip_copy, tmp_path):
    """SIGKILL a re-split at spread-out moments: the store always opens, with the old split or the new one."""
    old = split_state(ip_copy)
    pristine = tmp_path / "pristine.zarr"
    shutil.copytree(ip_copy, pristine)
    ref = tmp_path / "ref.zarr"
    shutil.copytree(ip_copy, ref)
    done = subprocess.run(_resplit_cmd(ref, 4), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    new = split_state(ref)
    assert new != old
    # deterministic points first: the process kills itself just before and just after the commit rename
    for where in ("before", "after"):
        code = ("import os, signal\n"
                "from hsgds.preprocess import resplit as r\n"
                "commit = r._commit\n"
                "def dying(store, meta):\n"
                f"    if {where!r} == 'after':\n"
                "        commit(store, meta)\n"
                "    os.kill(os.getpid(), signal.SIGKILL)\n"
                "r._commit = dying\n"
                f"r.resplit({str(ip_copy)!r}, 'blocks', train=0.3, seed=4)\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert split_state(ip_copy) == (old if where == "before" else new)
        assert (ip_copy / fmt.split_array(1)).is_dir()  # the new generation was written, committed or not
        if where == "before":
            continue
        shutil.rmtree(ip_copy)
        shutil.copytree(pristine, ip_copy)
    # then at spread-out moments
    for delay in (0.8, 1.6):
        proc = subprocess.Popen(_resplit_cmd(ip_copy, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        state = split_state(ip_copy)
        assert state in (old, new), delay
        if state == new:  # finished before the kill: start again from the old split
            shutil.rmtree(ip_copy)
            shutil.copytree(pristine, ip_copy)
    # a later re-split removes whatever a killed one left, and succeeds
    done = subprocess.run(_resplit_cmd(ip_copy, 4), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert split_state(ip_copy) == new
    assert [p.name for p in ip_copy.rglob("*") if ".resplit-" in p.name] == []
    assert sorted(p.name for p in (ip_copy / fmt.SAMPLES).iterdir() if p.name.startswith("split")) == \
        ["split", "split-1"]


def test_readers_never_see_a_half_rewritten_store(ip_copy):
    """Readers open the store and read split codes and train statistics while it is re-split again and
    again: every read pairs codes and statistics of one and the same split."""
    from hsgds.preprocess.resplit import _Store, train_stats

    scene = hsgds.open_scene(ip_copy)
    expected = {split_state(ip_copy)}
    plans = [("random", 0.5, 1), ("random", 0.2, 2), ("random", 0.5, 1)]
    stop = threading.Event()
    reads: list[tuple] = []
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                s = hsgds.open_scene(ip_copy)
                codes = s.sample_table()["split"]
                mean = s.stats["train"].mean
                reads.append((hashlib.sha256(codes.tobytes()).hexdigest(), mean.tobytes()))
                # the statistics are those of these very codes (an independent recomputation)
                if len(reads) % 40 == 0:
                    assert train_stats(_Store(ip_copy), codes)["mean"].tobytes() == mean.tobytes()
            except BaseException as exc:  # noqa: BLE001 -- reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for method, train, seed in plans:
            resplit(ip_copy, method, train=train, seed=seed)
            expected.add(split_state(ip_copy))
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors[0]
    assert len(reads) > 10
    assert set(reads) <= expected
    assert len(expected) == 3  # the converted split and the two alternating ones
    del scene


def test_resplit_refuses_while_another_runs(ip_copy, run_cli):
    fd = os.open(ip_copy, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = run_cli("resplit", ip_copy, "--split", "random")
    finally:
        os.close(fd)
    assert code == 2 and "another `hsgds resplit` or `hsgds convert-many` is rewriting" in err and err.count("\n") == 1
    assert hsgds.open_scene(ip_copy).meta.split_generation == 0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("--split", "masks"), "Invalid value for '--split'"),
        (("--split", "random", "--train", "1.5"), r"train fraction must be in \(0, 1\), got 1.5"),
        (("--split", "random", "--train", "0.6", "--val", "0.4"), "below 1"),
        (("--split", "blocks", "--block-size", "0"), "--block-size must be a positive"),
        # in the command's words: it named block_size and guard, which no option of the command is called
        (("--split", "blocks", "--block-size", "2"), r"hsgds: error: --block-size 2 is too small for --max-patch 15: "
                                                     r"blocks must be at least 4 pixels \(each is guarded by the patch "
                                                     r"halo of 7 pixels; .*\); pass --block-size 4 or more \(--max-patch "
                                                     r"was set when the store was converted: smaller blocks need it "
                                                     r"converted again with a smaller one\)\n$"),
        (("--split", "random", "--seed", "-1"), "--seed must be a non-negative"),
        # a random split made where blocks were meant: the block size used to be ignored without a word
        (("--split", "random", "--block-size", "8"), r"--block-size means nothing with --split random \(only --split "
                                                     r"blocks cuts the scene into blocks\); pass --split blocks"),
    ],
)
def test_resplit_bad_arguments(ip_copy, run_cli, args, match):
    before = tree_digest(ip_copy)
    code, out, err = run_cli("resplit", ip_copy, *args)
    assert code == 2 and re.search(match, err), err
    assert "Traceback" not in err
    assert tree_digest(ip_copy) == before


def test_resplit_bad_store(tmp_path, run_cli, npy_scene):
    code, _, err = run_cli("resplit", tmp_path / "nothing.zarr", "--split", "random")
    assert code == 2 and "is not a store directory" in err
    cp, _, _, _ = npy_scene(b=3)
    store = tmp_path / "unlabelled.zarr"
    convert(cp, store, ConvertOptions())
    code, _, err = run_cli("resplit", store, "--split", "blocks")
    assert code == 2 and "has no labelled pixels" in err
    with pytest.raises(InputError, match="for resplit"):
        resplit(store, "masks")


def test_resplit_of_a_collection_refuses_a_block_size_without_blocks(tmp_path, run_cli, npy_scene):
    """Over a collection too, before any scene is re-split: --block-size with --split random was ignored."""
    from hsgds.collection import SceneEntry, write_collection

    cp, lp, _, _ = npy_scene(b=3)
    store = convert(cp, tmp_path / "a.zarr", ConvertOptions(labels=lp, max_patch=5))
    write_collection(tmp_path, [SceneEntry.of_scene("a", hsgds.open_scene(store))])
    before = tree_digest(tmp_path)
    code, out, err = run_cli("resplit", tmp_path, "--split", "random", "--block-size", "8")
    assert code == 2 and err == ("hsgds: error: --block-size means nothing with --split random (only --split blocks "
                                 "cuts the scene into blocks); pass --split blocks, or drop --block-size\n"), err
    assert tree_digest(tmp_path) == before
    with pytest.raises(hsgds.errors.ConfigError, match="--block-size means nothing with --split random"):
        resplit(store, "random", block_size=8)


def two_scene_collection(folder, npy_scene) -> None:
    """A collection of two labelled stores, a.zarr and b.zarr, of one small scene, listed in ``folder``."""
    from hsgds.collection import SceneEntry, write_collection

    cp, lp, _, _ = npy_scene(b=3)
    entries = []
    for name in ("a", "b"):
        store = convert(cp, folder / f"{name}.zarr", ConvertOptions(labels=lp, max_patch=5))
        entries.append(SceneEntry.of_scene(name, hsgds.open_scene(store)))
    write_collection(folder, entries)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--split", "blocks", "--train", "0"), "--train fraction must be in (0, 1), got 0.0; pass a whole number "
                                                "(e.g. 20) for a per-class pixel count"),
        (("--split", "random", "--train", "0.6", "--val", "0.4"), "train + val fractions must be below 1 so that "
                                                                  "pixels are left for test, got 0.6 + 0.4 = 1"),
        (("--split", "random", "--seed", "-1"), "--seed must be a non-negative integer, got -1"),
        (("--split", "blocks", "--block-size", "0"), "--block-size must be a positive number of pixels, got 0"),
    ],
)
def test_resplit_of_a_collection_refuses_bad_options_once_before_any_scene(tmp_path, run_cli, npy_scene, args, line):
    """A bad option is the user's, not a scene's: one line up front, as for one store; it was refused by every
    scene in turn (a line per scene, thousands for a campaign) and then said to be scenes to fix."""
    two_scene_collection(tmp_path, npy_scene)
    before = tree_digest(tmp_path)
    code, out, err = run_cli("resplit", tmp_path, *args)
    assert (code, out, err) == (2, "", f"hsgds: error: {line}\n")
    assert tree_digest(tmp_path) == before
    # one store: the same line, naming the option as the command spells it
    code, out, err = run_cli("resplit", tmp_path / "a.zarr", *args)
    assert (code, out, err) == (2, "", f"hsgds: error: {line}\n")
    assert tree_digest(tmp_path) == before


def test_split_generation_metadata_is_validated(ip_copy):
    import json

    doc = json.loads((ip_copy / "zarr.json").read_text())
    for bad in (-1, "1", 1.5, True, 2**31):
        doc["attributes"]["hsgds"]["split_generation"] = bad
        (ip_copy / "zarr.json").write_text(json.dumps(doc))
        with pytest.raises(hsgds.errors.StoreError, match="split_generation"):
            hsgds.open_scene(ip_copy)


def test_resplit_without_train_pixels_is_refused(ip_copy, run_cli):
    before = tree_digest(ip_copy)
    code, out, err = run_cli("resplit", ip_copy, "--split", "blocks", "--block-size", "100000")
    assert code == 2 and err.strip().splitlines()[-1] == (
        "hsgds: error: --split blocks gives no train pixel on these labels; use a smaller --block-size than 100000 "
        "(or leave it out: adaptive)"), err
    assert "statistics: now those" not in out  # it used to say so while the statistics fell back to all pixels
    assert tree_digest(ip_copy) == before


def test_a_refused_resplit_says_one_line_and_no_warning_of_the_split_not_made(npy_scene, tmp_path, run_cli):
    """A block split without a train pixel is refused: the warning naming its classes ("got no train pixel:
    scored, never trained on") described a split that was never written, a line before the refusal (convert shows
    only the refusal). Over a collection, each scene is one `failed:` line, and no listing is said to be written
    when no scene was re-split (collection.json is left as it was)."""
    two_scene_collection(tmp_path, npy_scene)
    before = tree_digest(tmp_path)
    refusal = ("--split blocks gives no train pixel on these labels; use a smaller --block-size than 500 (or leave "
               "it out: adaptive)")
    code, out, err = run_cli("resplit", tmp_path / "a.zarr", "--split", "blocks", "--block-size", "500")
    assert (code, out, err) == (2, "", f"hsgds: error: {refusal}\n")
    code, out, err = run_cli("resplit", tmp_path, "--split", "blocks", "--block-size", "500")
    assert code == 1 and out == "re-split 0 of 2 scenes (0 unlabelled, 2 failed)\n", out
    assert err == (f"hsgds: failed: a: {refusal}\nhsgds: failed: b: {refusal}\nhsgds: error: 2 of 2 labelled scenes "
                   "could not be re-split (a, b); fix them and run the same command again\n"), err
    assert tree_digest(tmp_path) == before


def test_resplit_refuses_train_statistics_that_overflow(npy_scene, tmp_path, monkeypatch):
    """A store an older hsgds wrote from values too large for float64 statistics (its check did not exist):
    a re-split's new train statistics overflow too, and are refused with the store left as it was."""
    import hsgds.preprocess.convert as conv

    cp, lp, cube, _ = npy_scene(b=3)
    np.save(tmp_path / "big.npy", cube.astype(np.float64) * 1e160)
    monkeypatch.setattr(conv, "check_finite", lambda *a: None)
    store = convert(tmp_path / "big.npy", tmp_path / "big.zarr", ConvertOptions(labels=lp, max_patch=3))
    monkeypatch.undo()
    before = tree_digest(store)
    with pytest.raises(InputError, match=r"band 0: the std of the new train pixels is inf .*; rescale the cube"):
        resplit(store, "random", train=0.5)
    assert tree_digest(store) == before


@pytest.mark.parametrize("damaged", [f"{fmt.TILES}/zarr.json", f"{fmt.SAMPLES}/zarr.json"])
def test_resplit_of_a_store_with_damaged_metadata_is_one_line(ip_copy, run_cli, damaged):
    """tiles/zarr.json is read by the re-split's store check, samples/zarr.json (the group the new split codes
    go into) only when it writes them: either, damaged, is a one-line error and the store stays as it was."""
    (ip_copy / damaged).write_text('{"zarr_format": 3, "node_type": ')
    before = tree_digest(ip_copy)
    code, _, err = run_cli("resplit", ip_copy, "--split", "random", "--train", "0.5")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(ip_copy) in err and "convert the source again" in err
    assert tree_digest(ip_copy) == before


def test_resplit_that_cannot_replace_zarr_json_is_one_line(ip_copy, run_cli, monkeypatch):
    """On Windows zarr.json cannot be replaced while a program reading the store holds it open
    (PermissionError), which Linux never refuses: the replace is made to fail as Windows fails it."""
    before = split_state(ip_copy)

    real = os.replace

    def held_open(src, dst):
        if Path(dst) == ip_copy / "zarr.json":
            raise PermissionError(13, "Access is denied", str(dst))
        real(src, dst)

    monkeypatch.setattr(os, "replace", held_open)
    code, _, err = run_cli("resplit", ip_copy, "--split", "random", "--train", "0.5")
    monkeypatch.undo()
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"cannot replace {ip_copy / 'zarr.json'} (Access is denied); close the programs that have it open" in err
    assert split_state(ip_copy) == before and not list(ip_copy.glob(".zarr.json*"))
    code, _, err = run_cli("resplit", ip_copy, "--split", "random", "--train", "0.5")  # and it can be retried
    assert code == 0, err


def test_resplit_names_a_train_share_far_from_the_one_asked(ip_copy, run_cli):
    # 40 px blocks on the 145x145 Indian Pines: far more train than 10% (whole blocks; 20.8%); said on stderr,
    # the split is still made
    code, out, err = run_cli("resplit", ip_copy, "--split", "blocks", "--train", "0.1", "--block-size", "40")
    assert code == 0, err
    assert re.search(r"hsgds: warning: block split: train is \d+\.\d% of the labelled pixels, not the 10\.0% asked "
                     r"for \(--train 0\.1\), with blocks of 40 px: use a smaller --block-size, or leave it out to let "
                     r"the converter choose\n", err), err
    assert "split: train " in out
