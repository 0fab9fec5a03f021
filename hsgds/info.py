"""Human-readable summary of a store, a collection of stores, or a model file (``hsgds info``)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.ndimage import maximum_filter

from hsgds import format as fmt
from hsgds._unset import Unset
from hsgds._wording import counted, runs
from hsgds._wording import listed as first_few
from hsgds.collection import Collection, SceneEntry, is_collection_path, open_collection
from hsgds.errors import InputError
from hsgds.scene import open_scene

LISTED_SCENES = 20  # scenes a collection's summary lists one per line before "... and N more"


def split_class_counts(scene) -> dict[str, np.ndarray]:
    """Per split name, the count of labelled pixels of each class 1..K (index 0 unused)."""
    table = scene.sample_table()
    return fmt.split_class_counts(table["split"], table["label"], scene.num_classes)


def split_map(scene) -> np.ndarray:
    """(H, W) uint8 map of ``SPLIT_*`` codes from the store's sample table (unlabelled pixels: none)."""
    out = np.zeros(scene.shape[:2], dtype=np.uint8)
    y, x, _ = scene.samples(None)
    out[y, x] = scene.sample_table()["split"]
    return out


@dataclass(frozen=True)
class Leakage:
    """How many test (and val) pixels have a ``patch_size`` footprint sharing scene pixels with a train footprint."""

    patch_size: int
    test: int  # test pixels
    leaky: int  # of which overlap a train footprint
    train: int  # train pixels
    val: int = 0  # val pixels
    val_leaky: int = 0  # of which overlap a train footprint

    @property
    def share(self) -> float:
        return self.leaky / self.test if self.test else 0.0

    @property
    def val_share(self) -> float:
        return self.val_leaky / self.val if self.val else 0.0


def leakage(scene, patch_size: int | None = None) -> Leakage:
    """Count the test pixels, and the val pixels, whose ``p x p`` patch overlaps the patch of some train pixel.

    Two pixel-centred ``p x p`` patches share scene pixels exactly when their centres are within
    Chebyshev distance ``p - 1`` (= ``2 * h``), so this counts test (val) pixels within ``p - 1`` of a train
    pixel. ``patch_size`` defaults to the store's largest patch (``2 * halo + 1``).
    """
    p = 2 * scene.grid.halo + 1 if patch_size is None else patch_size
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1 or p % 2 == 0:
        raise InputError(f"--patch-size must be a positive odd number (patches are pixel-centred), got {p}")
    codes = split_map(scene)
    train = codes == fmt.SPLIT_TRAIN
    test = codes == fmt.SPLIT_TEST
    val = codes == fmt.SPLIT_VAL  # model selection on val patches that overlap train is optimistic too
    n_train, n_test, n_val = (int(np.count_nonzero(a)) for a in (train, test, val))
    if n_train == 0 or n_test + n_val == 0:
        return Leakage(int(p), n_test, 0, n_train, n_val, 0)
    # pixels within Chebyshev distance p - 1 of a train pixel: a (2p - 1)-wide max filter of train
    near = maximum_filter(train.view(np.uint8), size=2 * int(p) - 1, mode="constant", cval=0).view(bool)
    return Leakage(int(p), n_test, int(np.count_nonzero(near & test)), n_train, n_val,
                   int(np.count_nonzero(near & val)))


def leakage_line(leak: Leakage, guarded: int | None = None) -> str:
    """The ``leakage:`` line of ``hsgds info``. ``guarded``: the largest patch the store's block split
    keeps apart (its halo's), when the split is a block split."""
    p = leak.patch_size
    if leak.train == 0 or leak.test + leak.val == 0:
        return f"leakage:    no train/test split to compare ({leak.train} train, {leak.test} test pixels)"
    # (a split with val pixels but no test pixels, as an empty --test-mask leaves, still has val to compare)
    held = [(name, n, leaky, share) for name, n, leaky, share in (("test", leak.test, leak.leaky, leak.share),
                                                                  ("val", leak.val, leak.val_leaky, leak.val_share))
            if n]
    counts = " and ".join(f"{leaky} of {n} {name} pixels ({100 * share:.1f}%)" for name, n, leaky, share in held)
    head = f"leakage:    {counts} have a {p}x{p} patch sharing pixels with a train patch"
    if leak.leaky == 0 and leak.val_leaky == 0:
        return head + (": train footprints are disjoint from test and val footprints" if len(held) == 2
                       else f": train and {held[0][0]} footprints are disjoint")
    if guarded is not None:  # a block split made for smaller patches: its guard is the store's halo
        return head + (f"; the block split keeps patches up to {guarded}x{guarded} apart: convert again with "
                       f"`--split blocks --max-patch {p}` for disjoint {p}x{p} footprints")
    return head + "; their scores are optimistic: use `--split blocks` (convert or resplit) for disjoint footprints"


