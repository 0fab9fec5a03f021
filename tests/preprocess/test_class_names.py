"""Class names carried from a label file into the store: an ENVI Classification file (written by SPy, or by
hand as ENVI and GDAL write one) names its classes in its header; class 0, ENVI's "Unclassified", is
hsgds's unlabelled 0, so the store's names are those of classes 1..K. Read back with hsgds.open_scene, with
zarr-python from the group's attributes, and as `hsgds info` shows them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

# SPy writes the classification files; it is in the [test] extra (absent on the bare GPU check machine)
envi = pytest.importorskip("spectral.io.envi")

import hsgds  # noqa: E402
from hsgds.preprocess.convert import ConvertOptions, convert  # noqa: E402

H, W = 23, 19
NAMES = ["Unclassified", "Corn-notill", "Grass/Pasture", "Woods", "Soybean mintill"]


def scene(tmp_path: Path, classes: int = 4, seed: int = 0) -> tuple[Path, np.ndarray]:
    """A cube (.npy) and a label map using every class 0..``classes``; returns (cube path, labels)."""
    rng = np.random.default_rng(seed)
    np.save(tmp_path / "c.npy", rng.integers(0, 1000, (H, W, 3)).astype(np.int16))
    labels = rng.integers(0, classes + 1, (H, W)).astype(np.uint8)
    labels[0, : classes + 1] = np.arange(classes + 1)  # every class present
    return tmp_path / "c.npy", labels


def write_classification(path: Path, labels: np.ndarray, fields: list[str], interleave: str = "bsq") -> Path:
    """An ENVI Classification file written by hand (header text + raw bytes from numpy); ``fields`` are extra
    header lines (classes, class names, ...)."""
    path.with_suffix(".img").write_bytes(labels.astype(np.uint8).tobytes())
    lines = ["ENVI", "description = {hand-written classification}", f"samples = {labels.shape[1]}",
             f"lines = {labels.shape[0]}", "bands = 1", "header offset = 0", "file type = ENVI Classification",
             "data type = 1", f"interleave = {interleave}", "byte order = 0", *fields]
    path.write_text("\n".join(lines) + "\n")
    return path


def stored_names(store: Path) -> list[str] | None:
    """The class names as hsgds opens them; zarr-python reads the same from the group's attributes."""
    names = hsgds.open_scene(store).class_names
    assert zarr.open_group(store, mode="r").attrs["hsgds"]["class_names"] == names
    return names


def test_spy_classification_names_become_the_store_class_names(tmp_path, run_cli):
    cp, labels = scene(tmp_path)
    envi.save_classification(str(tmp_path / "gt.hdr"), labels, class_names=NAMES, ext=".img")
    code, _, err = run_cli("convert", cp, "--labels", tmp_path / "gt.hdr", "-o", tmp_path / "s.zarr",
                           "--max-patch", "3")
    assert code == 0, err
    assert stored_names(tmp_path / "s.zarr") == NAMES[1:]  # "Unclassified" is label 0, unlabelled
    np.testing.assert_array_equal(zarr.open_group(tmp_path / "s.zarr", mode="r")["labels"][...], labels)
    # `hsgds info` shows them, for the store and for the label file before converting
    code, out, err = run_cli("info", tmp_path / "s.zarr")
    assert code == 0, err
    for c, name in enumerate(NAMES[1:], start=1):
        assert f"{c:>5}  {name:<28}" in out
    code, out, err = run_cli("info", tmp_path / "gt.hdr")
    assert code == 0, err
    counts = ", ".join(f"{c} {NAMES[c]} ({int((labels == c).sum())})" for c in range(1, 5))
    assert f"label map (single band): classes {counts};" in out


