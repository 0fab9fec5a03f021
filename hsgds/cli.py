"""The ``hsgds`` command: convert, convert-many, info, resplit, verify (and the runtime verbs). Exit 0 on success,
2 on bad input or usage, with a one-line error on stderr; 1 when part of the work failed and the rest was done
(convert-many and a collection's resplit or predict: some scenes failed) or, for doctor, when the reader or
engine asked for cannot run here (with --require-gpu: when no CUDA GPU would be used); 130 when interrupted
(Ctrl-C)."""

from __future__ import annotations

import functools
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn

import click
import numpy as np

from hsgds._optional import pip_install
from hsgds._unset import Unset
from hsgds._version import __version__
from hsgds._wording import counted, duration, listed
from hsgds.errors import HsgdsError, HsgdsWarning, InputError, StoreError, escaped, one_line

EXIT_BAD_INPUT = 2
EXIT_SOME_FAILED = 1  # some scenes failed, the others were done (or doctor: unhealthy)
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT, so that a script tells Ctrl-C from failed scenes

# what an interrupted command leaves, for those whose rerun picks up where it stopped
_RESUMED = {
    "convert": "; run the same command again to convert (a store is written whole or not at all)",
    "convert-many": "; run the same command again to finish (the scenes converted so far are kept)",
    "resplit": "; run the same command again to finish (each store keeps its old split or the new one)",
}


class _Commands(click.Group):
    """The hsgds group: Ctrl-C in a command exits 130 with a line saying what to do, instead of click's
    "Aborted!" and exit 1 (which is also "some scenes failed")."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _our_warnings_in_one_line():
                return super().invoke(ctx)
        except KeyboardInterrupt:
            lead = "\n" if sys.stderr.isatty() else ""  # below the terminal's ^C (or a progress bar)
            click.echo(f"{lead}hsgds: interrupted{_RESUMED.get(ctx.invoked_subcommand or '', '')}", err=True)
            sys.exit(EXIT_INTERRUPTED)


#: convert and verify checksum tiles with torch (wsum64), predict, bench and demo run models: a base install lacks it
NO_TORCH = ("this command needs PyTorch, which is not installed: install the build for your CUDA "
            f"(https://pytorch.org/get-started/locally/), or {pip_install('torch')} for the default one")


def _torch_installed() -> bool:
    """Whether torch can be found (its import may still fail: a broken build, a submodule it lacks)."""
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a torch entry in sys.modules without a spec
        return False


def _say(line: str) -> None:
    """One line on stderr: control characters a message echoes (a path's newline, an escape sequence in a
    file name) escaped, so that an error, warning or failure stays one line and never drives the terminal."""
    click.echo(escaped(line), err=True)


def _fail(message: str) -> NoReturn:
    _say(f"hsgds: error: {message}")
    sys.exit(EXIT_BAD_INPUT)


def _in_cli_words(message: str, options: dict[str, str]) -> str:
    """``message``, a library error, naming ``options`` (parameter name -> the option that sets it 1:1) as the
    user typed them: ``name=VALUE`` as ``--name VALUE`` (``name=[...]`` as ``--name ...``), and a name with an
    underscore (never a word of prose) also where it stands alone. Only whole names after a space or at the start:
    a Python call shown as an example (``PatchLoader(wavelengths=[...])``) stays as it is."""
    for name, option in options.items():
        message = re.sub(rf"(?<!\S){name}=\[\.\.\.\]", f"{option} ...", message)
        message = re.sub(rf"(?<!\S){name}=", f"{option} ", message)
        if "_" in name:
            message = re.sub(rf"(?<!\S){name}\b(?!=)", option, message)
    return message


def _errors_in_cli_words(command: Callable[..., Any]) -> Callable[..., Any]:
    """A command whose options set the library's parameters of the same names (bench, predict): its library
    errors name those options (``--batch-size``), not the Python parameters (``batch_size``)."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except HsgdsError as exc:
            _fail(_in_command_words(str(exc)))
    return run


def _in_command_words(message: str) -> str:
    """``message`` naming the running command's options as typed (:func:`_in_cli_words`)."""
    params = click.get_current_context().command.params
    options = {p.name: f"--{p.name.replace('_', '-')}" for p in params if isinstance(p, click.Option)
               and p.name and f"--{p.name.replace('_', '-')}" in p.opts}
    return _in_cli_words(message, options)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hsgds")
def cli() -> None:
    """Stream hyperspectral patches from aligned Zarr tiles into PyTorch training."""


def _number(value: str) -> float:
    """A fraction (0 < f < 1) or a per-class count (integer >= 1)."""
    try:
        f = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number") from None
    return int(f) if f >= 1 and f.is_integer() else f


