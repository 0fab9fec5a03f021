"""hsgds against every loader a user would pick, side by side in one run; JSON on stdout.

Contenders (same scene, patch size, batch size, output dtype and normalization; see contenders.py):
naive DataLoader (per-patch reads of a memory-mapped .npy, no workers), tuned DataLoader (cube in RAM,
a worker per core, persistent, prefetching, pinned on GPU), a shared-memory worker ring (spawned resident
workers, cube and batch slots in shared memory, empty/full semaphores), on GPU the kvikio GDSStore read
by zarr-python (raw tile reads), and hsgds's PatchLoader with every engine and reader usable here.

Measured per contender: patches/s and delivered GB/s (patch bytes in the output dtype) in the steady
state (second epoch; the first one includes start-up and, for cold runs, the reads), time to first batch
(from constructing the loader), bytes read from storage per epoch, peak host RSS (the process and its
workers) and peak device memory; the machine's ceilings in the same run: memcpy write bandwidth into a
preallocated batch-sized buffer (torch and numpy on one thread, and numpy on as many threads as hsgds cuts
with: the best of them), a raw read of the store's tiles at the ring's queue depth, and on GPU the
device-to-device copy. End to end: the Hamida-style 3-D CNN of hsgds.models (or, with
--e2e-model SpectralSpatialCNN, the demo's small 2-D CNN: a fast step) trained for a fixed number of steps
with each loader, against the same step on batches already resident (the compute-only ceiling): steps/s
and the fraction of time the loop waited for data.

Cold-cache runs drop each file's pages (fsync + posix_fadvise DONTNEED) before every contender; warm runs
read each file once first. With no arguments: a quick run (Indian Pines, synthetic if tensorly is missing,
and a Pavia-University-sized synthetic scene; warm cache; CUDA when usable). Logs go to stderr.

    python benchmarks/bench_loader.py [--scenes indian_pines,pavia,aviris] [--patch 13] [--batch 256]
        [--dtypes float32,bfloat16] [--cache warm,cold] [--batches 30] [--repeats 1] [--e2e-steps N] [--e2e-model M]
        [--aviris-size 1024] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contenders import ShmRingLoader, naive_loader, tuned_loader  # noqa: E402

import hsgds  # noqa: E402
from hsgds import defaults  # noqa: E402
from hsgds.errors import DependencyError  # noqa: E402
from hsgds.probe import probe  # noqa: E402
from hsgds.train import synchronize  # noqa: E402

SCENES = ("indian_pines", "pavia", "aviris")
GB = 1e9


def log(msg: str) -> None:
    print(f"[bench_loader {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- machine

def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine(device: torch.device, cpu_threads: int | None = None) -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    mem = None
    try:
        import psutil

        mem = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    gpu = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = {"name": props.name, "memory_GiB": round(props.total_memory / 2**30, 1)}
    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                "hsgds": hsgds.__version__}
    for dist in ("zarr", "numba", "kvikio-cu12", "kvikio-cu13", "nvidia-dali-cuda120", "nvidia-dali-cuda130", "psutil",
                 "matplotlib", "tensorly"):
        versions[dist] = _version(dist)
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "hsgds_cpu_threads": cpu_threads or torch.get_num_threads(),
            "memory_GiB": mem, "load_avg_1min_at_start": load,
            "device": str(device), "gpu": gpu, "versions": versions}


# --------------------------------------------------------------------------------------------- scenes

@dataclass
class SceneData:
    name: str
    source: str
    store: Path
    padded: Path  # .npy of the cube reflect-padded by the patch radius
    shape: tuple[int, int, int]
    dtype: str
    ys: np.ndarray  # sample centres (scene coords) = top-left corners in the padded cube
    xs: np.ndarray
    labels: np.ndarray  # class index (stored label - 1)
    classes: int
    offset: np.ndarray
    scale: np.ndarray

    def files(self) -> list[Path]:
        return [self.padded, *hsgds.open_scene(self.store).tile_paths]


def _scene_arrays(name: str, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, str, tuple[str, ...] | None]:
    from hsgds.synthetic import make_scene

    if name == "indian_pines":
        try:
            from hsgds.datasets import INDIAN_PINES_CLASSES, indian_pines_files

            cube, gt = indian_pines_files()
            return np.load(cube, allow_pickle=False), np.load(gt, allow_pickle=False), "Indian Pines (AVIRIS, tensorly 0.10.0)", INDIAN_PINES_CLASSES
        except DependencyError as exc:
            log(f"Indian Pines unavailable ({exc}); using a synthetic scene of its size")
            c, g = make_scene(145, 145, 200, classes=16, dtype="uint16", seed=0)
            return c, g, "synthetic, Indian-Pines-sized (145x145x200 uint16; tensorly missing)", None
    if name == "pavia":
        c, g = make_scene(610, 340, 103, classes=9, dtype="uint16", seed=1)
        return c, g, "synthetic, Pavia-University-sized (610x340x103 uint16)", None
    if name == "aviris":
        s = args.aviris_size
        c, g = make_scene(s, s, 224, classes=16, dtype="int16", seed=2, labelled_fraction=0.3)
        return c, g, f"synthetic, AVIRIS-flight-line-like ({s}x{s}x224 int16)", None
    raise SystemExit(f"unknown scene {name!r}; choose from {', '.join(SCENES)}")


def prepare(name: str, work: Path, args: argparse.Namespace) -> SceneData:
    from hsgds.preprocess.convert import ConvertOptions, convert

    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    cube, gt, source, class_names = _scene_arrays(name, args)
    np.save(d / "cube.npy", cube)
    np.save(d / "gt.npy", gt)
    store = convert(d / "cube.npy", d / "scene.zarr",
                    ConvertOptions(labels=d / "gt.npy", max_patch=max(15, args.patch, args.e2e_patch or 0),
                                   class_names=class_names, overwrite=True))
    r = args.patch // 2
    np.save(d / "padded.npy", np.pad(cube, ((r, r), (r, r), (0, 0)), mode="reflect"))
    (d / "cube.npy").unlink()
    scene = hsgds.open_scene(store)
    ys, xs, lab = scene.samples(None)
    offset, scale = hsgds.normalization_constants(scene, "zscore")
    return SceneData(name, source, Path(store), d / "padded.npy", tuple(cube.shape), str(cube.dtype),
                     ys.astype(np.int64), xs.astype(np.int64), lab.astype(np.int64) - 1,
                     int(scene.num_classes or lab.max()), offset, scale)


# --------------------------------------------------------------------------------------------- caches

def drop_cache(paths: list[Path]) -> bool:
    """Drop the page cache of each file (fsync first: dirty pages cannot be dropped). False if unsupported."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def warm_cache(paths: list[Path]) -> None:
    buf = bytearray(1 << 22)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