def split_line(params: dict) -> str:
    """The split parameters as ``key=value`` pairs; a block split's guard loss is spelled out, a mask split's
    masks named without their sha256 (kept for convert-many reruns)."""
    shown = {k: v for k, v in params.items() if k not in ("guard_lost", "unsplit_classes", "block_origin",
                                                          "adaptive_block_size", "guard_distance")
             and not k.endswith("_sha256")
             and not (k == "seed" and params.get("method") == "masks")}  # (older stores record a moot seed=0)
    text = ", ".join(f"{k}={v}" for k, v in shown.items())
    if params.get("method") == "blocks" and "guard_lost" in params:
        adaptive = " (adaptive)" if params.get("adaptive_block_size") else ""
        size = f"block_size={params.get('block_size')}"
        text = text.replace(size, f"{size}{adaptive}")
        text += (f"; keeping train {params.get('guard_distance')} px from the other splits dropped "
                 f"{counted(params['guard_lost'], 'labelled pixel')}")
        unsplit = params.get("unsplit_classes") or {}
        if unsplit:
            text += "; not split: class " + ", ".join(f"{c} ({counted(n, 'block')})" for c, n in unsplit.items())
    return text


def split_summary(scene) -> str | None:
    """``split: train 1024 (10.0%), val 0, test 7890, dropped by the guard 1335 (13.0%) of 10249 labelled pixels``."""
    n = scene.meta.num_samples
    if n == 0:
        return None
    counts = split_class_counts(scene)
    train, val, test, none = (int(counts[k].sum()) for k in ("train", "val", "test", "none"))
    text = f"split: train {train} ({100 * train / n:.1f}%), val {val}, test {test}"
    if none:
        what = "dropped by the guard" if scene.meta.split.get("method") == "blocks" else "in no split"
        text += f", {what} {none} ({100 * none / n:.1f}%)"
    return text + f" of {n} labelled pixels"


def nodata_line(record: dict, pixels: int) -> str:
    """The ``nodata:`` line of ``hsgds info`` for a store's nodata record, of a scene of ``pixels`` pixels."""
    value = "NaN" if record["value"] == "nan" else f"{record['value']:g}"
    n = int(record["pixels"])
    if n == 0:
        return f"nodata:     value {value}; no pixel without data"
    fill = f", filled with the {record['fill']}" if record.get("fill") else ""
    return (f"nodata:     value {value} in every band: {counted(n, 'pixel')} ({100 * n / pixels:.1f}%){fill}, "
            f"never sampled; {counted(int(record['labelled_dropped']), 'labelled pixel')} dropped")


#: names that mean a model file, not a store
MODEL_SUFFIXES = (".pt2", ".ckpt", ".pt", ".pth")


def _cast_from(source_dtype: str | None, dtype: Any) -> str:
    """What ``hsgds info`` adds to the scene line of a store whose samples are not of its source's type
    (" (cast from the source's int16 by --dtype)"); "" otherwise."""
    return "" if source_dtype in (None, str(dtype)) else f" (cast from the source's {source_dtype} by --dtype)"