class _Amount(click.ParamType):
    """--train / --val: :func:`_number` as the option's type, so that click's error names the option."""

    name = "number"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return _number(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


_AMOUNT = _Amount()


def _split_warnings(prefix: str = ""):
    """Show a split's warnings (classes that could not be split, a train share far from --train) and the
    converter's (labelled pixels without data, wavelengths or a georeference not recorded) as one line each on
    stderr, after ``prefix`` (a collection's scene name)."""
    from hsgds.preprocess.convert import CONVERT_WARNINGS

    return _warnings_in_one_line(CONVERT_WARNINGS, prefix)


def _image_warnings():
    """Show the warning of an image (a PNG class map, a preview) whose names hold characters its font lacks as
    one line on stderr, not matplotlib's two lines for each character."""
    from hsgds.preview import GlyphWarning

    return _warnings_in_one_line((GlyphWarning,))


@contextmanager
def _warnings_in_one_line(ours: tuple[type[Warning], ...], prefix: str = ""):
    """Show the warnings of categories ``ours`` as one line each on stderr (``hsgds: warning: ``, then ``prefix``),
    each time they are issued; any other is issued as it was."""
    shown: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            if not sys.warnoptions:  # the user's -W / PYTHONWARNINGS (e.g. ignore) win
                for category in ours:
                    warnings.simplefilter("always", category)
            try:
                yield
            finally:
                shown = list(caught)
    finally:  # after the recording ends: a warning re-raised inside it would be recorded again, for ever
        for w in shown:
            if issubclass(w.category, ours):
                _say(f"hsgds: warning: {prefix}{w.message}")
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


@contextmanager
def _our_warnings_in_one_line():
    """While a command runs: each of hsgds's own warnings (:class:`HsgdsWarning`: the kvikio reader's, a source
    reader's) that no command shows itself as one line on stderr, once per distinct message, not as Python's
    ``file:line: Category: text`` and source line; any other warning is shown as Python shows it. Library users
    keep Python's warnings: this is set up by the command group only."""
    shown_by_python = warnings.showwarning
    said: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if not issubclass(category, HsgdsWarning):
            shown_by_python(message, category, filename, lineno, file, line)
        elif str(message) not in said:
            said.add(str(message))
            _say(f"hsgds: warning: {message}")

    with warnings.catch_warnings():
        if not sys.warnoptions:  # the user's -W / PYTHONWARNINGS (e.g. ignore) win
            warnings.simplefilter("always", HsgdsWarning)  # repeats are told apart here, by message, not by place
        warnings.showwarning = show
        yield


@contextmanager
def _progress_bar(label: str, command: str, noun: str) -> Iterator[Callable[[int, int], None]]:
    """The ``(done, total)`` callback of a command's work, for the ``with`` block doing it: it draws a progress
    bar on stderr when it is a terminal (finished with the block); on any other stderr (a batch job's log) it
    writes `_LogProgress` lines about ``command``'s ``noun``s instead, whose last (all done) waits for the block
    to succeed: work that fails after its last item (a store's statistics, its rename into place) read as done."""
    bar = click.progressbar(length=1, label=label, file=sys.stderr) if sys.stderr.isatty() else None
    log = _LogProgress(command, noun) if bar is None else None
    last: tuple[int, int] | None = None

    def progress(done: int, total: int) -> None:
        nonlocal last
        if bar is not None:
            bar.length = total
            bar.update(done - bar.pos)
        if log is not None:
            if done < total:
                log.update(done, total, 0)
            else:
                last = (done, total)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.render_finish()
    if log is not None and last is not None:
        log.update(*last, 0)


class _LogProgress:
    """Progress for a stderr that is not a terminal (a batch job's log, SLURM, nohup), where no bar is drawn:
    a line as an item finishes, at most once every ``progress_log_s`` seconds (setting), and one when the last
    finishes: how many are done and failed, the mean time per item so far (wall clock since the command
    started, so workers running side by side count) and the time left at that pace. ``clock``: seconds, as
    time.monotonic counts them (a test's own)."""

    def __init__(self, command: str, noun: str, clock: Callable[[], float] = time.monotonic) -> None:
        from hsgds import defaults

        self.command, self.noun, self.clock = command, noun, clock
        self.interval = defaults.get("progress_log_s")
        self.start = self.said = clock()

    def _due(self, done: int, total: int) -> bool:
        """Whether a line is due now (the last item's always is); if so, it counts as said."""
        now = self.clock()
        if done < total and now - self.said < self.interval:
            return False
        self.said = now
        return True

    def _pace(self, each: float, what: str = "") -> str:
        """``each`` seconds per item, of items ``what`` ("converted"): pixels or tiles come thousands a second,
        and a rate reads better than 1.2e-05 s per pixel."""
        what = f" {what}" if what else ""
        return (f"{1 / each:,.0f} {self.noun}s{what} per s" if each < 0.01 else
                f"{f'{each:.3g}' if each < 100 else f'{each:.0f}'} s per {self.noun}{what}")

    def update(self, done: int, total: int, failed: int) -> None:
        if not self._due(done, total):
            return
        each = (self.said - self.start) / max(done, 1)
        line = (f"hsgds: {self.command}: {done:,} of {total:,} {self.noun}s done"
                + (f" ({failed:,} failed)" if failed else "") + f", {self._pace(each)}")
        if done < total:
            line += f", about {duration(each * (total - done))} left"
        click.echo(line, err=True)


class _SceneLog(_LogProgress):
    """convert-many's lines in a log. A rerun's scenes found up to date (or whose metadata alone was updated)
    take a fraction of a second, a conversion seconds to minutes, and they come first: a mean over all scenes
    said little time was left when hours were. Once any scene was kept so, the line counts them and gives the
    pace of the scenes converted (the wall clock shared among the scenes by the seconds their workers spent on
    each, as workers run side by side) and the time left were every scene left to be converted: "up to",
    those found up to date take less; before any scene was converted it says no time left. A run without
    such scenes reads as before: the mean over all of them, "about"."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__("convert-many", "scene", clock)
        self.counts: dict[str, int] = {}
        self.busy = self.busy_converting = 0.0  # seconds the workers spent on all scenes / on those converted

    def scene_done(self, status: str, seconds: float, done: int, total: int) -> None:
        """Scene ``done`` of ``total`` finished with ``status`` (a SceneResult's) after ``seconds`` of its worker's."""
        self.counts[status] = self.counts.get(status, 0) + 1
        self.busy += seconds
        self.busy_converting += seconds if status == "converted" else 0.0
        failed, converted = self.counts.get("failed", 0), self.counts.get("converted", 0)
        kept = done - failed - converted  # up to date, or their metadata alone updated
        if not kept:
            self.update(done, total, failed)
            return
        if not self._due(done, total):
            return
        up_to_date = self.counts.get("up to date", 0)
        counts = [f"{n:,} {what}" for n, what in ((up_to_date, "up to date"), (kept - up_to_date, "metadata updated"),
                                                  (failed, "failed")) if n]
        line = f"hsgds: {self.command}: {done:,} of {total:,} scenes done ({', '.join(counts)})"
        if converted:
            share = self.busy_converting / self.busy if self.busy > 0 else 1.0
            each = (self.said - self.start) * share / converted
            line += f", {self._pace(each, 'converted')}"
            if done < total:
                line += f", up to {duration(each * (total - done))} left"
        click.echo(line, err=True)


def _echo_nodata(store) -> None:
    """One line saying how many pixels had no data and what the tiles hold there, or that none had, when a
    nodata value applied."""
    from hsgds import format as fmt
    from hsgds.scene import open_scene

    record = open_scene(store).meta.nodata
    if not record:
        return
    value = fmt.nodata_text(record["value"])
    if not record["pixels"]:  # e.g. a value the dtype cannot hold, or a full raster: say so
        click.echo(f"nodata: no pixel has every band at {value}; every pixel is data")
        return
    click.echo(f"nodata: {counted(record['pixels'], 'pixel')} (every band {value}), left out of samples and "
               f"predictions; the tiles hold the {record['fill']} there")


def _echo_split(store) -> None:
    """One line saying what a split gave: train share, and for a block split the guard loss."""
    from hsgds.info import split_summary
    from hsgds.scene import open_scene

    line = split_summary(open_scene(store))
    if line:
        click.echo(line)


# Converter options shared by `convert` and `convert-many` (which applies them to every scene).
_SCENE_OPTIONS = [
    click.option("--key", help="Variable / dataset holding the cube (.mat, HDF5), when the file has several."),
    click.option("--labels-key", help="Variable / dataset holding the labels."),
    click.option("--band-axis", type=click.Choice(["first", "middle", "last"]),
                 help="Band axis of .npy/.mat/HDF5 arrays: first (B, H, W), middle (H, B, W: PRISMA), last (H, W, B, "
                      "the default)."),
    click.option("--max-patch", default=15, show_default=True, help="Largest patch size served (halo = (p-1)/2)."),
    click.option("--tile", type=int, help="Tile core size in pixels (default: chosen for ~1-8 MiB aligned tiles)."),
    click.option("--padding", default="reflect", show_default=True, type=click.Choice(["reflect", "edge", "zero"])),
    click.option("--split", default="random", show_default=True, type=click.Choice(["random", "blocks", "masks"])),
    click.option("--train", default="0.1", show_default=True, type=_AMOUNT,
                 help="Train fraction, or pixels per class if >= 1."),
    click.option("--val", default="0", show_default=True, type=_AMOUNT,
                 help="Validation fraction, or pixels per class if >= 1."),
    click.option("--block-size", type=int, help="Block side for --split blocks."),
    click.option("--train-mask", type=click.Path(dir_okay=False), help="Train mask for --split masks."),
    click.option("--val-mask", type=click.Path(dir_okay=False), help="Validation mask for --split masks."),
    click.option("--test-mask", type=click.Path(dir_okay=False), help="Test mask for --split masks."),
    click.option("--seed", default=0, show_default=True),
    click.option("--nan-fill", type=float, help="Replace NaN/Inf in the cube by this value (refused otherwise)."),
    click.option("--nodata", help="Value marking pixels without data (every band equal to it), e.g. -9999 or nan; "
                                  "they are never samples and are not predicted. Default: the source's own "
                                  "(GeoTIFF GDAL_NODATA, ENVI 'data ignore value', HDF5/netCDF _FillValue); none: ignore it."),
    click.option("--class-names", help="Comma-separated class names, in label order (1, 2, ...)."),
    click.option("--wavelengths", help="Band centres in nm, comma-separated, or a text file of them (commas, spaces "
                                       "or one per line; none for a band without a centre), for sources that do not "
                                       "record them (.npy, .mat, GeoTIFF without GDAL wavelength metadata or an "
                                       "EnMAP METADATA.XML, HDF5 without a wavelength dataset or PRISMA's "
                                       "List_Cw_*): loaders then select bands with wavelengths=[...]."),
    click.option("--dtype", help="Store the samples as this type (e.g. float32) instead of the source's, so that "
                                 "scenes of several sensors load together; a value it cannot hold exactly is "
                                 "refused."),
]


def _scene_options(command):
    for option in reversed(_SCENE_OPTIONS):
        command = option(command)
    return command


def _convert_options(key, labels_key, band_axis, max_patch, tile, padding, split, train, val, block_size,
                     train_mask, val_mask, test_mask, seed, nan_fill, nodata, class_names, wavelengths, **extra):
    from hsgds.preprocess.convert import ConvertOptions, nodata_option, wavelength_list

    return ConvertOptions(
        key=key, labels_key=labels_key, band_axis=band_axis, max_patch=max_patch, tile=tile,
        padding=padding, split=split, train=train, val=val, block_size=block_size,
        train_mask=train_mask, val_mask=val_mask, test_mask=test_mask, seed=seed, nan_fill=nan_fill,
        nodata=None if nodata is None else nodata_option(nodata),
        class_names=None if class_names is None else tuple(c.strip() for c in class_names.split(",")),
        wavelengths=None if wavelengths is None else wavelength_list(wavelengths, "--wavelengths"), **extra)


# Options that only mean something for labelled pixels (a split of them, names of their classes)
_LABEL_OPTIONS = ("split", "train", "val", "block_size", "train_mask", "val_mask", "test_mask", "seed", "class_names")


def _check_split_options(split: str, given: list[str]) -> None:
    """Exit 2 on a split option the split method would ignore (``--train`` with ``--split masks``, ``--block-size``
    without ``--split blocks``): the user meant a split other than the one that would be made."""
    from hsgds.preprocess.splits import check_split_options

    try:
        check_split_options(split, given)
    except HsgdsError as exc:
        _fail(str(exc))


def _given_label_options() -> list[str]:
    """The label options the user gave on the command line (not their defaults), as options (--train)."""
    ctx = click.get_current_context()
    return ["--split " + ctx.params[name] if name == "split" else "--" + name.replace("_", "-")
            for name in _LABEL_OPTIONS
            if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)]


@cli.command()
@click.argument("src", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(), help="Store to write (a .zarr directory).")
@click.option("--labels", type=click.Path(dir_okay=False), help="Ground-truth class map (any supported format).")
@_scene_options
@click.option("--overwrite", is_flag=True, help="Replace an existing store.")
@click.option("--workers", default=4, show_default=True, help="Threads writing tiles.")
def convert(src, out, labels, overwrite, workers, **options) -> None:
    """Convert a cube (.mat v5/v7.3, ENVI, GeoTIFF, HDF5, .npy) into an hsgds store. Progress: a bar on a
    terminal; in a log, a line as tiles finish, at most every 30 s (HSGDS_PROGRESS_LOG_S), and at the end."""
    from hsgds.preprocess.convert import convert as run_convert

    opts = _convert_options(**options, labels=labels, overwrite=overwrite, workers=workers)
    given = _given_label_options()
    if labels is not None:  # every option the split ignores named at once (opts.check can tell of some only)
        _check_split_options(opts.split, given)
    opts.check()  # a bad value is named as such, with or without --labels
    if labels is None and given:  # they would be ignored: an unlabelled store has no split and no classes
        _fail(f"{given[0]} needs --labels (splits and class names are about labelled pixels); pass the ground "
              f"truth with --labels, or drop {' '.join(given)}")
    with _split_warnings(), _progress_bar("tiles", "convert", "tile") as progress:  # warnings after the bar
        path = run_convert(src, out, opts, progress)
    click.echo(f"wrote {path}")
    _echo_nodata(path)
    _echo_split(path)


@cli.command("convert-many")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False),
              help="Folder for <name>.zarr stores and collection.json (created if missing).")
@_scene_options
@click.option("--scheduler", help="Address of a running dask.distributed scheduler (tcp://HOST:PORT) whose workers "
                                  "see the same paths; default: a local cluster on this machine.")
@click.option("--workers", default=2, show_default=True,
              help="Worker processes of the local cluster (without --scheduler).")
@click.option("--threads", default=2, show_default=True, help="Threads writing tiles within each scene.")
@click.option("--overwrite", is_flag=True, help="Convert every scene again, even those already up to date.")
def convert_many(manifest, out, scheduler, workers, threads, overwrite, **options) -> None:
    """Convert the scenes listed in MANIFEST, a CSV file with the header
    source[,labels,name,key,labels_key,band_axis,wavelengths,nodata], on Dask, one task per scene, into
    OUT/<name>.zarr and OUT/collection.json. Relative paths are
    relative to the manifest's folder; name defaults to the source's file stem; band_axis is the scene's
    --band-axis (a PRISMA cube's middle beside GeoTIFF scenes); wavelengths names a text file of the scene's
    band centres (nm); nodata is the scene's nodata value (a number, nan or none), over --nodata. Rerunning
    converts only scenes that are missing, changed or damaged. Exit 1 when some scenes failed (each is named
    with its reason). Progress: a bar on a terminal; in a log, a line as a scene finishes, at most every 30 s
    (HSGDS_PROGRESS_LOG_S), and at the end."""
    import logging

    from hsgds.preprocess.convert_many import METADATA_UPDATED, NEW
    from hsgds.preprocess.convert_many import convert_many as run_many

    opts = _convert_options(**options, workers=threads)
    given = _given_label_options()
    if given:
        from hsgds.preprocess.convert_many import read_manifest

        if not any(row.labels is not None for row in read_manifest(manifest)):
            _fail(f"{given[0]} needs labelled scenes, and {manifest} lists none (no labels column values); add "
                  f"the ground truth in its labels column, or drop {' '.join(given)}")
    _check_split_options(opts.split, given)
    logging.getLogger("distributed").setLevel(logging.ERROR)  # worker restarts are reported per scene below
    bar: Any = click.progressbar(length=1, label="scenes", file=sys.stderr, show_pos=True,
                            item_show_func=lambda tiles: None if tiles is None else f"{tiles} tiles"
                            ) if sys.stderr.isatty() else None
    log = _SceneLog() if bar is None else None  # a batch job's log: lines, not a bar
    tiles = 0

    def progress(result, done: int, total: int) -> None:
        nonlocal tiles
        tiles += result.tiles
        for said in result.warnings:  # recorded on the worker: shown here, as `hsgds convert` shows them
            if bar:
                click.echo("", err=True)  # off the bar's line
            _say(f"hsgds: warning: {result.name}: {said}")
        if result.status == "failed":
            if bar:
                click.echo("", err=True)
            _say(f"hsgds: failed: {result.name}: {result.reason}")
        elif result.status == "converted" and result.reason not in (NEW, "--overwrite"):
            # a store replaced (e.g. a re-split undone by other split options) or deleted since: say why
            click.echo(f"{chr(10) if bar else ''}{result.name}: re-converted: {result.reason}")
        elif result.status.startswith(METADATA_UPDATED):  # the tiles kept, the metadata rewritten: say why
            click.echo(f"{chr(10) if bar else ''}{result.name}: {result.status}: {result.reason}")
        if bar is not None:
            bar.length = total
            bar.current_item = tiles
            bar.update(done - bar.pos)
        if log is not None:
            log.scene_done(result.status, result.seconds, done, total)

    try:
        r = run_many(manifest, out, opts, scheduler=scheduler, workers=workers, force=overwrite, progress=progress,
                     notice=lambda line: click.echo(f"hsgds: {line}", err=True))
    finally:
        if bar is not None:
            bar.render_finish()
    mb = sum(s.source_bytes for s in r.converted) / 1e6
    updates = {s.status for s in r.renamed}  # "metadata updated (class names)" when that is all that was
    renamed = f"{len(r.renamed)} {updates.pop() if len(updates) == 1 else METADATA_UPDATED}, " if r.renamed else ""
    click.echo(f"{len(r.converted)} converted ({sum(s.tiles for s in r.converted)} tiles, {mb:.1f} MB), {renamed}"
               f"{len(r.up_to_date)} up to date, {len(r.failed)} failed of {len(r.scenes)} scenes in "
               f"{r.seconds:.1f} s; wrote {r.collection}")
    if r.failed:
        click.echo(f"hsgds: error: {len(r.failed)} of {len(r.scenes)} scenes failed ("
                   f"{listed(s.name for s in r.failed)}); "
                   "fix them and run the same command again", err=True)
        sys.exit(EXIT_SOME_FAILED)


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--patch-size", type=int,
              help="Patch side p of the leakage line (default: the store's largest patch, 2*halo+1).")
@click.option("--key", help="A source's variable / dataset (.mat, HDF5), when the file holds several.")
@click.option("--band-axis", type=click.Choice(["first", "middle", "last"]),
              help="A source array's band axis (default last).")
def info(store, patch_size, key, band_axis) -> None:
    """Print a store's shape, dtype, tiling, split (with its train/test patch leakage), classes and
    per-class counts per split. For a collection (a folder holding collection.json, or that file): its
    scenes, bands and labelled pixels per split, from collection.json, naming the scenes re-split since it
    was written (each labelled store's zarr.json is read, nothing else). For a model file (.pt2 or a
    checkpoint): the bands, patch size and normalization it takes. For a source file (a cube to convert):
    what `hsgds convert` sees in it (shape, dtype, wavelengths, georeference, nodata value), or the classes
    of a label map."""
    import zipfile

    from hsgds.collection import is_collection_path
    from hsgds.info import MODEL_SUFFIXES, describe

    path = Path(store)
    if patch_size is not None and (path.is_file() or is_collection_path(path)):  # (it would be dropped unsaid)
        _fail(f"--patch-size sets the leakage line of a store (a .zarr folder); a collection, a source or a model file "
              f"has none: run `hsgds info STORE --patch-size {patch_size}` on a scene's store")
    if (path.is_file() and not is_collection_path(path) and path.suffix.lower() not in MODEL_SUFFIXES
            and not zipfile.is_zipfile(path)):  # (torch.save and torch.export write zip archives)
        from hsgds.preprocess.describe import describe_source

        click.echo(describe_source(path, key=key, band_axis=band_axis))
        return
    if key is not None or band_axis is not None:
        _fail("--key and --band-axis describe a source file (a cube to convert); a store, collection or model "
              "needs neither")
    click.echo(describe(store, patch_size))


# a model trained before a re-split, and saved without its statistics, would be fed other inputs after it
_NEW_STATISTICS = ("statistics: now those of the new train pixels; a model file that normalizes with each "
                   "scene's own is fed differently (`hsgds info MODEL` says which it does)")


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--split", required=True, type=click.Choice(["random", "blocks"]),
              help="random: stratified per pixel; blocks: spatially disjoint and stratified (docs/splits.md).")
@click.option("--train", default="0.1", show_default=True, type=_AMOUNT, help="Train fraction, or pixels per class if >= 1.")
@click.option("--val", default="0", show_default=True, type=_AMOUNT,
              help="Validation fraction, or pixels per class if >= 1.")
@click.option("--block-size", type=int, help="Block side for --split blocks (default: adaptive).")
@click.option("--seed", default=0, show_default=True)
def resplit(store, split, train, val, block_size, seed) -> None:
    """Re-split an existing store without its source: new split codes and train statistics, written
    atomically (a loader reading the store meanwhile sees the old split or the new one); tiles untouched.
    For a collection (a folder holding collection.json, or that file): every labelled scene, each split on
    its own labels with these settings, then collection.json's per-tile sample counts written anew."""
    from hsgds.collection import is_collection_path
    from hsgds.preprocess.resplit import check_options
    from hsgds.preprocess.resplit import resplit as run_resplit

    _check_split_options(split, _given_label_options())  # (resplit makes random and block splits only)
    check_options(split, train=train, val=val, block_size=block_size, seed=seed)  # once, also for a collection
    if is_collection_path(store):
        _resplit_collection(store, split, train, val, block_size, seed)
        return
    with _split_warnings():
        run_resplit(store, split, train=train, val=val, block_size=block_size, seed=seed)
    click.echo(f"re-split {store}")
    _echo_split(store)
    click.echo(_NEW_STATISTICS)
    _warn_if_listed(store)


def _warn_if_listed(store: str) -> None:
    """A store re-split on its own inside a collection folder: say that the folder's collection.json still lists
    its old split (`hsgds info` shows those counts; a loader over the collection refuses the scene)."""
    from hsgds.collection import COLLECTION_FILE, open_collection

    path = Path(store).resolve()
    listing = path.parent / COLLECTION_FILE
    if not listing.is_file():
        return
    try:
        named = [e.name for e in open_collection(listing).entries if e.path.resolve() == path]
    except (HsgdsError, OSError):
        return  # a listing that cannot be read is named by the commands that read it
    if named:
        _say(f"hsgds: warning: {listing} still lists scene {named[0]!r} with its old split (a loader over the "
             "collection refuses the scene until it is listed anew): run the `hsgds convert-many` that wrote it "
             f"again (each store keeps its split), or re-split through the collection (`hsgds resplit {path.parent} "
             "...`)")


@cli.command()
@click.argument("store", type=click.Path())
def verify(store) -> None:
    """Re-read every tile and check its size and checksum, and read the labels, samples and statistics. For a
    collection (a folder holding collection.json, or that file): every scene's store, each also checked
    against its entry."""
    from hsgds.collection import is_collection_path
    from hsgds.scene import open_scene

    if is_collection_path(store):
        _verify_collection(store)
        return
    scene = open_scene(store)
    arrays, tiles = scene.verify_parts()
    for p in arrays:
        click.echo(f"hsgds: bad array: {p}", err=True)
    for p in tiles:
        click.echo(f"hsgds: bad tile: {p}", err=True)
    if arrays or tiles:
        damaged = [f"{len(tiles)} of {scene.grid.num_tiles} tiles are damaged"] if tiles else []
        damaged += [f"{counted(len(arrays), 'problem')} in its labels, samples, statistics or nodata map"] if arrays else []
        _fail(f"{', and '.join(damaged)}; convert the source again")
    sums = "crc32c and wsum64" if scene.meta.device_checksums is not None else \
        "crc32c; a format v1 store has no device checksums: convert again for on-device checks"
    checked = ", the nodata map" if scene.has_nodata else ""
    click.echo(f"ok: {counted(scene.grid.num_tiles, 'tile')}, {scene.grid.num_tiles * scene.grid.tile_nbytes} bytes "
               f"verified ({sums}{checked})")


def _resplit_collection(path: str, split: str, train: float, val: float, block_size: int | None, seed: int) -> None:
    """``hsgds resplit`` over a collection. A scene that fails is named and left as it was (each store's
    re-split is atomic); collection.json is rewritten for those that were re-split either way, so it always
    matches the stores. Exit 1 when some scenes failed."""
    from hsgds.collection import SceneEntry, open_collection, write_collection
    from hsgds.info import split_summary
    from hsgds.preprocess.resplit import resplit as run_resplit
    from hsgds.scene import open_scene

    coll = open_collection(path)
    entries, failed, done = list(coll.entries), [], 0
    labelled = [i for i, e in enumerate(coll.entries) if e.num_samples]
    try:
        for i in labelled:
            e = coll.entries[i]
            try:
                coll.scene(i)  # the store collection.json lists, not another one put in its place
                with _split_warnings(f"{e.name}: "):
                    run_resplit(e.path, split, train=train, val=val, block_size=block_size, seed=seed)
                scene = open_scene(e.path)
                entries[i] = SceneEntry.of_scene(e.name, scene, stamps=e.stamps)
                done += 1
                line = split_summary(scene)
                if line:
                    click.echo(f"{e.name}: {line}")
            except HsgdsError as exc:
                failed.append(e.name)
                _say(f"hsgds: failed: {e.name}: {exc}")
    finally:
        # also when the loop is cut short (Ctrl-C, an unexpected error): the stores re-split so far keep their
        # new split, so collection.json must list it
        if done:
            write_collection(coll.root, entries, coll.path.name)
    click.echo(f"re-split {done} of {len(coll)} scenes "
               f"({len(coll) - len(labelled)} unlabelled, {len(failed)} failed)" + (f"; wrote {coll.path}" if done else ""))
    if done:
        click.echo(_NEW_STATISTICS)
    if failed:
        click.echo(f"hsgds: error: {len(failed)} of {len(labelled)} labelled scenes could not be re-split ("
                   f"{listed(failed)}); fix them and run the same "
                   "command again", err=True)
        sys.exit(EXIT_SOME_FAILED)


def _verify_collection(path: str) -> None:
    """``hsgds verify`` over a collection: each scene's problems named as found, the others verified."""
    from hsgds.collection import open_collection

    coll = open_collection(path)
    if not len(coll):  # "ok: 0 scenes" would read as a verified archive
        _fail(f"{coll.path} lists no scenes; run the `hsgds convert-many` that made it again")
    bad: list[str] = []
    tiles = nbytes = 0
    bar: Any = click.progressbar(length=len(coll), label="scenes", file=sys.stderr, show_pos=True
                                 ) if sys.stderr.isatty() else None
    lead = "\n" if bar is not None else ""  # a problem's line starts below the bar
    try:
        for i, name in enumerate(coll.names):
            try:
                scene = coll.scene(i)
                problems = scene.verify()
                unlike = None if problems else coll.listing_problem(i, scene)
                problems += [unlike] if unlike else []
            except HsgdsError as exc:  # missing, unreadable, or not the store collection.json lists
                problems = [str(exc)]
            else:
                tiles += scene.grid.num_tiles
                nbytes += scene.grid.num_tiles * scene.grid.tile_nbytes
            for p in problems:
                click.echo(f"{lead}hsgds: bad scene {name}: {p}", err=True)
            if problems:
                bad.append(name)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.render_finish()
    if bad:
        _fail(f"{len(bad)} of {len(coll)} scenes are damaged ({listed(bad)}); "
              "run the `hsgds convert-many` that made the collection again: it converts only what is missing, "
              "changed or damaged")
    click.echo(f"ok: {len(coll)} scenes, {tiles} tiles, {nbytes} bytes verified")


@cli.command()
@click.option("--reader", default="auto", show_default=True,
              type=click.Choice(["auto", "posix", "posix-pinned", "kvikio"]), help="Reader to check.")
@click.option("--engine", default="auto", show_default=True, type=click.Choice(["auto", "torch", "dali"]),
              help="Engine to check.")
@click.option("--store", type=click.Path(exists=True),
              help="Also say which filesystem this store is on (WSL2: not /mnt/c).")
@click.option("--require-gpu", is_flag=True,
              help="Exit 1 unless hsgds would use a CUDA GPU (a container health check). Without it, exit 1 "
                   "only when the reader or engine asked for (or HSGDS_DEVICE) cannot run here.")
def doctor(reader, engine, store, require_gpu) -> None:
    """What this machine can use (CUDA, kvikio + GDS or compat mode, DALI, the fused CPU cut, WSL) and what
    hsgds would pick."""
    from hsgds.choice import choose
    from hsgds.doctor import cpu_cut_status, doctor_report
    from hsgds.probe import probe

    report = probe(refresh=True)
    click.echo(doctor_report(report, reader=reader, engine=engine, store=store, cpu_cut=cpu_cut_status()))
    try:
        kind = choose(report, reader, engine).kind
    except HsgdsError as exc:  # the reader or engine asked for (or HSGDS_DEVICE) cannot run here: a loader would fail
        click.echo(f"hsgds doctor: unhealthy: {exc}", err=True)
        sys.exit(EXIT_SOME_FAILED)
    if require_gpu and kind != "cuda":
        click.echo(f"hsgds doctor: unhealthy: no usable CUDA GPU ({report.cuda_reason})", err=True)
        sys.exit(EXIT_SOME_FAILED)


def _floats(value: str, n: int, what: str) -> tuple[float, ...]:
    parts = [p for p in value.replace(" ", "").split(",") if p]
    try:
        out = tuple(float(p) for p in parts)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give {n} comma-separated numbers ({what})") from None
    if len(out) != n:
        raise click.BadParameter(f"{value!r}: give {n} comma-separated numbers ({what})")
    return out


@cli.command()
@click.argument("store", type=click.Path())
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Image to write (.png, .pdf, .svg).")
@click.option("--bands", help="Red,green,blue band indices (default: nearest 640/550/460 nm, if known; never a band "
                              "the source flags bad).")
@click.option("--stretch", default="2,98", show_default=True, help="Low,high percentiles of the colour stretch.")
@click.option("--max-size", default=1024, show_default=True, help="Sample larger scenes down to this many pixels.")
@click.option("--dpi", default=120, show_default=True)
def preview(store, out, bands, stretch, max_size, dpi) -> None:
    """False-colour image, class map and split map of a store, side by side (needs hsgds[preview])."""
    from hsgds.preview import render_preview

    rgb = None
    if bands is not None:
        floats = _floats(bands, 3, "red,green,blue band indices")
        if not all(f.is_integer() for f in floats):
            raise click.BadParameter(f"{bands!r}: band indices are integers")
        rgb = tuple(int(f) for f in floats)
    lo, hi = _floats(stretch, 2, "low,high percentiles")
    with _image_warnings():
        path = render_preview(store, out, bands=rgb, percentiles=(lo, hi), max_size=max_size, dpi=dpi)
    click.echo(f"wrote {path}")


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=False),
              help="A torch.export program (.pt2) or a checkpoint saved by `hsgds demo`; saved with "
                   "hsgds.models.save_program / save_checkpoint, it carries the settings it was trained with.")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Class map to write: .tif (GeoTIFF), .png, .hdr (ENVI classification) or .npy. For a "
                   "collection, a path naming each scene's map with {name}, e.g. maps/{name}.tif.")
