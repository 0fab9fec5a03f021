"""Converter fault matrix: every fault ends in a one-line error naming what is at fault, or in a documented
recovery; never a hang, never a store that opens but is partial (docs/reliability.md)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import hsgds
from hsgds.errors import InputError, StoreError
from hsgds.preprocess.convert import ConvertOptions, convert

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def scene(tmp_path):
    """A 60x60x6 int16 cube (16 tiles of 18 px, 12 KiB each) with labels, as .npy files in tmp_path."""
    from hsgds.synthetic import make_scene

    cube, labels = make_scene(60, 60, 6, classes=4, dtype="int16", seed=11)
    np.save(tmp_path / "cube.npy", cube)
    np.save(tmp_path / "gt.npy", labels)
    return tmp_path / "cube.npy", tmp_path / "gt.npy", cube


def _only(folder: Path, *names: str) -> None:
    """Nothing but ``names`` is left in ``folder`` (no store, no temporary or backup folder)."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)


def _run(script: str, *, prefix: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def _cli_script(*args: str, before: str = "") -> str:
    return f"""
        import sys
        {before}
        from hsgds.cli import main
        main({[str(a) for a in args]!r})
    """


def _one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsgds: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# -- source truncated, deleted or changed while it is converted ----------------------------------------

def _write_envi(folder: Path, cube: np.ndarray) -> Path:
    h, w, b = cube.shape
    (folder / "scene.img").write_bytes(np.ascontiguousarray(cube.transpose(2, 0, 1)).astype("<i2").tobytes())
    hdr = folder / "scene.hdr"
    hdr.write_text(f"ENVI\nsamples = {w}\nlines = {h}\nbands = {b}\nheader offset = 0\ndata type = 2\n"
                   "interleave = bsq\nbyte order = 0\n")
    return hdr


@pytest.mark.parametrize("kind", ["npy", "envi"])
def test_source_truncated_mid_read_is_noticed(scene, kind, monkeypatch):
    import hsgds.preprocess.convert as conv

    cp, lp, cube = scene
    folder = cp.parent
    src, data = (cp, cp) if kind == "npy" else (_write_envi(folder, cube), folder / "scene.img")
    before = sorted(p.name for p in folder.iterdir())
    real_build_tile = conv.build_tile

    def cut_then_build(cube_, grid, padding, tile_id):
        # truncate in the (single) worker thread just before it reads tile 2: the file is memory-mapped,
        # so a read already past the size check when the file shrinks would be a SIGBUS (the documented
        # race); truncating from another thread while a tile is in flight made this test crash at random
        if tile_id == 2:
            with open(data, "r+b") as f:
                f.truncate(os.path.getsize(data) // 2)
        return real_build_tile(cube_, grid, padding, tile_id)

    monkeypatch.setattr(conv, "build_tile", cut_then_build)
    with pytest.raises(InputError, match=rf"{data.name} changed during conversion \(\d+ bytes when opened, now \d+\)"):
        convert(src, folder / "o.zarr", ConvertOptions(labels=lp, tile=18, workers=1))
    _only(folder, *before)


def test_source_deleted_mid_read_is_noticed(scene):
    cp, lp, _ = scene

    def delete(done, total):
        if done == 1:
            cp.unlink()

    with pytest.raises(InputError, match=r"cube.npy became unreadable during conversion"):
        convert(cp, cp.parent / "o.zarr", ConvertOptions(labels=lp, tile=18, workers=1), progress=delete)
    _only(cp.parent, lp.name)


@pytest.mark.parametrize("which,how", [("cube", "touch"), ("cube", "append"), ("labels", "touch")])
def test_source_changed_during_conversion(scene, which, how):
    cp, lp, _ = scene
    target = cp if which == "cube" else lp

    def change(done, total):
        if done == total:  # after the last tile: only the final size+mtime check can notice
            if how == "touch":
                st = os.stat(target)
                os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
            else:
                with open(target, "ab") as f:
                    f.write(b"\0" * 4096)

    with pytest.raises(InputError, match=rf"source changed during conversion: .*{target.name}"):
        convert(cp, cp.parent / "o.zarr", ConvertOptions(labels=lp, tile=18, workers=2), progress=change)
    _only(cp.parent, cp.name, lp.name)


@pytest.mark.parametrize("given,changed", [("gt.hdr", "gt.img"), ("gt.img", "gt.hdr")])
def test_envi_labels_file_not_given_changed_during_conversion(scene, given, changed):
    """ENVI labels are read from a header and its binary, whichever --labels names: the other one touched
    after the last tile is noticed too (before, only the file given was checked)."""
    from tests.envi import write_envi_labels

    cp, lp, _ = scene
    write_envi_labels(cp.parent / "gt.hdr", np.load(lp))
    target = cp.parent / changed

    def change(done, total):
        if done == total:
            st = os.stat(target)
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    with pytest.raises(InputError, match=rf"source changed during conversion: .*{changed}"):
        convert(cp, cp.parent / "o.zarr", ConvertOptions(labels=cp.parent / given, tile=18, workers=2),
                progress=change)
    _only(cp.parent, cp.name, lp.name, "gt.hdr", "gt.img")


# -- the disk fills up, the target folder is read-only --------------------------------------------------

def test_disk_full_is_one_line_and_leaves_nothing(scene):
    """RLIMIT_FSIZE makes every write past 8 KiB fail with EFBIG, as a full disk fails with ENOSPC; the
    12 KiB tiles cannot be written."""
    cp, lp, _ = scene
    out = cp.parent / "o.zarr"
    proc = _run(_cli_script("convert", cp, "--labels", lp, "--tile", "18", "-o", out, before="""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed by the signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    """))
    _one_line_error(proc, "cannot write", str(out), "disk is full")
    _only(cp.parent, cp.name, lp.name)


def test_real_full_filesystem(scene, tmp_path):
    """A 256 KiB tmpfs really runs out of space (ENOSPC); needs permission to mount, skipped otherwise."""
    cp, lp, _ = scene
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        big = np.zeros((200, 200, 8), np.int16)  # ~1.4 MB of tiles
        np.save(tmp_path / "big.npy", big)
        full = r"cannot write .* of .*o.zarr \(No space left on device\); the disk is full"
        with pytest.raises(StoreError, match=full):
            convert(tmp_path / "big.npy", mnt / "o.zarr", ConvertOptions(tile=18))
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _unprivileged() -> tuple[str, ...]:
    """Command prefix that makes root obey file permissions (drops the capabilities that bypass them)."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permissions cannot be enforced")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


def test_read_only_target_folder(scene):
    cp, lp, _ = scene
    ro = cp.parent / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = _run(_cli_script("convert", cp, "--labels", lp, "-o", ro / "o.zarr"), prefix=_unprivileged())
    finally:
        ro.chmod(0o755)
    _one_line_error(proc, "cannot write", str(ro / "o.zarr"), "Permission denied", "not writable")
    assert os.listdir(ro) == []


# -- the target exists, or appears -----------------------------------------------------------------------

def test_overwrite_refuses_what_is_not_a_store(scene, run_cli):
    cp, lp, _ = scene
    folder = cp.parent
    (folder / "notes").mkdir()
    (folder / "notes" / "thesis.tex").write_text("years of work")
    (folder / "file.zarr").write_text("a file")
    for target in (folder / "notes", folder / "file.zarr"):
        code, _, err = run_cli("convert", cp, "-o", target)
        assert code == 2 and "already exists; pass --overwrite" in err
        code, _, err = run_cli("convert", cp, "-o", target, "--overwrite")
        assert code == 2 and "is not an hsgds store; --overwrite only replaces stores" in err, err
    assert (folder / "notes" / "thesis.tex").read_text() == "years of work"
    assert (folder / "file.zarr").read_text() == "a file"
    _only(folder, cp.name, lp.name, "notes", "file.zarr")


def test_target_appearing_during_conversion_is_not_replaced(scene):
    cp, lp, _ = scene
    out = cp.parent / "o.zarr"

    def squat(done, total):
        if done == 1:
            out.mkdir()
            (out / "mine").write_text("someone else's")

    with pytest.raises(InputError, match="appeared during the conversion"):
        convert(cp, out, ConvertOptions(labels=lp, tile=18), progress=squat)
    assert (out / "mine").read_text() == "someone else's"
    _only(cp.parent, cp.name, lp.name, "o.zarr")


# -- killed at random points: the rerun succeeds and verifies --------------------------------------------

_KILL = """
    import os, random, signal, threading, time
    import hsgds.preprocess.convert as conv
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    {setup}
    conv.convert({src!r}, {out!r}, conv.ConvertOptions(labels={labels!r}, tile=18, workers=2, overwrite=True),
                 progress)
"""

_KILL_POINTS = {
    # after every tile, before the statistics and metadata
    "last-tile": "def progress(done, total):\n        done == total and die()",
    # metadata written, not yet renamed into place
    "before-rename": ("progress = None\n    real = conv._replace\n"
                      "    conv._replace = lambda *a, **k: die()"),
    # an existing store swapped aside, the new one not yet in place
    "mid-swap": ("progress = None\n    real, calls = os.rename, []\n"
                 "    def rename(a, b):\n        calls.append(a)\n        real(a, b)\n"
                 "        '.old-' in str(b) and die()\n    conv.os.rename = rename"),
}


def _kill_run(cp, lp, out, setup):
    return _run(_KILL.format(setup=setup, src=str(cp), out=str(out), labels=str(lp)))


@pytest.mark.parametrize("point", list(_KILL_POINTS))
def test_killed_at_each_stage_rerun_recovers(scene, point):
    cp, lp, cube = scene
    folder, out = cp.parent, cp.parent / "k.zarr"
    if point == "mid-swap":
        convert(cp, out, ConvertOptions(labels=lp, tile=18))  # an existing store to be replaced
    proc = _kill_run(cp, lp, out, _KILL_POINTS[point])
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    if point == "mid-swap":
        # documented recovery: the previous store is complete in the hidden .old- folder
        assert not out.exists()
        (old,) = [p for p in folder.iterdir() if p.name.startswith(".k.zarr.old-")]
        assert hsgds.open_scene(old).verify() == []
        shutil.rmtree(old)
    else:
        assert not out.exists()
        (tmp,) = [p for p in folder.iterdir() if p.name.startswith(".k.zarr.tmp-")]
        if point != "before-rename":
            with pytest.raises(StoreError, match="not a complete hsgds store"):
                hsgds.open_scene(tmp)
    convert(cp, out, ConvertOptions(labels=lp, tile=18))  # the rerun succeeds...
    scene_ = hsgds.open_scene(out)
    assert scene_.verify() == []  # ...verifies...
    np.testing.assert_array_equal(scene_.read(0, 60, 0, 60), cube)
    _only(folder, cp.name, lp.name, out.name)  # ...and removed what the killed run left behind


def test_killed_after_random_delays(scene):
    """SIGKILL after random delays spread over the conversion (tiles slowed to ~30 ms each so the delays land
    in every stage): the target is always absent or a complete store that verifies; the rerun recovers."""
    cp, lp, cube = scene
    folder, out = cp.parent, cp.parent / "r.zarr"
    rng = random.Random(5)
    for lo, hi in ((0.0, 0.1), (0.1, 0.3), (0.3, 0.6)):
        setup = ("progress = None\n    slow = conv.build_tile\n"
                 "    conv.build_tile = lambda *a: (time.sleep(0.03), slow(*a))[1]\n"
                 f"    threading.Timer({rng.uniform(lo, hi):.3f}, die).start()")
        # if the conversion finishes first, the process still dies (while sleeping) after the rename
        proc = _run(_KILL.format(setup=setup, src=str(cp), out=str(out), labels=str(lp)) + "    time.sleep(5)\n")
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        if out.exists():
            assert hsgds.open_scene(out).verify() == []
    convert(cp, out, ConvertOptions(labels=lp, tile=18, overwrite=True))
    scene_ = hsgds.open_scene(out)
    assert scene_.verify() == []
    np.testing.assert_array_equal(scene_.read(0, 60, 0, 60), cube)
    _only(folder, cp.name, lp.name, out.name)


def test_concurrent_conversion_keeps_its_temporary_folder(scene):
    """A conversion still running holds a lock on its temporary folder: another one into the same target
    does not delete it (only folders whose owner died are removed)."""
    from hsgds.preprocess import convert as conv

    cp, lp, _ = scene
    out = cp.parent / "c.zarr"
    tmp, fd = conv._make_tmp(out)
    try:
        convert(cp, out, ConvertOptions(labels=lp, tile=18))
        assert tmp.is_dir()
    finally:
        os.close(fd)
        shutil.rmtree(tmp)


@pytest.mark.skipif(sys.platform == "win32", reason="no advisory locks on Windows")
def test_running_conversion_keeps_the_lock_on_its_live_folder(scene):
    """While tiles are being written, the folder they go into is the locked one (zarr must not replace it by a
    new, unlocked folder): another conversion's stale-folder cleanup leaves it alone."""
    import fcntl

    from hsgds.preprocess import convert as conv

    cp, lp, cube = scene
    out = cp.parent / "l.zarr"
    seen = []

    def progress(done: int, total: int) -> None:
        if done == 1:
            (tmp,) = cp.parent.glob(".l.zarr.tmp-*")
            fd = os.open(tmp, os.O_RDONLY)
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
            conv.remove_stale(out)  # what a second conversion into the same target does first
            seen.append(any((tmp / "tiles").rglob("*")))

    convert(cp, out, ConvertOptions(labels=lp, tile=18, workers=1), progress)
    assert seen == [True]
    np.testing.assert_array_equal(hsgds.open_scene(out).read(0, 60, 0, 60), cube)


def test_damaged_tiff_is_one_line_on_the_command_line(tmp_path, run_cli):
    """tifffile's repair log stays quiet: the user sees hsgds's one line naming the file."""
    import io
    import struct

    import tifffile

    buf = io.BytesIO()
    tifffile.imwrite(buf, np.zeros((4, 4, 3), np.uint16), photometric="rgb", compression="zlib", rowsperstrip=2)
    raw = bytearray(buf.getvalue())
    ifd = struct.unpack("<I", raw[4:8])[0]
    for i in range(struct.unpack("<H", raw[ifd:ifd + 2])[0]):
        at = ifd + 2 + 12 * i
        if struct.unpack("<H", raw[at:at + 2])[0] == 257:  # ImageLength: millions of strips, three recorded
            raw[at:at + 12] = struct.pack("<HHII", 257, 4, 1, 2**31 - 1)
    (tmp_path / "bad.tif").write_bytes(bytes(raw))
    code, _, err = run_cli("convert", tmp_path / "bad.tif", "-o", tmp_path / "o.zarr")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "bad.tif" in err, err
    _only(tmp_path, "bad.tif")


# -- the source hashing thread ---------------------------------------------------------------------------

def test_failed_conversion_leaves_no_hashing_thread(tmp_path):
    """The source is hashed on a thread while its tiles are written. A 1 GiB float32 cube (sparse on disk:
    only a NaN at each tile's first pixel is written) fails on its first tile long before its hash is
    done; the failed conversion must stop that thread, not leave it reading the source."""
    import threading
    import time

    src = tmp_path / "big.npy"
    cube = np.lib.format.open_memmap(src, mode="w+", dtype="<f4", shape=(256, 256, 4096))
    cube[::32, ::32, 0] = np.nan  # every 32x32 tile fails at once: none is written
    del cube
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="NaN/Inf values"):
        convert(src, tmp_path / "o.zarr", ConvertOptions(max_patch=3, tile=32, workers=1))
    assert [t.name for t in threading.enumerate() if t.name == "hsgds-sha256"] == []
    assert time.perf_counter() - t0 < 30  # and it did not wait for the whole source to be hashed
    _only(tmp_path, "big.npy")


def test_store_held_open_on_windows_is_one_line(scene, run_cli, monkeypatch):
    """On Windows a store another program is reading cannot be renamed (PermissionError). That cannot happen
    on Linux, so the rename is made to fail as Windows fails it; the existing store stays, nothing is left."""
    cp, lp, _ = scene
    out = cp.parent / "o.zarr"
    convert(cp, out, ConvertOptions(labels=lp, tile=18))
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    real = os.rename

    def held_open(src, dst):
        if Path(src) == out:
            raise PermissionError(13, "The process cannot access the file because it is being used by another "
                                      "process", str(src))
        real(src, dst)

    monkeypatch.setattr(os, "rename", held_open)
    code, _, err = run_cli("convert", cp, "--labels", lp, "--tile", "18", "-o", out, "--overwrite")
    lines = [line for line in err.strip().splitlines() if not line.startswith("hsgds: convert: ")]  # (a log)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"cannot move the existing store {out} aside (The process cannot access the file" in err
    assert "close the programs that have it open" in err and "then convert again" in err
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    hsgds.open_scene(out).verify()
    _only(cp.parent, cp.name, lp.name, "o.zarr")
