"""``hsgds bench STORE``: is training on this store input-bound, and how much could a faster input help?

Three measurements on the same device, batch and patch size:

- ``t_io``: reading the split's tiles from storage with the reader hsgds uses (once, as an epoch does), and
  the loader alone (read + cut + normalize) per batch, with nothing consuming the batches;
- ``t_compute``: one training step of the model on batches already resident on the device (the ceiling);
- the end-to-end loop: PatchLoader feeding the same training step.

With ``pixels="all"`` (every pixel, e.g. pretraining on unlabelled scenes) the demo model still needs
targets: unlabelled pixels (label -1) are trained as class 0, a step as costly as a labelled one; a store
without classes gets a head of :data:`STAND_IN_CLASSES`.

Training is input-bound when the loader's time per batch exceeds the compute step (or the end-to-end loop
waits for data a noticeable part of the time). The best possible speed-up from a faster input pipeline is
``t_end_to_end / t_compute`` (input made free); from a faster model, ``t_end_to_end / t_loader``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hsgds.errors import ConfigError, shown
from hsgds.train import synchronize

__all__ = ["BenchReport", "bench_store", "format_report"]

#: stall fraction above which the loop is called input-bound even if the loader alone looks fast enough
STALL_INPUT_BOUND = 0.05
#: classes of the demo model's head with pixels="all" over scenes without classes (any count costs the same)
STAND_IN_CLASSES = 2


@dataclass
class BenchReport:
    store: str
    device: str
    reader: str
    engine: str
    patch_size: int
    batch_size: int
    dtype: str
    tiles: int
    tile_bytes: int
    t_io_s: float  # reading the split's tiles once
    io_GBps: float
    loader_batch_s: float  # loader alone, per batch (read + cut), steady state
    loader_patches_per_s: float
    compute_step_s: float  # model step on resident batches
    e2e_step_s: float  # loader + model step
    e2e_stall_fraction: float
    steps: int
    pixels: str = "labelled"  # "all": every pixel, unlabelled ones trained as class 0

    @property
    def input_bound(self) -> bool:
        return self.loader_batch_s > self.compute_step_s or self.e2e_stall_fraction > STALL_INPUT_BOUND

    @property
    def best_speedup_from_input(self) -> float:
        """End-to-end step / compute-only step: what an infinitely fast input pipeline would give (>= 1)."""
        return max(1.0, self.e2e_step_s / self.compute_step_s)

    @property
    def best_speedup_from_compute(self) -> float:
        """End-to-end step / loader-only batch time: what an infinitely fast model would give (>= 1)."""
        return max(1.0, self.e2e_step_s / self.loader_batch_s)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "input_bound": self.input_bound,
                "best_speedup_from_input": self.best_speedup_from_input,
                "best_speedup_from_compute": self.best_speedup_from_compute}


def _read_tiles(loader: Any) -> tuple[int, int, float]:
    """Read every tile holding samples of the loader's split once, into one ring slot; (tiles, bytes, seconds).
    Bytes are each tile's own: over several scenes, tiles differ in size."""
    import numpy as np

    if loader.device.type == "cpu":
        from hsgds.engines import cpu_cut

        cpu_cut.wait_for_warm_up()  # the loader's background kernel load would be timed with the reads
    counts = loader.samples.counts()
    tiles = [int(t) for t in np.flatnonzero(counts)]
    ring = loader.ring  # before the first epoch: slot 0 is free to read into
    t0 = time.perf_counter()
    for t in tiles:
        # the slot as this tile's destination: over scenes of several tile sizes slots hold the largest, and a
        # smaller tile read into a whole slot was taken for a damaged store
        ring.reader.read_into(t, ring.tile_view(0, t))
    synchronize(loader.device)
    seconds = time.perf_counter() - t0
    return len(tiles), sum(ring.reader.source.tile_nbytes(t) for t in tiles), seconds


DEFAULT_PATCH = 13