@click.option("--patch-size", type=int, help="Patch side p (default: the model's).")
@click.option("--batch-size", type=int, help="Patches per model call (default: 1024, or the fixed batch size a "
                                                "program was exported with).")
@click.option("--probabilities", type=click.Path(dir_okay=False),
              help="Also write per-class probabilities to this file: .npy, float16 (H, W, K); or .tif, a float32 "
                   "GeoTIFF of K bands, georeferenced as the map (with {name} for a collection).")
@click.option("--device", default=None, help="cpu, cuda or cuda:N (default: the best usable).")
@click.option("--tta", is_flag=True, help="Test-time augmentation: average the model's probabilities over the "
                                          "8 flips / quarter turns of each patch (8x the model's work; none more at "
                                          "patch size 1, whose 8 are the patch).")
@_errors_in_cli_words
def predict(store, model_path, out, patch_size, batch_size, probabilities, device, tta) -> None:
    """Classify every pixel of STORE with a model and write the class map (georeferenced when the source was).
    For a collection (a folder holding collection.json, or that file): a map per scene. Each scene is
    normalized with its own train statistics (as a loader over the collection does by default), or with
    the statistics a checkpoint carries; a checkpoint's band selection (indices or wavelengths) is applied
    to every scene. Progress: a bar on a terminal; in a log, a line as pixels (and scenes) finish, at most
    every 30 s (HSGDS_PROGRESS_LOG_S), and at the end."""
    from hsgds import writers
    from hsgds.collection import is_collection_path
    from hsgds.models import load_model
    from hsgds.scene import open_scene

    if probabilities is not None and Path(probabilities).suffix.lower() not in writers.PROBABILITY_SUFFIXES:
        _fail(f"--probabilities is written as .npy or a GeoTIFF (.tif); name the file {Path(probabilities).stem}.npy "
              f"or {Path(probabilities).stem}.tif")
    if is_collection_path(store):
        _predict_collection(store, model_path, out, patch_size, batch_size, probabilities, device, tta)
        return
    writers.check_output(out)  # before any work: a bad suffix or missing folder costs nothing
    scene = open_scene(store)
    loaded = load_model(model_path)
    _echo_recipe(model_path, loaded)
    patch_size = _patch_size_for(loaded, model_path, patch_size, str(store), scene.shape[2], scene.wavelengths,
                                 scene.grid.halo, scene.bad_bands)
    _predict_scene(scene, loaded, out, patch_size, batch_size, probabilities, device, tta)