def test_hand_written_header_spanning_lines_with_nodata(tmp_path):
    """A header as ENVI and GDAL write it: names over several lines, odd spacing, class lookup colours, and
    a data ignore value (255) that is unlabelled, not a class above `classes`."""
    cp, labels = scene(tmp_path, classes=3, seed=1)
    labels[5:8, 5:9] = 255
    gt = write_classification(tmp_path / "gt.hdr", labels, [
        "classes = 4", "class lookup = {0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255}",
        "class names = {", " Unclassified ,Corn-notill,", "   Grass/Pasture  ,", " Woods}", "data ignore value = 255"])
    store = convert(cp, tmp_path / "s.zarr", ConvertOptions(labels=gt, max_patch=3))
    assert stored_names(store) == ["Corn-notill", "Grass/Pasture", "Woods"]
    np.testing.assert_array_equal(zarr.open_group(store, mode="r")["labels"][...], np.where(labels == 255, 0, labels))


def test_names_given_win_over_the_header(tmp_path, run_cli):
    cp, labels = scene(tmp_path)
    envi.save_classification(str(tmp_path / "gt.hdr"), labels, class_names=NAMES, ext=".img")
    code, _, err = run_cli("convert", cp, "--labels", tmp_path / "gt.hdr", "-o", tmp_path / "s.zarr",
                           "--max-patch", "3", "--class-names", "corn,grass,trees,soy")
    assert code == 0, err
    assert stored_names(tmp_path / "s.zarr") == ["corn", "grass", "trees", "soy"]
    # ... and are still checked against the labels' classes
    code, _, err = run_cli("convert", cp, "--labels", tmp_path / "gt.hdr", "-o", tmp_path / "t.zarr",
                           "--max-patch", "3", "--class-names", "corn,grass,trees")
    assert code == 2 and "--class-names lists 3 names but the labels hold class 4" in err


def test_names_of_classes_above_the_largest_label_are_kept(tmp_path):
    """The header declares the classification's classes (classes = 5: 0..4), whether or not this file holds
    each: the store keeps every named class (num_classes 4), so scenes classified with one scheme agree."""
    cp, labels = scene(tmp_path, classes=2, seed=2)
    envi.save_classification(str(tmp_path / "gt.hdr"), labels, class_names=NAMES, ext=".img")
    assert "classes = 5" in (tmp_path / "gt.hdr").read_text()
    store = convert(cp, tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "gt.hdr", max_patch=3))
    assert stored_names(store) == NAMES[1:] and hsgds.open_scene(store).num_classes == 4


def test_classification_without_names_and_other_formats_give_none(tmp_path):
    cp, labels = scene(tmp_path)
    gt = write_classification(tmp_path / "gt.hdr", labels, ["classes = 5"])
    store = convert(cp, tmp_path / "s.zarr", ConvertOptions(labels=gt, max_patch=3))
    assert stored_names(store) is None
    np.save(tmp_path / "gt.npy", labels)
    store = convert(cp, tmp_path / "n.zarr",
                                             ConvertOptions(labels=tmp_path / "gt.npy", max_patch=3))
    assert stored_names(store) is None