def describe(path: str | os.PathLike, patch_size: int | None = None) -> str:
    """A store's summary; for a collection path, the collection's (from ``collection.json`` alone); for a
    model file (a file that is not a collection listing), what the model takes."""
    if is_collection_path(path):
        return describe_collection(open_collection(path))
    if Path(path).is_file() or (not Path(path).exists() and Path(path).suffix.lower() in MODEL_SUFFIXES):
        from hsgds.models import load_model  # (a missing model file is named as such)

        return describe_model(path, load_model(path))
    scene = open_scene(path)
    m, g = scene.meta, scene.grid
    h, w, b = scene.shape
    lines = [
        f"store:      {scene.path}",
        f"scene:      {h}x{w}x{b} {scene.dtype}" + _cast_from(m.source.get("dtype"), scene.dtype),
        f"tiles:      {g.nty}x{g.ntx} tiles, core {g.tile}x{g.tile}, halo {g.halo} (patches up to "
        f"{2 * g.halo + 1}x{2 * g.halo + 1}), {g.tile_nbytes} bytes each, padding {m.padding}",
        f"source:     {m.source.get('name')} ({m.source.get('size')} bytes, "
        f"sha256 {str(m.source.get('sha256'))[:16]}...)",
    ]
    if m.nodata is not None:
        lines.append(nodata_line(m.nodata, h * w))
    if m.georeference is not None:
        point = "; the source's coordinates name pixel centres (PixelIsPoint), as the GeoTIFF maps' do" \
            if m.pixel_is_point else ""
        lines.append(f"georef:     {fmt.describe_georeference(m.georeference)}{point}")
    if scene.wavelengths:
        lines.append(f"bands:      {fmt.describe_wavelengths(scene.wavelengths)}")
    if m.bad_bands:
        lines.append(f"bad bands:  {fmt.describe_bad_bands(m.bad_bands, b)}; bands=scene.good_bands leaves them out, "
                     f"and {_SKIPPED_BY_WAVELENGTH}")
    if m.reflectance_scale_factor is not None:
        lines.append(f"scale:      {fmt.describe_reflectance_scale(m.reflectance_scale_factor)}")
    lines.append(f"split:      {split_line(m.split)}; normalization stats from {m.stats_split} pixels")
    guarded = 2 * g.halo + 1 if m.split.get("method") == "blocks" else None
    lines.append(leakage_line(leakage(scene, patch_size), guarded))
    counts = split_class_counts(scene)
    total: Any = sum(counts.values())  # per class, over the splits
    n_classes = int(np.count_nonzero(total[1:]))
    # an unlabelled scene of a collection keeps the collection's names (convert-many --class-names): shown, as a
    # loader over the collection compares them
    shared = f"; the collection's class names: {', '.join(scene.class_names)}" if scene.class_names else ""
    lines.append(f"classes:    {n_classes} (labels 1..{scene.num_classes}), {m.num_samples} labelled pixels"
                 if scene.num_classes else f"classes:    none (converted without --labels{shared})")
    if m.num_samples:
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


#: what a loader's selection by wavelength does with a band the source flags bad (loader.py: never takes one)
_SKIPPED_BY_WAVELENGTH = "wavelengths=[...] never selects one"


def _bad_bands_line(entries: Sequence[SceneEntry]) -> str | None:
    """How many scenes flag bad bands and their commonest runs, from collection.json ("2 of 3 scenes flag bad
    bands (bbl): 2-3 (2 scenes), 7 (1 scene)"), or None when none does."""
    flagged = [e.bad_bands for e in entries if isinstance(e.bad_bands, tuple) and e.bad_bands]
    if not flagged:
        return None
    spans = Counter(span for bad in flagged for span in runs(bad))
    top = sorted(spans, key=lambda span: (-spans[span], span))  # commonest first, then in band order
    shown = ", ".join(f"{lo if lo == hi else f'{lo}-{hi}'} ({counted(spans[(lo, hi)], 'scene')})" for lo, hi in top[:6])
    more = f" and {len(top) - 6} more runs" if len(top) > 6 else ""
    unlisted = sum(isinstance(e.bad_bands, Unset) for e in entries)  # listed by an older hsgds: not read here
    return (f"bad bands:  {len(flagged)} of {counted(len(entries), 'scene')} {'flags' if len(flagged) == 1 else 'flag'}"
            f" bad bands (bbl{f', {unlisted} not listed' if unlisted else ''}): {shown}{more}; "
            f"a loader's {_SKIPPED_BY_WAVELENGTH}")


def _tally(values: list) -> str:
    """``"224 (every scene)"``, or the values with their scene counts: ``"224 (40 scenes), 103 (2 scenes)"``."""
    top = Counter(values).most_common()
    if len(top) == 1:
        return f"{values[0]} (every scene)"
    text = ", ".join(f"{v} ({n} scene{'s' * (n > 1)})" for v, n in top[:6])
    return text + (f" and {len(top) - 6} more" if len(top) > 6 else "")