def _echo_recipe(model_path: str, loaded) -> None:
    """Say how every scene will be fed (the lines of ``hsgds info MODEL``): its bands, and whether it is
    normalized with statistics the model file carries or with each scene's own (those of its current split,
    which `hsgds resplit` changes), so that a map is never made from inputs the user did not expect."""
    from hsgds.info import describe_model

    for line in describe_model(model_path, loaded).splitlines()[1:3]:  # its input and normalize lines
        click.echo(line)


def _patch_size_for(loaded, model_path: str, patch_size: int | None, name: str, bands: int,
                    wavelengths: Sequence[float | None] | None, halo: int, bad: Sequence[int] | None) -> int:
    """The patch size to predict scene ``name`` with (``--patch-size`` or the model's), once the model is known
    to take its bands (all of them, or the checkpoint's selection) and the store to serve that size; exit 2
    with what to do otherwise."""
    try:
        loaded.check_scene(model_path, name, bands, wavelengths, bad)
        patch_size = loaded.fitted_patch_size(model_path, patch_size, "--patch-size")
    except HsgdsError as exc:
        _fail(str(exc))
    max_p = 2 * halo + 1
    if patch_size > max_p:
        _fail(f"the model needs {patch_size}x{patch_size} patches but scene {name!r} serves at most {max_p}x{max_p}; "
              f"convert again with --max-patch {patch_size}")
    return patch_size