def test_a_class_above_the_header_classes_is_refused(tmp_path, run_cli):
    """`classes = 3` says the values are 0..2: a pixel of class 4 means the header (and its names) describe
    another file; refused in one line naming the file and the value, by convert and by info."""
    cp, labels = scene(tmp_path)
    gt = write_classification(tmp_path / "gt.hdr", labels, ["classes = 3", "class names = {Unclassified, a, b}"])
    message = ("gt.img holds class 4, but its header gt.hdr declares classes = 3 (values 0..2); fix 'classes' and "
               "'class names' in the header, or the file's values")
    for args in (("convert", cp, "--labels", gt, "-o", tmp_path / "s.zarr", "--max-patch", "3"),
                 ("convert", cp, "--labels", gt, "-o", tmp_path / "s.zarr", "--class-names", "a,b,c,d"),
                 ("info", gt)):
        code, out, err = run_cli(*args)
        assert code == 2 and err == f"hsgds: error: {message}\n", err
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("names, message", [
    (["Unclassified", "a", "b"], "ENVI header gt.hdr names classes 0..2 in 'class names', but gt.img holds class 4; "
                                 "add the missing names to the header, or pass --class-names"),
    (["Unclassified", "a", "", "c", "d"], "ENVI header gt.hdr gives class 2 an empty name in 'class names'; name it "
                                          "in the header, or pass --class-names"),
    (["Unclassified", "a", "b\tc", "c", "d"], "ENVI header gt.hdr gives class 2 a name holding the control "
                                             "character '\\t' in 'class names'; rename it in the header, or pass "
                                             "--class-names"),
])
def test_header_names_that_cannot_name_every_class(tmp_path, run_cli, names, message):
    """SPy writes `classes` to cover the values but the names it is given, however few; without
    --class-names such a header cannot name the store's classes (refused, and shown by info); with them it
    does not need to."""
    cp, labels = scene(tmp_path)
    gt = write_classification(tmp_path / "gt.hdr", labels,
                              ["classes = 5", "class names = {" + ", ".join(names) + "}"])
    code, _, err = run_cli("convert", cp, "--labels", gt, "-o", tmp_path / "s.zarr", "--max-patch", "3")
    assert code == 2 and err == f"hsgds: error: {message}\n", err
    code, out, err = run_cli("info", gt)
    assert code == 0 and f"names:      unusable: {message}" in out, err
    code, _, err = run_cli("convert", cp, "--labels", gt, "-o", tmp_path / "s.zarr", "--max-patch", "3",
                           "--class-names", "w,x,y,z")
    assert code == 0, err
    assert stored_names(tmp_path / "s.zarr") == ["w", "x", "y", "z"]


@pytest.mark.parametrize("name", ["b\nc", "b\tc", "b\x00", "b\x7f"])
def test_class_names_with_control_characters_are_refused_before_any_work(tmp_path, run_cli, name):
    """A control character in a class name would make the GeoTIFF category sidecar invalid XML and break an
    ENVI header's list and one-line messages: refused on one line, by the CLI and ConvertOptions, nothing
    written."""
    cp, labels = scene(tmp_path)
    np.save(tmp_path / "gt.npy", labels)
    code, _, err = run_cli("convert", cp, "--labels", tmp_path / "gt.npy", "-o", tmp_path / "s.zarr",
                           "--max-patch", "3", "--class-names", f"a,{name},x,y")
    assert code == 2 and err.count("\n") == 1, err
    assert err == (f"hsgds: error: --class-names: the name of class 2 ({name!r}) holds the control character "
                   f"{name[1]!r}; give names without newlines, tabs or other control characters\n")
    with pytest.raises(hsgds.ConfigError, match="the name of class 2 .* holds the control character"):
        convert(cp, tmp_path / "s.zarr", ConvertOptions(labels=tmp_path / "gt.npy", class_names=("a", name, "x", "y")))
    assert not (tmp_path / "s.zarr").exists()


def test_class_names_that_are_no_unicode_text_are_refused_at_convert(tmp_path):
    """`--class-names` typed in Latin-1 under a UTF-8 locale reaches Python as an unpaired surrogate (os.fsdecode
    of argv); stored as such, every class map that holds names refused it later. Refused by `hsgds convert` in
    one line naming the class, nothing written; the library's ConvertOptions refuses it too."""
    import os
    import subprocess
    import sys

    cp, labels = scene(tmp_path)
    np.save(tmp_path / "gt.npy", labels)
    argv = [sys.executable, "-m", "hsgds.cli", "convert", cp, "--labels", tmp_path / "gt.npy", "-o",
            tmp_path / "s.zarr", "--max-patch", "3", "--class-names", b"a,ma\xefs,x,y"]  # Latin-1 'ï'
    done = subprocess.run(argv, capture_output=True, env={**os.environ, "LC_ALL": "C.UTF-8"}, timeout=120)
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    assert done.stderr.decode() == ("hsgds: error: --class-names: the name of class 2 ('ma\\udcefs') holds "
                                    "'\\udcef', which is no Unicode text (a byte a command line in another "
                                    "encoding passed on); pass the names in the locale's encoding, or set LC_ALL "
                                    "to a locale of the encoding they are in\n")
    assert not (tmp_path / "s.zarr").exists()
    with pytest.raises(hsgds.ConfigError, match=r"the name of class 2 \('ma\\udcefs'\) holds '\\udcef', which is "
                                                 "no Unicode text"):
        ConvertOptions(labels=tmp_path / "gt.npy", class_names=("a", "ma\udcefs", "x", "y")).check()