def bench_store(store: Any, *, patch_size: int | None = None, batch_size: int = 256, split: str | None = "train",
                steps: int = 10, warmup: int = 2, device: Any = None, dtype: torch.dtype = torch.float32,
                engine: str = "auto", reader: str = "auto", seed: int = 0, log: Any = None,
                pixels: str = "labelled", wavelengths: Sequence[float] | None = None,
                wavelength_tolerance: float = 5.0) -> BenchReport:
    """Measure t_io, t_compute and the end-to-end loop for the demo model on ``store``; ``patch_size`` None:
    13, or the largest the store serves when that is smaller. ``pixels``: the loader's ("all": every pixel,
    unlabelled ones trained as class 0). ``wavelengths`` (nm) and ``wavelength_tolerance``: the loader's band
    selection, which scenes of several sensors (different band counts) need; the model then takes that many."""
    from hsgds.loader import PatchLoader
    from hsgds.models import SpectralSpatialCNN
    from hsgds.scene_set import open_scene_set
    from hsgds.train import compute_only, train_steps

    say = log or (lambda msg: None)
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {shown(steps)}")
    if warmup < 0:
        raise ConfigError(f"warmup must be >= 0, got {shown(warmup)}")
    ss = open_scene_set(store)
    if pixels == "labelled" and not any(s.num_samples for s in ss.scenes):
        # the loader would say "no train pixels": true, but the fix for an unlabelled scene is to time every pixel
        where = f"{ss.scenes[0].path} has" if len(ss.scenes) == 1 else f"the {len(ss.scenes)} scenes have"
        raise ConfigError(f"{where} no labelled pixels to time; pass --pixels all (pixels='all') to time patches "
                          "centred on every pixel")
    if patch_size is None:
        patch_size = min(DEFAULT_PATCH, *(2 * s.grid.halo + 1 for s in ss.scenes))

    def loader(**kw: Any) -> PatchLoader:
        return PatchLoader(store, patch_size=patch_size, batch_size=batch_size, split=split, device=device,
                           dtype=dtype, engine=engine, reader=reader, seed=seed, pixels=pixels,
                           wavelengths=wavelengths, wavelength_tolerance=wavelength_tolerance, **kw)

    def targets(y: torch.Tensor) -> torch.Tensor:
        # cross-entropy refuses label -1 (an unlabelled pixel); class 0 costs the step what a label would
        return y.clamp(min=0) if pixels == "all" else y

    with loader() as ld:
        dev = ld.device
        scene = ld.scene
        if pixels == "all":  # (not samples.label: every pixel's label, memory per pixel)
            classes = max(int(s.num_classes or 0) for s in ss.scenes) or STAND_IN_CLASSES
        else:
            classes = scene.num_classes or int(ld.samples.label.max()) + 1
        ntiles, io_bytes, t_io = _read_tiles(ld)
        # what was measured: one store, or the collection (or list of stores) given, not its first scene
        where = str(scene.path) if len(ld.scenes) == 1 else (
            str(store) if isinstance(store, (str, os.PathLike)) else f"{len(ld.scenes)} scenes")
        say(f"t_io: {ntiles} tiles ({io_bytes / 2**20:.1f} MiB) read in {t_io:.3f} s")
        # loader alone: one warm-up epoch (reads), then the steady state over up to 4*steps batches
        for _ in ld:
            pass
        n = b = 0
        target = max(4, 4 * steps)
        synchronize(dev)
        t0 = time.perf_counter()
        while b < target:
            got = 0
            for x, _ in ld:
                n, b, got = n + len(x), b + 1, got + 1
                if b >= target:
                    break
            if got == 0:
                break
        synchronize(dev)
        t_loader = (time.perf_counter() - t0) / max(1, b)
        patches_per_s = n / (t_loader * b) if t_loader > 0 and b else float("inf")  # counts short batches
        say(f"loader alone: {1e3 * t_loader:.1f} ms per batch ({patches_per_s:.0f} patches/s)")
        resident = []
        for x, y in ld:
            resident.append((x.float().clone(), targets(y).clone()))
            if len(resident) == 4:
                break
        names = (ld.stats.reader, ld.stats.engine)
        bands = scene.shape[2] if wavelengths is None else len(wavelengths)
    torch.manual_seed(seed)
    model = SpectralSpatialCNN(bands, classes, patch_size).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ceiling = compute_only(model, resident, opt, steps=steps, warmup=warmup)
    del resident
    say(f"t_compute: {1e3 * ceiling.step_s:.1f} ms per step on resident batches")
    torch.manual_seed(seed)
    model = SpectralSpatialCNN(bands, classes, patch_size).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def batches():
        with loader() as ld2:
            epoch = 0
            while True:
                ld2.set_epoch(epoch)
                yield from ((x, targets(y)) for x, y in ld2)
                epoch += 1

    e2e = train_steps(model, batches(), opt, device=dev, steps=steps, warmup=warmup,
                      dtype=torch.float32 if dtype != torch.float32 else None)
    say(f"end to end: {1e3 * e2e.step_s:.1f} ms per step, {100 * e2e.stall_fraction:.1f}% waiting for data")
    return BenchReport(store=where, device=str(dev), reader=names[0], engine=names[1],
                       patch_size=patch_size, batch_size=batch_size, dtype=str(dtype).removeprefix("torch."),
                       tiles=ntiles, tile_bytes=scene.grid.tile_nbytes, t_io_s=t_io,
                       io_GBps=io_bytes / t_io / 1e9 if t_io > 0 else float("inf"), loader_batch_s=t_loader,
                       loader_patches_per_s=patches_per_s,
                       compute_step_s=ceiling.step_s, e2e_step_s=e2e.step_s, e2e_stall_fraction=e2e.stall_fraction,
                       steps=e2e.steps, pixels=pixels)


def format_report(r: BenchReport) -> str:
    """The human summary printed by ``hsgds bench``."""
    lines = [
        f"store:        {r.store}",
        f"setup:        {r.device}, reader {r.reader}, engine {r.engine}, p={r.patch_size}, batch {r.batch_size}, "
        f"{r.dtype}, model SpectralSpatialCNN (the demo's)"
        + ("; every pixel, unlabelled ones trained as class 0" if r.pixels == "all" else ""),
        f"t_io:         {r.t_io_s:.3f} s to read {r.tiles} tiles ({r.io_GBps:.2f} GB/s)",
        f"loader alone: {1e3 * r.loader_batch_s:.1f} ms/batch ({r.loader_patches_per_s:.0f} patches/s)",
        f"t_compute:    {1e3 * r.compute_step_s:.1f} ms/step (model on resident batches)",
        f"end to end:   {1e3 * r.e2e_step_s:.1f} ms/step, {100 * r.e2e_stall_fraction:.1f}% of it waiting for data "
        f"({r.steps} steps)",
    ]
    if r.input_bound:
        lines.append(f"verdict:      INPUT-BOUND: the loader limits training; a faster input pipeline could speed "
                     f"it up by at most {r.best_speedup_from_input:.2f}x")
    else:
        lines.append(f"verdict:      compute-bound: the model limits training; a faster input pipeline can gain at "
                     f"most {r.best_speedup_from_input:.2f}x; a faster model could run up to "
                     f"{r.best_speedup_from_compute:.1f}x faster before this loader limits it")
    return "\n".join(lines)