def _predict_scene(scene, loaded, out: str, patch_size: int, batch_size: int | None, probabilities: str | None,
                   device: str | None, tta: bool) -> None:
    from hsgds.inference import predict as run_predict

    name = Path(scene.path).name
    # a large scene takes minutes; the model file's input (layout, normalization, bands, statistics), the patch
    # size checked above; a PNG map's names the font cannot draw as one line (once the bar ended)
    with _image_warnings(), _progress_bar(f"{name} pixels", f"predict: {name}", "pixel") as progress:
        classmap = run_predict(scene, loaded, patch_size=patch_size, batch_size=batch_size, device=device,
                               probabilities=probabilities or False, out=out, tta=tta, progress=progress)
    counts = np.bincount(classmap.reshape(-1), minlength=2)
    click.echo(f"wrote {out}: {classmap.shape[0]}x{classmap.shape[1]} class map, {counted(int(counts[1:].sum()), 'pixel')} "
               f"predicted into {counted(int(np.count_nonzero(counts[1:])), 'class', 'classes')}"
               + (f", {counted(int(scene.meta.nodata['pixels']), 'pixel')} without data left 0" if scene.has_nodata else "")
               + (f"; probabilities in {probabilities}" if probabilities else ""))
    _echo_test_scores(scene, classmap, loaded.trained_on)