def describe_collection(coll: Collection) -> str:
    """A collection's scenes, bands, classes and labelled pixels per split, from ``collection.json`` (no store
    is opened: an archive's listing is summarized in the time it takes to read it and each labelled scene's
    zarr.json, read to tell a store re-split since the listing was written)."""
    entries = coll.entries
    if not entries:
        return f"collection: {coll.path} lists no scenes (each failed to convert, or none was listed)"
    pixels = sum(e.shape[0] * e.shape[1] for e in entries)
    raw = sum(e.shape[0] * e.shape[1] * e.shape[2] * np.dtype(e.dtype).itemsize for e in entries)
    lines = [f"collection: {coll.path} ({counted(len(entries), 'scene')}, {pixels:,} pixels, {raw / 2**30:.2f} GiB of cube data)",
             f"dtype:      {_tally([e.dtype for e in entries])}",
             f"bands:      {_tally([e.bands for e in entries])}"]
    # what a loader over the whole collection will ask for, said before the user builds one
    if len({e.dtype for e in entries}) > 1:
        lines[1] += "; a loader reads one dtype: run the same convert-many command with --dtype float32"
    if len({e.bands for e in entries}) > 1:
        lines[2] += "; a loader over every scene selects bands with wavelengths=[...] (nm)"
    listed = [e.wavelengths for e in entries if e.wavelengths]
    if listed:
        # (PRISMA lists its bands descending, and has bands without a centre)
        lo, hi = min(min(fmt.centred(w)) for w in listed), max(max(fmt.centred(w)) for w in listed)
        missing = len(entries) - len(listed)
        lines.append(f"spectrum:   {lo:.1f}-{hi:.1f} nm" + (f" ({missing} scene{'s' * (missing > 1)} without wavelengths)" if missing else ""))
    with_nodata = [e for e in entries if e.nodata_pixels]
    if with_nodata:
        unknown = sum(e.nodata_pixels is None for e in entries)
        lines.append(f"nodata:     {sum(e.nodata_pixels or 0 for e in with_nodata):,} pixels without data in "
                     f"{counted(len(with_nodata), 'scene')}" + (f" ({unknown} not listed)" if unknown else ""))
    bad = _bad_bands_line(entries)
    if bad is not None:
        lines.append(bad)
    labelled = [e for e in entries if e.num_samples]
    names = next((e.class_names for e in labelled if e.class_names), None)
    classes = max((e.num_classes for e in labelled), default=0)
    if not labelled:
        lines.append("classes:    none (no scene has labels)")
        return "\n".join(lines)
    shown = f" ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''})" if names else ""
    lines.append(f"classes:    {classes}{shown}; {sum(e.num_samples for e in labelled)} labelled pixels "
                 f"in {counted(len(labelled), 'scene')}")
    lines += _listing_checks(coll)
    splits = ("train", "val", "test", "none")
    per_split = all(e.tile_samples is not None for e in labelled)  # listings written before only have totals
    lines.append("")
    header = f"{'scene':<24} {'shape':>16} {'dtype':>8}"
    lines.append(header + ("".join(f"{s:>9}" for s in splits) if per_split else "") + f"{'labelled':>10}")
    totals = dict.fromkeys(splits, 0)
    # labelled scenes first when not all fit: theirs are the counts the table is for (an archive's few labelled
    # scenes, listed after its unlabelled tiles, were hidden in "... and N more"); collection order otherwise
    rows = set(sorted(range(len(entries)), key=lambda i: (not entries[i].num_samples, i))[:LISTED_SCENES])
    for i, e in enumerate(entries):
        counts = {s: sum((e.tile_samples or {}).get(s, ())) for s in splits}
        for s in splits:
            totals[s] += counts[s]
        if i in rows:
            shape = "x".join(str(n) for n in e.shape)
            lines.append(f"{e.name[:24]:<24} {shape:>16} {e.dtype:>8}"
                         + ("".join(f"{counts[s]:>9}" for s in splits) if per_split else "") + f"{e.num_samples:>10}")
    if len(entries) > LISTED_SCENES:
        hidden_labelled = any(e.num_samples for i, e in enumerate(entries) if i not in rows)
        lines.append(f"... and {len(entries) - LISTED_SCENES} more scenes" + ("" if hidden_labelled else " (unlabelled)"))
    lines.append(f"{'all':<24} {'':>16} {'':>8}" + ("".join(f"{totals[s]:>9}" for s in splits) if per_split else "")
                 + f"{sum(e.num_samples for e in entries):>10}")
    return "\n".join(lines)