def test_convert_many_keeps_a_store_named_from_its_labels_up_to_date(tmp_path):
    """convert-many compares a store's names with those a conversion would give: without --class-names,
    the label file's own. A store named from its ENVI header is up to date; one written before the header
    named its classes is converted again (the header changed); other names given, or the header's again, are
written into its metadata alone, its tiles kept, and it says why."""
    from hsgds.preprocess.convert_many import RENAMED, ManifestRow, convert_scene

    cp, labels = scene(tmp_path)
    gt = write_classification(tmp_path / "gt.hdr", labels, ["classes = 5"])
    row = ManifestRow(name="s", source=cp, labels=gt)
    opts = ConvertOptions(max_patch=3)
    out = tmp_path / "out"
    out.mkdir()
    assert convert_scene(row, out, opts).status == "converted"
    assert stored_names(out / "s.zarr") is None
    write_classification(gt, labels, ["classes = 5", "class names = {" + ", ".join(NAMES) + "}"])
    again = convert_scene(row, out, opts)
    # the header is one of the files the labels are read from: changed, the scene is converted again
    assert (again.status, again.reason) == ("converted", "labels changed (sha256)")
    assert stored_names(out / "s.zarr") == NAMES[1:]
    assert convert_scene(row, out, opts).status == "up to date"
    given = convert_scene(row, out, ConvertOptions(max_patch=3, class_names=("a", "b", "c", "d", "e")))
    assert given.status == RENAMED and given.reason.startswith("--class-names a,b,c,d,e differs")
    assert stored_names(out / "s.zarr") == ["a", "b", "c", "d", "e"] and hsgds.open_scene(out / "s.zarr").num_classes == 5
    # back to the header's: the classes again those the labels hold (4), as a conversion gives them
    back = convert_scene(row, out, opts)
    assert (back.status, back.reason) == (RENAMED, "the class names of gt.hdr (Corn-notill,Grass/Pasture,Woods,"
                                                   "Soybean mintill) differ from the store's (a,b,c,d,e)")
    assert stored_names(out / "s.zarr") == NAMES[1:] and hsgds.open_scene(out / "s.zarr").num_classes == 4
    assert hsgds.open_scene(out / "s.zarr").verify() == []


def test_class_names_holding_unicode_line_separators_are_read_whole(tmp_path):
    """An ENVI header's lines end at CR, LF or CRLF, as GDAL and SPy read them. str.splitlines() also ended one at
    U+0085 (NEL) or U+2028 (LINE SEPARATOR) inside a class name, which came back as two names joined by a space."""
    cp, labels = scene(tmp_path, classes=3)
    names = ["Corn\u2028notill", "Grass\x85Pasture", "Woods\u2029x"]
    gt = write_classification(tmp_path / "gt.hdr", labels, ["classes = 4", "class names = {Unclassified, "
                                                                           + ", ".join(names) + "}"])
    assert envi.open(str(gt)).metadata["class names"][1:] == names  # SPy, the independent reader, agrees
    convert(cp, tmp_path / "s.zarr", ConvertOptions(labels=gt, max_patch=3))
    assert stored_names(tmp_path / "s.zarr") == names