def _echo_test_scores(scene, classmap: np.ndarray, trained_on: dict | None = None) -> None:
    """The map scored against the store's test split (the labelled pixels its train split leaves out): one
    line, when the store has test pixels the map predicted; a labelled store without any says so, and so does
    one whose test pixels the model may have been trained on (``trained_on``: the model file's record)."""
    from hsgds.train import classification_metrics

    if not scene.meta.num_samples:
        return
    y, x, label = scene.samples("test")
    if not len(y):  # (an empty --test-mask): say why no score follows, rather than nothing
        click.echo(f"test split: none: the store's {scene.meta.split.get('method')} split has no test pixels, so "
                   f"the map is not scored (`hsgds info {scene.path}` shows its splits)")
        return
    leak = _trained_on_test_pixels(scene, trained_on)
    if leak is not None:  # a score over pixels it learnt would be no test of the model
        click.echo(f"test split: not scored: {leak}")
        return
    predicted = classmap[y, x].astype(np.int64)
    scored = predicted > 0  # (0: not predicted, outside a mask)
    if not scored.any():
        return
    k = max(scene.meta.num_classes, int(predicted.max()))
    _, _, train_label = scene.samples("train")
    m = classification_metrics(label[scored] - 1, predicted[scored] - 1, k,
                               train_pixels=np.bincount(train_label.astype(np.int64) - 1, minlength=k))
    click.echo(f"test split: {counted(int(scored.sum()), 'pixel')} of the store's labels: OA {m.oa:.2%}, AA {m.aa:.2%}, "
               f"kappa {m.kappa:.4f}")
    names = list(scene.class_names or ())
    if m.untested:
        click.echo(f"test split: AA averages {len(m.per_class) - len(m.untested)} of {counted(len(m.per_class), 'class', 'classes')}; "
                   f"{_classes_named(m.untested, names)} {'has' if len(m.untested) == 1 else 'have'} no test pixels")
    untrained = _scored_untrained(m)
    if untrained:
        click.echo(f"test split: {_aa_trained(m)}; {_classes_named(untrained, names)} "
                   f"{'has' if len(untrained) == 1 else 'have'} no train pixels in the store's split: scored, never "
                   "trained on")


def _trained_on_test_pixels(scene, trained_on: dict | None) -> str | None:
    """Why the store's test pixels may be pixels the model was trained on, or None: it was trained on this
    scene's labels (the same labels file) with the test pixels in its split, or under another split of them
    (the store re-split, or converted again with another split, since). None when unknown (a model file
    saved without loader=, or by an older hsgds) or trained on other scenes."""
    from hsgds.collection import split_record

    record = split_record(scene)
    if trained_on is None or record is None:
        return None
    same_labels = [r for r in trained_on["scenes"] if r["labels"] == record["labels"]]
    if not same_labels:
        return None
    split = trained_on["split"]
    if split not in ("train", "val", "none"):  # None: every labelled pixel
        taken = "every labelled pixel" if split is None else f"its {split} pixels"
        return (f"the model was trained on {taken} of this scene (a loader with split={split!r}), so its test "
                "pixels were trained on; score a model trained with split='train'")
    if all(r["split"] != record["split"] for r in same_labels):
        return ("the model was trained on this scene's labels under another split (the store was re-split or "
                "converted again since), so some of its test pixels may have been trained on; score it on the "
                "split it was trained on, or train again on this one")
    return None


def _scored_untrained(m) -> tuple[int, ...]:
    """The classes (indices) a Metrics scored without their having train pixels: guaranteed errors in AA."""
    return tuple(i for i in m.untrained if m.test_pixels[i] > 0)


def _aa_trained(m) -> str:
    """"AA over the 14 trained classes 91.20%": AA without the classes that had no train pixels."""
    n = len(m.trained_scored)
    value = "n/a" if n == 0 else f"{m.aa_trained:.2%}"
    return f"AA over the {counted(n, 'trained class', 'trained classes')} {value}"