def _listing_checks(coll: Collection) -> list[str]:
    """Lines naming the labelled scenes whose store no longer holds the split collection.json lists (a store
    re-split directly, `hsgds resplit coll/a.zarr`): the per-split counts shown are the listing's, not the
    store's, and a loader over the collection refuses such a scene when it reaches it. Each store's zarr.json
    is read, nothing else."""
    stale, unreadable, unchecked = coll.stale()
    lines = []
    if stale:
        lines.append(f"stale:      {counted(len(stale), 'scene')} ({first_few(stale)}) "
                     f"{'was' if len(stale) == 1 else 'were'} re-split or converted again after collection.json "
                     "was written: the per-split counts below are the listing's, not the stores'; run the `hsgds "
                     "convert-many` that wrote it again (each store keeps its split, the listing is rewritten), or "
                     f"re-split every scene through the collection (`hsgds resplit {coll.root} --split ...`)")
    if unreadable:
        lines.append(f"unread:     {counted(len(unreadable), 'scene')} ({first_few(unreadable)}): the store's "
                     f"zarr.json is missing or unreadable; `hsgds verify {coll.root}` says why")
    if unchecked:
        lines.append(f"unchecked:  {counted(unchecked, 'labelled scene')}: collection.json (written by an older "
                     "hsgds) lists no split fingerprint to compare with the store's split; run `hsgds convert-many` "
                     "again to list them")
    return lines


def describe_model(path: str | os.PathLike, loaded: Any) -> str:
    """What a model file (:class:`~hsgds.models.LoadedModel`) takes and how ``hsgds predict`` feeds it."""
    kind = "hsgds checkpoint" if loaded.kind == "checkpoint" else "torch.export program"
    params = sum(int(t.numel()) for t in loaded.module.parameters())
    lines = [f"model:      {path}: {kind}, {type(loaded.module).__name__}, {params:,} parameters"]
    if loaded.wavelengths is not None:
        bands = (f"{len(loaded.wavelengths)} bands, each scene's nearest good band within "
                 f"{loaded.wavelength_tolerance:g} nm of {_listed(loaded.wavelengths)} nm")
    elif loaded.band_indices is not None:
        bands = f"{len(loaded.band_indices)} bands, indices {_listed(loaded.band_indices)}"
    else:
        bands = f"all bands of a {loaded.bands}-band scene" if loaded.bands is not None else "every band of the scene"
    p = loaded.patch_size
    lines.append(f"input:      {bands}; " + (f"{p}x{p} patches" if p is not None else "patch size not fixed")
                 + f", {loaded.layout}"
                 + (f", batches of exactly {loaded.batch_size} (fixed at export)" if loaded.batch_size else ""))
    if loaded.normalize is None:
        norm = "none (values as stored)"
    else:
        whose = ("the statistics saved with the model" if loaded.norm_stats is not None
                 else "each scene's own train statistics (all its pixels' when it has no labels)")
        norm = f"{loaded.normalize}, with {whose}"
    lines.append(f"normalize:  {norm}")
    if loaded.classes is not None or loaded.class_names:
        names = f" ({', '.join(loaded.class_names[:8])}{', ...' if len(loaded.class_names) > 8 else ''})" if loaded.class_names else ""
        lines.append(f"classes:    {loaded.classes if loaded.classes is not None else len(loaded.class_names or [])}{names}")
    if loaded.trained_on is not None:  # what `hsgds predict` checks before it scores a map (docs/splits.md)
        scenes = loaded.trained_on["scenes"]
        split = loaded.trained_on["split"]
        lines.append(f"trained on: {'every labelled pixel' if split is None else f'the {split} split'} of "
                     f"{len(scenes)} labelled scene{'' if len(scenes) == 1 else 's'} (their labels and splits "
                     "recorded: a map of one re-split since is not scored)")
    return "\n".join(lines)


def _listed(values: list, shown: int = 8) -> str:
    text = ", ".join(f"{v:g}" for v in values[:shown])
    return text + (f", ... ({len(values)} in all)" if len(values) > shown else "")