# --------------------------------------------------------------------------------------------- probes

class Sampler:
    """Peak RSS of this process and its children, sampled every 10 ms while active.

    Cheap on purpose: it runs beside the loader it measures. This process's RSS is one read of
    /proc/self/statm (~10 us); the list of child processes (a scan of /proc, ~1.3 ms on the 2-core VM) is
    refreshed every 0.5 s, not every sample. Scanning every 10 ms took ~13% of a core and the GIL with it,
    and cost the loaders that use both cores 7-13% of their patches/s (measured side by side).
    """

    CHILDREN_EVERY = 50  # samples between scans for child processes (DataLoader workers live for the epoch)

    def __init__(self) -> None:
        try:
            import psutil

            self._proc = psutil.Process()
        except ImportError:
            self._proc = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._children: list[Any] = []
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _own_rss(self) -> int:
        try:
            with open("/proc/self/statm", "rb") as f:
                return int(f.read().split()[1]) * self._page
        except OSError:  # not Linux
            return self._proc.memory_info().rss

    def _rss(self, scan: bool) -> int:
        if scan:
            self._children = self._proc.children(recursive=True)
        total = self._own_rss()
        for c in self._children:
            try:
                total += c.memory_info().rss
            except Exception:  # the child exited
                pass
        return total

    def __enter__(self) -> Sampler:
        if self._proc is not None:
            def run() -> None:
                n = 0
                while not self._stop.wait(0.01):
                    n += 1
                    try:
                        self.peak = max(self.peak, self._rss(n % self.CHILDREN_EVERY == 0))
                    except Exception:
                        pass

            self.peak = self._rss(True)
            self._thread = threading.Thread(target=run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._proc is not None:
            self.peak = max(self.peak, self._rss(True))


def io_read_bytes() -> int | None:
    """Bytes this process and its live children read from storage (Linux /proc/<pid>/io read_bytes)."""
    try:
        import psutil

        me = psutil.Process()
        total = me.io_counters().read_bytes
        for c in me.children(recursive=True):
            try:
                total += c.io_counters().read_bytes
            except Exception:
                pass
        return total
    except Exception:
        return None


def memcpy_ceiling(nbytes: int, threads: int = 1, seconds: float = 0.5) -> dict[str, float]:
    """Write bandwidth of a copy into a preallocated buffer of ``nbytes``: torch copy_ and numpy copyto on
    one thread and, with ``threads`` > 1, numpy copyto of ``threads`` slices at once (as many threads as
    hsgds cuts with: the ceiling its loader is compared with). ``GBps`` is the best of them."""
    src = torch.empty(nbytes // 4, dtype=torch.float32).uniform_()
    dst = torch.zeros_like(src)
    s, d = src.numpy(), dst.numpy()
    edges = [len(s) * k // threads for k in range(threads + 1)]
    pool = ThreadPoolExecutor(threads)

    def sliced() -> None:  # numpy releases the GIL for large copies
        for f in [pool.submit(np.copyto, d[a:b], s[a:b]) for a, b in zip(edges[:-1], edges[1:])]:
            f.result()

    runs = {"torch": lambda: dst.copy_(src), "numpy": lambda: np.copyto(d, s)}
    if threads > 1:
        runs[f"numpy_{threads}_threads"] = sliced
    out = {}
    try:
        for name, fn in runs.items():
            fn()
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                fn()
                n += 1
            out[name] = n * nbytes / (time.perf_counter() - t0) / GB
    finally:
        pool.shutdown()
    out["GBps"] = max(out.values())
    return out


def d2d_ceiling(nbytes: int, device: torch.device, seconds: float = 0.5) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            dst.copy_(src)
        n += 8
        synchronize(device)
    return n * nbytes / (time.perf_counter() - t0) / GB


def raw_read(sd: SceneData, device: torch.device, cold: bool, depth: int = 2) -> dict[str, Any]:
    """Every tile of the store read once by the reader hsgds uses here, ``depth`` reads in flight."""
    from hsgds.io.base import TileSource

    scene = hsgds.open_scene(sd.store)
    source = TileSource.from_scene(scene)
    rep = probe()
    if device.type == "cuda" and rep.kvikio_usable:
        from hsgds.io.kvikio_reader import KvikioReader

        reader, name = KvikioReader(source), "kvikio"
    else:
        from hsgds.io.posix import PosixReader

        reader, name = PosixReader(source, verify=False), "posix"
        if device.type == "cuda":
            name = "posix+pinned"
    dtype = getattr(torch, scene.grid.dtype)
    bufs = [torch.empty(scene.grid.tile_shape, dtype=dtype, device=device) for _ in range(depth)]
    if cold:
        drop_cache(list(scene.tile_paths))
    else:
        warm_cache(list(scene.tile_paths))
    tiles = list(range(scene.grid.num_tiles))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(depth) as pool:
        for i in range(0, len(tiles), depth):
            list(pool.map(lambda j, i=i: reader.read_into(tiles[i + j], bufs[j]), range(min(depth, len(tiles) - i))))
    synchronize(device)
    el = time.perf_counter() - t0
    reader.close()
    nbytes = len(tiles) * scene.grid.tile_nbytes
    return {"reader": name, "depth": depth, "bytes": nbytes, "seconds": el, "GBps": nbytes / el / GB}


# --------------------------------------------------------------------------------------------- contenders

def _subset(sd: SceneData, batch: int, batches: int, seed: int) -> np.ndarray:
    n = min(len(sd.ys), batch * batches)
    n -= n % batch if n >= batch else 0
    return np.sort(np.random.default_rng(seed).permutation(len(sd.ys))[:n])


def _names(text: str) -> list[str]:
    """Comma-separated contender names; a comma inside hsgds[engine,reader] does not split."""
    return re.findall(r"hsgds\[[^\]]*\]|[^,]+", text)


def contender_names(device: torch.device, wanted: list[str]) -> list[str]:
    rep = probe()
    names = [c for c in ("naive", "tuned", "shm_ring") if c in wanted]
    if "kvikio_zarr" in wanted and device.type == "cuda":
        names.append("kvikio_zarr")
    if "hsgds" in wanted:
        readers = ["posix"] if device.type == "cpu" else (["kvikio"] if rep.kvikio_usable else []) + ["posix-pinned"]
        engines = ["torch"]
        dali_ok = rep.dali_gpu if device.type == "cuda" else rep.dali_version is not None
        if dali_ok:
            engines.append("dali")
        names += [f"hsgds[{e},{r}]" for e in engines for r in readers]
    # explicit ones, e.g. hsgds[torch,posix] alone, or hsgds[torch-ops,posix]: the torch engine on torch
    # ops instead of its fused CPU kernel (setting numba off), or hsgds[torch-raw,posix]: the fused kernel on
    # the stored values, with no tile normalized in the ring (setting normalize_tiles off), or
    # hsgds[torch-sync,posix]: each batch cut inside its own next() (setting cut_ahead off), side by side
    names += [w for w in wanted if w.startswith("hsgds[") and w not in names]
    return names


def make_loader(name: str, sd: SceneData, idx: np.ndarray, args: argparse.Namespace, dtype: torch.dtype,
                device: torch.device, p: int, batch: int) -> Any:
    ys, xs, lab = sd.ys[idx], sd.xs[idx], sd.labels[idx]
    common = (ys, xs, lab, p, sd.offset, sd.scale, dtype, batch)
    if p != args.patch:  # the padded .npy was made for args.patch: shift into it
        shift = args.patch // 2 - p // 2
        common = (ys + shift, xs + shift, *common[2:])
    if name == "naive":
        return naive_loader(str(sd.padded), *common, seed=args.seed, device=device)
    if name == "tuned":
        return tuned_loader(np.load(sd.padded, allow_pickle=False), *common, workers=args.workers, seed=args.seed, device=device)
    if name == "shm_ring":
        return ShmRingLoader(np.load(sd.padded, allow_pickle=False), *common, workers=args.shm_workers, seed=args.seed, device=device)
    if name.startswith("hsgds["):
        engine, reader = name[6:-1].split(",")
        with defaults.set(numba=engine != "torch-ops", normalize_tiles=engine != "torch-raw",
                          cut_ahead=engine != "torch-sync"):
            return hsgds.PatchLoader(sd.store, patch_size=p, batch_size=batch, split=None, dtype=dtype,
                                     device=device, engine=engine.split("-")[0], reader=reader,
                                     seed=args.seed, drop_last=True)
    raise ValueError(name)


def _close(loader: Any) -> None:
    if hasattr(loader, "close"):
        loader.close()
    elif getattr(loader, "_iterator", None) is not None:  # DataLoader persistent workers
        loader._iterator._shutdown_workers()
        loader._iterator = None


def _epoch(loader: Any, device: torch.device, limit: int) -> tuple[int, int, float, float]:
    """Consume up to ``limit`` batches; (patches, bytes, seconds to first batch, seconds total)."""
    n = nbytes = 0
    t0 = time.perf_counter()
    first = None
    for i, (x, y) in enumerate(loader):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        if first is None:
            synchronize(device)
            first = time.perf_counter() - t0
        n += len(x)
        nbytes += x.numel() * x.element_size()
        del x, y
        if i + 1 >= limit:
            break
    synchronize(device)
    return n, nbytes, first or 0.0, time.perf_counter() - t0


def run_contender(name: str, sd: SceneData, args: argparse.Namespace, dtype: torch.dtype, device: torch.device,
                  cold: bool) -> dict[str, Any]:
    idx = _subset(sd, args.batch, args.batches, args.seed)
    limit = max(1, -(-len(idx) // args.batch))
    row: dict[str, Any] = {"scene": sd.name, "cache": "cold" if cold else "warm", "dtype": str(dtype)[6:],
                           "contender": name, "patch": args.patch, "batch": args.batch, "batches": limit}
    files = [sd.padded] if not name.startswith("hsgds") else list(hsgds.open_scene(sd.store).tile_paths)
    if cold:
        row["cache_dropped"] = drop_cache(files)
    else:
        warm_cache(files)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base_dev = torch.cuda.memory_allocated(device)
    io0 = io_read_bytes()
    loader = None
    threads = torch.get_num_threads()
    if name.startswith("hsgds") and args.cpu_threads:  # the engine cuts with at most torch's thread count
        torch.set_num_threads(args.cpu_threads)
    try:
        with Sampler() as sampler:
            t0 = time.perf_counter()
            loader = make_loader(name, sd, idx, args, dtype, device, args.patch, args.batch)
            build = time.perf_counter() - t0
            n1, b1, first, e1 = _epoch(loader, device, limit)
            io1 = io_read_bytes()
            best = None
            for _ in range(args.repeats):
                n2, b2, _, e2 = _epoch(loader, device, limit)
                best = e2 if best is None else min(best, e2)
        row.update(status="ok", patches=n2, patches_per_s=n2 / best, GBps=b2 / best / GB,
                   first_epoch_patches_per_s=n1 / (build + e1), time_to_first_batch_s=build + first,
                   peak_rss_MB=round(sampler.peak / 2**20, 1) if sampler.peak else None)
        logical = n1 * sd.shape[2] * args.patch**2 * np.dtype(sd.dtype).itemsize
        if name == "naive":
            row["bytes_read_per_epoch"] = logical  # every patch sliced from the file, p*p*B each
        elif name in ("tuned", "shm_ring"):
            row["bytes_read_per_epoch"] = os.path.getsize(sd.padded)  # the padded cube, once into RAM
        else:
            row["bytes_read_per_epoch"] = loader.stats.bytes_read
            row["loader_stats"] = {k: v for k, v in loader.stats.as_dict().items() if k != "reasons"}
            row["cpu_cut"] = next((r for r in loader.stats.reasons if r.startswith("CPU cut")), None)
        if io0 is not None and io1 is not None:
            row["storage_read_bytes_first_epoch"] = io1 - io0
        if device.type == "cuda":
            row["peak_device_MB"] = round((torch.cuda.max_memory_allocated(device) - base_dev) / 2**20, 1)
    except Exception as exc:  # a contender that cannot run here is reported, not fatal
        row.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:400])
        log(f"{name} failed: {row['error']}")
    finally:
        torch.set_num_threads(threads)
        if loader is not None:
            _close(loader)
    return row


def run_kvikio_zarr(sd: SceneData, device: torch.device, cold: bool) -> dict[str, Any]:
    """kvikio's GDSStore read by zarr-python: every tile once (raw read throughput, no patches)."""
    row: dict[str, Any] = {"scene": sd.name, "cache": "cold" if cold else "warm", "contender": "kvikio_zarr"}
    try:
        import zarr
        from kvikio.zarr import GDSStore

        scene = hsgds.open_scene(sd.store)
        (drop_cache if cold else warm_cache)(list(scene.tile_paths))
        t0 = time.perf_counter()
        with zarr.config.enable_gpu():
            arr = zarr.open_array(GDSStore(str(sd.store)), path="tiles", mode="r")
            for ty in range(scene.grid.nty):
                for tx in range(scene.grid.ntx):
                    a = arr[ty, tx]
            synchronize(device)
        el = time.perf_counter() - t0
        del a
        nbytes = scene.grid.num_tiles * scene.grid.tile_nbytes
        row.update(status="ok", bytes=nbytes, seconds=el, GBps=nbytes / el / GB)
    except Exception as exc:
        row.update(status="skipped", error=f"{type(exc).__name__}: {exc}"[:400])
        log(f"kvikio_zarr skipped: {row['error']}")
    return row


# --------------------------------------------------------------------------------------------- end to end

def run_e2e(sd: SceneData, args: argparse.Namespace, device: torch.device, names: list[str]) -> dict[str, Any]:
    from hsgds.models import MODELS
    from hsgds.train import compute_only, train_steps

    p, batch, steps, warmup = args.e2e_patch or args.patch, args.e2e_batch or args.batch, args.e2e_steps, 2
    dtype = torch.float32
    out: dict[str, Any] = {"scene": sd.name, "patch": p, "batch": batch, "steps": steps, "warmup": warmup,
                           "model": args.e2e_model, "dtype": "float32", "rows": []}

    def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(args.seed)
        model = MODELS[args.e2e_model](sd.shape[2], sd.classes, p).to(device)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    # the ceiling: the same step on batches already on the device
    with hsgds.PatchLoader(sd.store, patch_size=p, batch_size=batch, split=None, dtype=dtype, device=device,
                           seed=args.seed, drop_last=True) as loader:
        resident = []
        for x, y in loader:
            resident.append((x.clone(), y.clone()))
            if len(resident) == 4:
                break
    model, opt = fresh()
    ceiling = compute_only(model, resident, opt, steps=steps, warmup=warmup)
    out["compute_only"] = ceiling.as_dict()
    log(f"e2e compute-only: {ceiling.step_s * 1e3:.1f} ms/step")
    idx = _subset(sd, batch, steps + warmup, args.seed)
    for name in names:
        row: dict[str, Any] = {"contender": name}
        loader = None
        try:
            # the ceiling again right before each loader's run: on a shared machine the speed drifts
            # between runs by more than the few percent being measured
            model, opt = fresh()
            paired = compute_only(model, resident, opt, steps=steps, warmup=warmup)
            loader = make_loader(name, sd, idx, args, dtype, device, p, batch)
            model, opt = fresh()
            t = train_steps(model, loader, opt, device=device, steps=steps, warmup=warmup)
            row.update(status="ok", **t.as_dict(), compute_only_step_s=paired.step_s,
                       vs_compute_only=t.step_s / paired.step_s)
            log(f"e2e {name}: {t.step_s * 1e3:.1f} ms/step (compute only just before: {paired.step_s * 1e3:.1f}), "
                f"stall {100 * t.stall_fraction:.1f}%")
        except Exception as exc:
            row.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:400])
            log(f"e2e {name} failed: {row['error']}")
        finally:
            if loader is not None:
                _close(loader)
        out["rows"].append(row)
    del resident
    return out


# --------------------------------------------------------------------------------------------- report

def _best_hsgds(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    cands = [r for r in rows if r["contender"].startswith("hsgds") and r.get("status") == "ok"
             and all(r.get(k) == v for k, v in match.items())]
    return max(cands, key=lambda r: r["patches_per_s"]) if cands else None


def _find(rows: list[dict[str, Any]], name: str, **match: Any) -> dict[str, Any] | None:
    for r in rows:
        if r["contender"] == name and r.get("status") == "ok" and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def add_ratios(doc: dict[str, Any]) -> None:
    rows = [r for r in doc["loader"] if r.get("status") == "ok" and "patches_per_s" in r]
    memcpy = doc["ceilings"]["memcpy"]["GBps"]
    for r in rows:
        key = {k: r[k] for k in ("scene", "cache", "dtype")}
        for ref in ("naive", "tuned", "shm_ring"):
            base = _find(rows, ref, **key)
            if base:
                r[f"x_{ref}"] = r["patches_per_s"] / base["patches_per_s"]
        r["pct_memcpy"] = 100 * r["GBps"] / memcpy
    e2e = doc.get("e2e")
    if e2e:
        ok = [r for r in e2e["rows"] if r.get("status") == "ok"]
        for r in ok:
            for ref in ("naive", "tuned", "shm_ring"):
                base = next((b for b in ok if b["contender"] == ref), None)
                if base:
                    r[f"x_{ref}"] = r["steps_per_s"] / base["steps_per_s"]


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on this run's rows (settings noted; not met = measured and missed)."""
    out = []
    rows = doc["loader"]
    cuda = doc["machine"]["device"].startswith("cuda")
    scene = "indian_pines"
    note = f"p={doc['args']['patch']}, batch {doc['args']['batch']}, warm cache, {scene}"

    def add(name: str, value: float | None, goal: float, ok: bool | None, detail: str) -> None:
        out.append({"target": name, "value": value, "goal": goal, "met": ok, "detail": detail})

    if not cuda:
        f32 = _best_hsgds(rows, scene=scene, cache="warm", dtype="float32")
        if f32:
            frac = f32["GBps"] / doc["ceilings"]["memcpy"]["GBps"]
            add("CPU loader float32 >= 70% of memcpy", round(frac, 3), 0.7, frac >= 0.7,
                f"{f32['contender']} {f32['GBps']:.2f} GB/s vs memcpy {doc['ceilings']['memcpy']['GBps']:.2f} GB/s; {note}")
        bf = _best_hsgds(rows, scene=scene, cache="warm", dtype="bfloat16")
        naive = _find(rows, "naive", scene=scene, cache="warm", dtype="bfloat16")
        if bf and naive:
            x = bf["patches_per_s"] / naive["patches_per_s"]
            add("CPU loader bfloat16 >= 25x naive", round(x, 2), 25, x >= 25,
                f"{bf['contender']} {bf['patches_per_s']:.0f} vs naive {naive['patches_per_s']:.0f} patches/s; {note}")
        e2e = doc.get("e2e")
        if e2e:
            h = [r for r in e2e["rows"] if r["contender"].startswith("hsgds") and r.get("status") == "ok"]
            if h:
                v = min(r["vs_compute_only"] for r in h)
                add("CPU end-to-end step <= 1.05x compute-only", round(v, 3), 1.05, v <= 1.05,
                    f"p={e2e['patch']}, batch {e2e['batch']}, {e2e['steps']} steps, {e2e['scene']}")
    else:
        d2d = doc["ceilings"].get("d2d_GBps")
        best = _best_hsgds(rows, scene=scene, cache="warm", dtype="float32")
        if best and d2d:
            frac = best["GBps"] / d2d
            add("GPU loader >= 50% of device copy bandwidth", round(frac, 3), 0.5, frac >= 0.5,
                f"{best['contender']} {best['GBps']:.2f} GB/s vs D2D {d2d:.1f} GB/s; {note}")
        host = (best or {}).get("loader_stats", {}).get("host_us_median")
        if host is not None:
            add("GPU host time per batch inside next(loader) <= 50 us", round(host, 1), 50, host <= 50,
                f"{best['contender']}, median of the recent batches; {note}")
        e2e = doc.get("e2e")
        if e2e:
            ok = {r["contender"]: r for r in e2e["rows"] if r.get("status") == "ok"}
            h = [r for n, r in ok.items() if n.startswith("hsgds")]
            if h:
                top = max(h, key=lambda r: r["steps_per_s"])
                for ref, goal in (("naive", 28), ("tuned", 3)):
                    if ref in ok:
                        x = top["steps_per_s"] / ok[ref]["steps_per_s"]
                        add(f"GPU end-to-end >= {goal}x {ref}", round(x, 2), goal, x >= goal, top["contender"])
                add("GPU input wait <= 2% of step", round(top["stall_fraction"], 4), 0.02,
                    top["stall_fraction"] <= 0.02, f"{top['contender']}, {e2e['model']}")
                add("GPU end-to-end step <= 1.02x compute-only", round(top["vs_compute_only"], 3), 1.02,
                    top["vs_compute_only"] <= 1.02, f"{top['contender']}, {e2e['model']}")
    return out


def _fmt(v: Any, spec: str = ".0f") -> str:
    return "—" if v is None else format(v, spec)


def markdown(doc: dict[str, Any]) -> str:
    m, a = doc["machine"], doc["args"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['versions']['torch']}, device {m['device']}"
             + (f" ({m['gpu']['name']})" if m.get("gpu") else "")
             + f"; torch threads {m.get('torch_threads')}, hsgds CPU cut threads {m.get('hsgds_cpu_threads')}"
             + (f", numba {m['versions']['numba']}" if m["versions"].get("numba") else ", no numba")
             + f"; 1-min load average at start {_fmt(m.get('load_avg_1min_at_start'), '.1f')}.",
             f"Ceilings: memcpy write {doc['ceilings']['memcpy']['GBps']:.2f} GB/s ("
             + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in doc["ceilings"]["memcpy"].items() if k != "GBps")
             + ", at the start; the best of start and end counts)"
             + (f", device-to-device copy {doc['ceilings']['d2d_GBps']:.1f} GB/s" if doc["ceilings"].get("d2d_GBps") else "")
             + "; raw tile reads: " + ", ".join(f"{k} {v['GBps']:.2f} GB/s ({v['reader']}, {v['cache']})"
                                                 for k, v in doc["ceilings"].get("raw_read", {}).items()) + ".",
             ""]
    groups: dict[tuple, list] = {}
    for r in doc["loader"]:
        groups.setdefault((r["scene"], r["cache"], r.get("dtype")), []).append(r)
    for (scene, cache, dtype), rows in groups.items():
        lines += [f"### Loader only — {scene}, {cache} cache, {dtype or 'raw'} (p={a['patch']}, batch {a['batch']})", "",
                  "| contender | patches/s | GB/s | % memcpy | × naive | × tuned | × shm ring | first batch s | "
                  "read MB/epoch | peak RSS MB | host µs/batch (cut µs) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            if r.get("status") != "ok":
                lines.append(f"| {r['contender']} | {r.get('status')}: {r.get('error', '')[:60]} | | | | | | | | | |")
                continue
            if "patches_per_s" not in r:  # raw read contender (kvikio_zarr)
                lines.append(f"| {r['contender']} (tile reads) | — | {r['GBps']:.2f} | | | | | | "
                             f"{r['bytes'] / 2**20:.0f} | | |")
                continue
            ls = r.get("loader_stats") or {}
            host = (f"{ls['host_us_median']:.0f} ({ls['cut_us_median']:.0f})"
                    if ls.get("host_us_median") is not None else "")
            lines.append(
                f"| {r['contender']} | {r['patches_per_s']:.0f} | {r['GBps']:.2f} | {_fmt(r.get('pct_memcpy'))} | "
                f"{_fmt(r.get('x_naive'), '.1f')} | {_fmt(r.get('x_tuned'), '.2f')} | {_fmt(r.get('x_shm_ring'), '.2f')} | "
                f"{r['time_to_first_batch_s']:.2f} | {r['bytes_read_per_epoch'] / 2**20:.1f} | {_fmt(r.get('peak_rss_MB'))} | "
                f"{host} |")
        lines.append("")
    e2e = doc.get("e2e")
    if e2e:
        c = e2e["compute_only"]
        lines += [f"### End to end — {e2e['model']}, {e2e['scene']}, p={e2e['patch']}, batch {e2e['batch']}, "
                  f"{e2e['steps']} timed steps", "",
                  "| loader | steps/s | ms/step | compute-only ms/step (run just before) | × compute-only | stall % | "
                  "× naive | × tuned |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|",
                  f"| compute only (resident batches) | {c['steps_per_s']:.2f} | {1e3 * c['step_s']:.1f} | | 1.00 | — | | |"]
        for r in e2e["rows"]:
            if r.get("status") != "ok":
                lines.append(f"| {r['contender']} | {r.get('status')}: {r.get('error', '')[:60]} | | | | | | |")
                continue
            lines.append(f"| {r['contender']} | {r['steps_per_s']:.2f} | {1e3 * r['step_s']:.1f} | "
                         f"{1e3 * r['compute_only_step_s']:.1f} | "
                         f"{r['vs_compute_only']:.3f} | {100 * r['stall_fraction']:.1f} | {_fmt(r.get('x_naive'), '.1f')} | "
                         f"{_fmt(r.get('x_tuned'), '.2f')} |")
        lines.append("")
    if doc.get("targets"):
        lines += ["### Targets", "", "| target | measured | goal | met |", "|---|---:|---:|---|"]
        for t in doc["targets"]:
            lines.append(f"| {t['target']} ({t['detail']}) | {t['value']} | {t['goal']} | {'yes' if t['met'] else 'NO'} |")
        lines.append("")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log('matplotlib not installed: no plot (pip install "hsgds[bench]")')
        return False
    rows = [r for r in doc["loader"] if r.get("status") == "ok" and "patches_per_s" in r and r["cache"] == "warm"]
    keys = sorted({(r["scene"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2, 1]})
    ax = axes[0]
    names = list(dict.fromkeys(r["contender"] for r in rows))
    width = 0.8 / max(1, len(keys))
    for k, key in enumerate(keys):
        vals = [next((r["GBps"] for r in rows if (r["scene"], r["dtype"]) == key and r["contender"] == n), 0) for n in names]
        ax.barh(np.arange(len(names)) + k * width, vals, height=width, label=f"{key[0]} {key[1]}")
    ax.axvline(doc["ceilings"]["memcpy"]["GBps"], color="k", ls="--", lw=1, label="memcpy ceiling")
    ax.set_yticks(np.arange(len(names)) + width * (len(keys) - 1) / 2, names)
    ax.invert_yaxis()
    ax.set_xlabel("delivered GB/s (warm cache, loader only)")
    ax.set_xscale("log")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"Throughput, p={doc['args']['patch']}, batch {doc['args']['batch']}")
    ax = axes[1]
    e2e = doc.get("e2e")
    if e2e:
        ok = [r for r in e2e["rows"] if r.get("status") == "ok"]
        ax.barh([r["contender"] for r in ok], [100 * r["stall_fraction"] for r in ok], color="tab:red")
        ax.invert_yaxis()
        ax.set_xlabel("% of training time waiting for data")
        ax.set_title(f"End to end stall ({e2e['model']}, p={e2e['patch']})")
    else:
        ax.axis("off")
    fig.suptitle(f"hsgds bench_loader — {doc['machine']['device']}, {doc['machine']['cores']} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------------- main

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenes", default="indian_pines,pavia", help=f"comma-separated: {', '.join(SCENES)}")
    ap.add_argument("--aviris-size", type=int, default=1024, help="side of the synthetic AVIRIS scene (>= 4096 for scale runs)")
    ap.add_argument("--patch", type=int, default=13)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--cache", default="warm", help="warm, cold or warm,cold")
    ap.add_argument("--batches", type=int, default=30, help="batches per epoch (each scene's labelled pixels, capped)")
    ap.add_argument("--repeats", type=int, default=1, help="steady-state epochs per contender (the best counts)")
    ap.add_argument("--contenders", default="naive,tuned,shm_ring,kvikio_zarr,hsgds")
    ap.add_argument("--workers", type=int, default=None, help="tuned DataLoader workers (default: cores)")
    ap.add_argument("--shm-workers", type=int, default=None, help="shared-memory ring workers (default: cores, at most 8)")
    ap.add_argument("--device", default="auto", help="auto (CUDA when usable), cpu or cuda")
    ap.add_argument("--e2e-steps", type=int, default=None, help="timed training steps per loader (0: skip; default 20 on GPU, 4 on CPU)")
    ap.add_argument("--e2e-patch", type=int, default=None, help="patch size of the end-to-end runs (default --patch)")
    ap.add_argument("--e2e-batch", type=int, default=None, help="batch size of the end-to-end runs (default --batch)")
    ap.add_argument("--e2e-contenders", default="naive,tuned,shm_ring,hsgds")
    ap.add_argument("--e2e-model", default="Hamida3D", choices=["Hamida3D", "SpectralSpatialCNN"],
                    help="the model trained end to end: the 3-D CNN, or the demo's small 2-D CNN (a fast step)")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch.set_num_threads for this process (default: torch's own; workers use 1)")
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="torch.set_num_threads while an hsgds contender runs (its engine cuts a CPU batch with at "
                         "most that many threads; default: --torch-threads)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="folder for the converted scenes (default: a temporary one)")
    ap.add_argument("--out", default=None, help="also write results.json, table.md and plot.png here")
    args = ap.parse_args(argv)
    if args.shm_workers is None:
        args.shm_workers = min(8, os.cpu_count() or 1)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    rep = probe()
    if args.device == "auto":
        device = torch.device("cuda:0" if rep.cuda else "cpu")
    else:
        device = torch.device(args.device)
    if args.e2e_steps is None:
        args.e2e_steps = 20 if device.type == "cuda" else 4  # the quick default fits gpu_check's 120 s step
    log(f"device {device}; {os.cpu_count()} cores; torch {torch.__version__}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="hsgds-bench-"))
    doc: dict[str, Any] = {"args": vars(args), "machine": machine(device, args.cpu_threads), "scenes": {}, "ceilings": {},
                           "loader": [], "e2e": None}
    t_start = time.perf_counter()
    try:
        out_bytes = args.batch * args.patch**2 * 4  # per-band size added below (largest scene)
        scenes = []
        for name in args.scenes.split(","):
            t = time.perf_counter()
            sd = prepare(name, work, args)
            scenes.append(sd)
            doc["scenes"][name] = {"source": sd.source, "shape": sd.shape, "dtype": sd.dtype,
                                   "labelled_pixels": len(sd.ys), "classes": sd.classes,
                                   "store_bytes": sum(p.stat().st_size for p in hsgds.open_scene(sd.store).tile_paths)}
            log(f"prepared {name} ({sd.source}) in {time.perf_counter() - t:.1f} s")
        out_bytes *= max(sd.shape[2] for sd in scenes)
        copy_threads = (args.cpu_threads or torch.get_num_threads()) if device.type == "cpu" else 1
        doc["ceilings"]["memcpy"] = memcpy_ceiling(out_bytes, copy_threads)
        doc["ceilings"]["memcpy_bytes"] = out_bytes
        if device.type == "cuda":
            doc["ceilings"]["d2d_GBps"] = d2d_ceiling(out_bytes, device)
        doc["ceilings"]["raw_read"] = {}
        names = contender_names(device, _names(args.contenders))
        caches = args.cache.split(",")
        for sd in scenes:
            for cache in caches:
                cold = cache == "cold"
                rr = raw_read(sd, device, cold)
                rr["cache"] = cache
                doc["ceilings"]["raw_read"][f"{sd.name}/{cache}"] = rr
                for dname in args.dtypes.split(","):
                    dtype = getattr(torch, dname)
                    for name in names:
                        if name == "kvikio_zarr":
                            if dname == args.dtypes.split(",")[0]:
                                doc["loader"].append(run_kvikio_zarr(sd, device, cold))
                            continue
                        t = time.perf_counter()
                        row = run_contender(name, sd, args, dtype, device, cold)
                        doc["loader"].append(row)
                        if row["status"] == "ok":
                            log(f"{sd.name} {cache} {dname} {name}: {row['patches_per_s']:.0f} patches/s, "
                                f"{row['GBps']:.2f} GB/s, first batch {row['time_to_first_batch_s']:.2f} s "
                                f"({time.perf_counter() - t:.1f} s)")
        # memcpy again at the end: the ceiling under the same conditions as the runs (the better one counts)
        again = memcpy_ceiling(out_bytes, copy_threads)
        doc["ceilings"]["memcpy_end"] = again
        doc["ceilings"]["memcpy"]["GBps"] = max(doc["ceilings"]["memcpy"]["GBps"], again["GBps"])
        if args.e2e_steps > 0:
            wanted = _names(args.e2e_contenders)
            e2e_names = [n for n in names if n in wanted or (n.startswith("hsgds") and "hsgds" in wanted)]
            hs = [n for n in e2e_names if n.startswith("hsgds")]
            if len(hs) > 1:  # the fastest hsgds configuration of the loader-only runs trains
                speed = {n: max((r.get("patches_per_s", 0) for r in doc["loader"] if r["contender"] == n), default=0)
                         for n in hs}
                keep = max(hs, key=lambda n: speed[n])
                e2e_names = [n for n in e2e_names if not n.startswith("hsgds") or n == keep]
            doc["e2e"] = run_e2e(scenes[0], args, device, e2e_names)
        add_ratios(doc)
        doc["targets"] = targets(doc)
        doc["seconds"] = round(time.perf_counter() - t_start, 1)
        doc["machine"]["load_avg_1min_at_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    json.dump(doc, sys.stdout, indent=1, default=_json_default)
    sys.stdout.write("\n")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
        (out / "table.md").write_text(markdown(doc) + "\n")
        plot(doc, out / "plot.png")
        log(f"wrote {out}/results.json, table.md, plot.png")
    return 0


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.ndarray, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


if __name__ == "__main__":
    raise SystemExit(main())