def _classes_named(indices: Sequence[int], names: Sequence[str]) -> str:
    """"classes 1 (Alfalfa), 9 (Oats)": class indices as the label map numbers them, with their names."""
    shown = [f"{i + 1} ({names[i]})" if i < len(names) else str(i + 1) for i in indices]
    return f"{'class' if len(shown) == 1 else 'classes'} {listed(shown, limit=8)}"


def _predict_collection(path: str, model_path: str, out: str, patch_size: int | None, batch_size: int | None,
                        probabilities: str | None, device: str | None, tta: bool) -> None:
    """``hsgds predict`` over a collection: every scene checked against the model and every output path
    before any work (exit 2); then a map per scene, a scene that fails named while the others are
    predicted (exit 1)."""
    from hsgds.choice import choose
    from hsgds.collection import open_collection
    from hsgds.errors import as_count
    from hsgds.inference import RunInputs, check_outputs
    from hsgds.models import load_model
    from hsgds.probe import probe

    for option, value in (("-o", out), ("--probabilities", probabilities)):
        if value is not None and "{name}" not in value:
            given = Path(value)  # the example is the user's own path with {name} in it (not -o's for --probabilities)
            example = given.with_name(f"{given.stem}_{{name}}{given.suffix}")
            _fail(f"{option} {value} would be written once per scene of the collection; name each scene's file "
                  f"with {{name}}, e.g. {example}")
    if probabilities is not None and Path(probabilities).resolve() == Path(out).resolve():
        _fail(f"--probabilities and -o would both write {out}; name another file")
    # options wrong for every scene (exit 2 once, as for one store, not a failure per scene)
    if batch_size is not None:
        as_count(batch_size, "batch_size")
    choose(probe(), device=device)
    coll = open_collection(path)
    for name in coll.names:  # {name} makes each name a file name (convert-many's are; a hand-written listing's may not be)
        if name in (".", "..") or any(c in name for c in "/\\\0"):
            _fail(f"scene {name!r} of {path} cannot name a file in -o's {{name}} (a slash, a backslash, or . or ..: its "
                  "map would go to another folder); rename the scene in collection.json")
    loaded = load_model(model_path)
    _echo_recipe(model_path, loaded)

    def opened():
        for i in range(len(coll)):
            with suppress(StoreError):  # a missing or damaged store: its own run names it
                yield coll.scene(i)

    inputs = RunInputs(opened(), model_path)  # every scene's files: one scene's map must not replace another's source
    _refuse_shared_outputs(coll.names, out, probabilities)
    sizes = []
    for i, e in enumerate(coll.entries):
        halo = e.halo if e.halo is not None else coll.scene(i).grid.halo
        # (bad bands not listed, in an older collection.json: the scene's loader refuses it if need be)
        bad = None if isinstance(e.bad_bands, Unset) else e.bad_bands
        sizes.append(_patch_size_for(loaded, model_path, patch_size, e.name, e.bands, e.wavelengths, halo, bad))
        try:  # (a scene's source named by the pattern is refused here, before any scene is predicted)
            check_outputs(coll.scene(i), Path(out.replace("{name}", e.name)),
                          Path(probabilities.replace("{name}", e.name)) if probabilities else False, inputs,
                          loaded.class_names)
        except StoreError:
            pass  # a missing or damaged store: its own run names it while the others are predicted
        except HsgdsError as exc:
            _fail(f"{e.name}: {exc}")
    failed = []
    log = None if sys.stderr.isatty() else _LogProgress("predict", "scene")  # a batch job's log: scenes done
    for i, e in enumerate(coll.entries):
        try:
            _predict_scene(coll.scene(i), loaded, out.replace("{name}", e.name), sizes[i], batch_size,
                           probabilities.replace("{name}", e.name) if probabilities else None, device, tta)
        except (HsgdsError, OSError) as exc:  # (an output file system's error too: the other scenes go on)
            failed.append(e.name)
            _say(f"hsgds: failed: {e.name}: {_in_command_words(one_line(exc))}")
        if log is not None:
            log.update(i + 1, len(coll), len(failed))
    if failed:
        click.echo(f"hsgds: error: {len(failed)} of {len(coll)} scenes could not be predicted ("
                   f"{listed(failed)}); fix them and run the same "
                   "command again", err=True)
        sys.exit(EXIT_SOME_FAILED)


def _refuse_shared_outputs(names: Sequence[str], out: str, probabilities: str | None) -> None:
    """Exit 2 when two scenes' outputs would be one file (scenes x and x.p with -o {name}.npy and
    --probabilities {name}.p.npy; an ENVI map's .img, a GeoTIFF's sidecar): the later scene would replace
    the earlier one's output without a word."""
    import os

    from hsgds.writers import files_written

    writer: dict[str, str] = {}
    for name in names:
        paths = [*files_written(out.replace("{name}", name)),
                 *([Path(probabilities.replace("{name}", name))] if probabilities else [])]
        for p in paths:
            first = writer.setdefault(os.path.normcase(p.resolve()), name)
            if first != name:
                _fail(f"scenes {first!r} and {name!r} would both write {p}; name the outputs so that each scene's "
                      "differ (e.g. -o maps/{name}.tif --probabilities probs/{name}.npy)")


def demo_store(refresh: bool = False) -> Path:
    """Convert the real Indian Pines scene (shipped in the tensorly wheel) into the cache directory (once) and
    return the store."""
    from hsgds import defaults
    from hsgds.datasets import INDIAN_PINES_CLASSES, indian_pines_files
    from hsgds.preprocess.convert import ConvertOptions
    from hsgds.preprocess.convert import convert as run_convert

    store = Path(defaults.get("cache_dir")) / "indian_pines.zarr"
    if refresh or not (store / "zarr.json").is_file():
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot make the cache folder {store.parent} ({exc.strerror or exc}); set "
                             "HSGDS_CACHE_DIR to a writable folder") from None
        cube, gt = indian_pines_files()
        click.echo(f"converting Indian Pines ({cube.name}) into {store}", err=True)
        run_convert(cube, store, ConvertOptions(labels=gt, class_names=INDIAN_PINES_CLASSES, overwrite=True))
    return store


_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


@cli.command()
@click.option("--refresh", is_flag=True, help="Convert the scene again even if the cache has it.")
@click.option("--epochs", default=40, show_default=True, type=click.IntRange(min=0),
              help="Training epochs (0: convert and describe only).")
@click.option("--patch-size", default=9, show_default=True, help="Patch side p (odd, at most 15).")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--device", default=None, help="cpu, cuda or cuda:N (default: the best usable).")
@click.option("--seed", default=0, show_default=True)
@click.option("-o", "--output-dir", "out_dir", default="hsgds-demo", show_default=True, type=click.Path(file_okay=False),
              help="Where the report, the model checkpoint and the class map go.")
@click.option("--augment", is_flag=True, help="Train with on-device augmentation: flips, quarter turns, "
                                              "radiation noise (p=0.1), band dropout (p=0.05).")
@click.option("--class-balance", default=0.5, show_default=True, type=click.FloatRange(min=0, max=4),
              help="Weigh each class's loss by (largest class / its train pixels) ** this: rare classes get "
                   "learned (0: plain cross-entropy).")
def demo(refresh, epochs, patch_size, batch_size, device, seed, out_dir, augment, class_balance) -> None:
    """Convert the real Indian Pines scene (from the tensorly wheel; once, into the cache), describe it,
    train a small spectral-spatial CNN with PatchLoader, print OA, AA and kappa on the test split with the
    loader statistics, save the model, predict the whole scene and write the class map (prediction | ground
    truth | errors) and a JSON report into --output-dir."""
    import json

    from hsgds import format as fmt
    from hsgds.info import describe, leakage
    from hsgds.scene import open_scene
    from hsgds.writers import atomic_path

    largest = 2 * fmt.DEFAULT_HALO + 1  # what the demo's store serves
    if patch_size < 1 or patch_size % 2 == 0 or patch_size > largest:
        _fail(f"--patch-size {patch_size}: the demo's patches are odd and at most {largest}x{largest}; "
              f"pass an odd size from 1 to {largest}")
    store = demo_store(refresh)
    click.echo(describe(store))
    scene = open_scene(store)
    problems = scene.verify()
    if problems:
        _fail(f"{problems[0]} (run `hsgds demo --refresh`)")
    click.echo("verify:     all tiles intact")
    if epochs <= 0:
        return
    from hsgds.loader import describe_stats
    from hsgds.train import run_demo

    click.echo("")
    from hsgds.augment import Augment

    aug = Augment(flip=True, rot90=True, radiation_noise=0.1, band_dropout=0.05) if augment else None
    made_folder = not Path(out_dir).exists()
    try:
        r = run_demo(store, epochs=epochs, patch_size=patch_size, batch_size=batch_size, device=device, seed=seed,
                     out_dir=out_dir, log=click.echo, augment=aug, class_balance=class_balance)
    except BaseException:
        if made_folder and Path(out_dir).is_dir() and not any(Path(out_dir).iterdir()):
            Path(out_dir).rmdir()  # a failed run leaves nothing behind
        raise
    m, t = r["metrics"], r["train"]
    names = r["class_names"] or [f"class {i + 1}" for i in range(len(m.per_class))]
    untested = sum(v != v for v in m.per_class)  # NaN recall: the class has no test pixel
    averaged = (f" ({len(m.per_class) - untested} of {len(m.per_class)} classes; {untested} "
                f"{'has' if untested == 1 else 'have'} no test pixels)") if untested else ""
    click.echo(f"\ntest split ({r['test_pixels']} pixels):  OA {100 * m.oa:.2f}%   AA {100 * m.aa:.2f}%{averaged}   "
               f"kappa {m.kappa:.4f}")
    untrained = _scored_untrained(m)
    if untrained:  # guaranteed errors: AA without them is what the model learned
        click.echo(f"            {_aa_trained(m)}; {_classes_named(untrained, names)} "
                   f"{'has' if len(untrained) == 1 else 'have'} no train pixels: scored, never trained on")

    def scored(i: int, name: str, recall: float) -> str:
        if recall != recall:  # NaN recall: the class has no test pixel
            return f"{name} (no train or test pixels)" if i in m.untrained else f"{name} (no test pixels)"
        return f"{name} {100 * recall:.0f}%" + (" (no train pixels)" if i in m.untrained else "")

    click.echo("per class:  " + ", ".join(scored(i, n, v) for i, (n, v) in enumerate(zip(names, m.per_class))))
    click.echo(f"training:   {t.steps} steps in {t.elapsed_s:.1f} s ({t.steps_per_s:.1f} steps/s, "
               f"{t.samples / max(t.elapsed_s, 1e-9):.0f} patches/s), {100 * t.stall_fraction:.1f}% of it waiting "
               f"for data; evaluation {r['eval_s']:.1f} s; whole-scene prediction {r['predict_s']:.1f} s")
    ls = r["train_loader"]
    click.echo(f"loader:     {describe_stats(ls)}")
    leak = leakage(scene, patch_size)  # one max filter over the scene's split map: cheap
    split = {**scene.meta.split, "leakage": {"patch_size": leak.patch_size, "test_pixels": leak.test,
                                             "test_pixels_overlapping_train": leak.leaky, "val_pixels": leak.val,
                                             "val_pixels_overlapping_train": leak.val_leaky}}
    report = {"store": str(store), "model": r["model"], "settings": r["settings"], "device": r["device"],
              "split": split, "test_pixels": r["test_pixels"], "metrics": m.as_dict(), "class_names": r["class_names"],
              "train": t.as_dict(), "eval_s": r["eval_s"], "predict_s": r["predict_s"],
              "train_loader": ls, "checkpoint": r["checkpoint"], "classmap": r["classmap"]}
    report_path = Path(out_dir) / "report.json"
    with atomic_path(report_path) as tmp:
        tmp.write_text(json.dumps(report, indent=1) + "\n")
    click.echo(f"wrote:      {report_path}, {r['checkpoint']} (use with `hsgds predict STORE --model ...`), "
               f"{r['classmap']}")


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--patch-size", type=int, help="Patch side p (default: 13, or the largest the store serves).")
@click.option("--batch-size", default=256, show_default=True)
@click.option("--split", default="train", show_default=True, type=click.Choice(["train", "val", "test", "none", "all"]),
              help="The pixels to time: a split's, 'none' (labelled but in no split) or 'all' labelled pixels; "
                   "with --pixels all, the unlabelled pixels too ('train': less the val and test pixels).")
@click.option("--pixels", default="labelled", show_default=True, type=click.Choice(["labelled", "all"]),
              help="'all': patches centred on every pixel, as for pretraining on unlabelled scenes; the model is "
                   "then trained on unlabelled pixels as class 0 (a store without classes: a 2-class head), a "
                   "step that costs what a labelled one does.")
@click.option("--steps", default=10, show_default=True, help="Timed training steps (after 2 warm-up steps).")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(sorted(_DTYPES)))
@click.option("--device", default=None, help="cpu, cuda or cuda:N (default: the best usable).")
@click.option("--engine", default="auto", show_default=True)
@click.option("--reader", default="auto", show_default=True)
@click.option("--wavelengths", help="Band centres in nm, comma-separated: each scene's nearest band to each, never "
                                    "one its source flags bad (a collection of scenes with different band "
                                    "counts needs them), as "
                                    "PatchLoader(wavelengths=[...]).")
@click.option("--wavelength-tolerance", default=5.0, show_default=True,
              help="Largest distance in nm from a wavelength to the band taken for it.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurements as JSON.")
@_errors_in_cli_words
def bench(store, patch_size, batch_size, split, pixels, steps, dtype, device, engine, reader, wavelengths,
          wavelength_tolerance, as_json) -> None:
    """Measure t_io (reading STORE: a store, or a collection folder), t_compute (the demo's model on resident
    batches) and the end-to-end loop; say whether training is input-bound and the best possible speed-up."""
    import json

    import torch

    from hsgds.bench import bench_store, format_report

    nm = None
    if wavelengths is not None:  # any count of numbers: the loader checks them against each scene's bands
        nm = _floats(wavelengths, len([w for w in wavelengths.split(",") if w.strip()]), "band centres in nm")
    r = bench_store(store, patch_size=patch_size, batch_size=batch_size, split=None if split == "all" else split,
                    steps=steps, device=device, dtype=getattr(torch, _DTYPES[dtype]), engine=engine, reader=reader,
                    pixels=pixels, wavelengths=nm, wavelength_tolerance=wavelength_tolerance,
                    log=None if as_json else (lambda msg: click.echo(msg, err=True)))
    click.echo(json.dumps(r.as_dict(), indent=1) if as_json else format_report(r))


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="hsgds", standalone_mode=True)
    except HsgdsError as exc:
        _fail(str(exc))
    except ModuleNotFoundError as exc:  # torch is installed apart (its build matches the CUDA): a base install lacks it
        if (exc.name or "").split(".")[0] != "torch" or _torch_installed():
            raise  # another module, or a submodule an installed torch lacks: not "PyTorch is not installed"
        _fail(NO_TORCH)
    except OSError as exc:  # a file we were pointed at cannot be used
        _fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))


if __name__ == "__main__":
    main()
