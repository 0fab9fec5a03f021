"""Full-scene inference side by side; print one JSON document.

Scenes: the real Indian Pines (145x145x200) and a seeded synthetic int16 scene (4096x1024x224 by default,
``--quick``: 1024x512x224). Model: a small :class:`~hsgds.models.SpectralSpatialCNN` (random weights; the
work per pixel is what matters). Each contender runs in its own process, so its peak RSS is its own:

1. ``predict``: :func:`hsgds.predict` (map assembled on the device, copied once).
2. ``loader``: the same model over :class:`~hsgds.PatchLoader` batches of every pixel (``pixels="all"``),
   argmax per batch, no map: the ceiling predict should reach (target >= 0.9x).
3. ``sliding_window``: DeepHyperX's ``test()`` pattern: the normalized cube padded in host RAM, a Python
   generator yielding one window per pixel, batches stacked with numpy, the model's outputs added into a
   float64 (H, W, K) array in host RAM, argmax at the end. On large scenes it runs on the first
   ``--window-rows`` rows only (its pixels/s is per pixel; its whole-scene memory is reported as computed).

Throughput is given per wall second and per CPU second (user + system, all threads): on a shared machine
whose other jobs take most of the cores, the CPU-second rate is the one that compares the contenders.
Peak RSS (VmHWM) is compared with the baseline (the process after imports, model and store opening, and
the compiled CPU cut kernel loaded: code, the same for any scene), the ring, the class map and the one
batch the model reads. Run twice in alternation (loader, predict, loader, predict): the best of each is kept.

    python benchmarks/bench_predict.py [--quick] [--patch 5] [--batch 2048] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    """This process's peak RSS: VmHWM of its own address space. (ru_maxrss would not do: Linux carries it
    across execve, so a child started from the parent that built a scene reports the parent's peak.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    """User + system CPU seconds of this process, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _model(bands: int, classes: int, p: int):
    import torch

    from hsgds.models import SpectralSpatialCNN

    torch.manual_seed(0)
    return SpectralSpatialCNN(bands, classes, p, reduce=16, width=16).eval()


# ------------------------------------------------------------------------------------- one contender

def run_one(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import hsgds
    from hsgds.inference import predict, ring_bytes_for
    from hsgds.loader import PatchLoader

    torch.set_num_threads(args.threads)
    scene = hsgds.open_scene(args.store)
    h, w, b = scene.shape
    k = max(scene.num_classes, 2)
    model = _model(b, k, args.patch)
    code0 = _rss_mb()
    if args.contender != "sliding_window":
        _load_cut_kernel(scene, args.patch)
    batch_mb = args.batch * args.patch**2 * b * 4 / 2**20
    forward_mb = _model_forward_mb(model, args.batch, b, args.patch, batch_mb)
    base = _rss_mb()
    _reset_peak()  # the run's peak from here (the forward above is measured on its own)
    out: dict[str, Any] = {"contender": args.contender, "baseline_rss_mb": base, "cut_kernel_code_mb": base - code0,
                           "batch_mb": batch_mb, "model_forward_mb": forward_mb}
    t0, c0 = time.perf_counter(), _cpu_s()
    if args.contender == "predict":
        classmap = predict(scene, model, patch_size=args.patch, batch_size=args.batch, device="cpu")
        pixels = int(classmap.size)
    elif args.contender == "loader":
        pixels = 0
        with PatchLoader(scene, patch_size=args.patch, batch_size=args.batch, pixels="all", split=None,
                         shuffle=False, return_coords=True, device="cpu",
                         ring_bytes=ring_bytes_for(scene, args.batch)) as loader, torch.inference_mode():
            out["ring_mb"] = loader.stats.ring_bytes / 2**20
            for x, _, _ in loader:
                model(x).argmax(1)
                pixels += x.shape[0]
    else:
        pixels = sliding_window(scene, model, args)
        out["rows"] = min(h, args.window_rows)
    out["elapsed_s"] = time.perf_counter() - t0
    out["cpu_s"] = _cpu_s() - c0
    out["pixels"] = pixels
    out["pixels_per_s"] = pixels / out["elapsed_s"]
    out["pixels_per_cpu_s"] = pixels / max(out["cpu_s"], 1e-9)
    out["peak_rss_mb"] = _peak_mb()
    return out


def _reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux: 5 to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _model_forward_mb(model, batch: int, bands: int, p: int, batch_mb: float) -> float:
    """What one forward pass of the model over a batch needs beyond the batch itself (its activations and
    the library's working copies, e.g. oneDNN's reordered input): the peak RSS of one forward on a zero
    batch, above the RSS before it. Any inference of this model at this batch size pays it."""
    import torch

    x = torch.zeros((batch, bands, p, p))
    before = _rss_mb()
    _reset_peak()
    with torch.inference_mode():
        model(x)
    peak = _peak_mb()
    del x
    return max(0.0, peak - before)


def _load_cut_kernel(scene, p: int) -> None:
    """Import numba and load the fused CPU kernel for this store dtype (one 1-patch cut): code, ~130 MiB
    of it, part of the baseline (the same for every scene size), not of the run."""
    import torch

    from hsgds.engines import PatchSpec, TorchEngine
    from hsgds.engines.base import TORCH_DTYPES

    b = scene.shape[2]
    engine = TorchEngine(PatchSpec(p, p // 2, b, p, "NCHW", torch.float32, np.zeros(b), np.ones(b)))
    zero = torch.zeros(1, dtype=torch.int64)
    engine.cut(torch.zeros((1, p, p, b), dtype=TORCH_DTYPES[str(scene.dtype)]), zero, zero + p // 2, zero + p // 2)
    engine.close()


def sliding_window(scene, model, args: argparse.Namespace) -> int:
    """DeepHyperX ``test()``: per-pixel Python windows over the padded cube in RAM, float64 probabilities."""
    import torch

    h, w, b = scene.shape
    rows = min(h, args.window_rows)
    r = args.patch // 2
    st = scene.norm_stats
    cube = scene.read(0, min(h, rows + r), 0, w).astype(np.float32)
    cube = (cube - st.mean.astype(np.float32)) / np.where(st.std > 0, st.std, 1).astype(np.float32)
    img = np.pad(cube, ((r, r), (r, r), (0, 0)), mode="reflect")  # (the scene's top edge; rows below are real)
    del cube
    k = max(scene.num_classes, 2)
    probs = np.zeros((rows, w, k))  # float64, as DeepHyperX

    def windows():
        for y in range(rows):
            for x in range(w):
                yield img[y:y + args.patch, x:x + args.patch], y, x

    batch: list = []
    with torch.no_grad():
        def flush() -> None:
            data = np.copy(np.stack([p for p, _, _ in batch])).transpose(0, 3, 1, 2)
            output = model(torch.from_numpy(data)).numpy()
            for (_, y, x), o in zip(batch, output):
                probs[y, x] += o
            batch.clear()

        for item in windows():
            batch.append(item)
            if len(batch) == args.batch:
                flush()
        if batch:
            flush()
    probs.argmax(-1)
    return rows * w


# ------------------------------------------------------------------------------------- scenes

def make_synthetic(work: Path, h: int, w: int, b: int) -> Path:
    """A seeded int16 scene written as .npy row block by row block (never whole in RAM), converted."""
    from hsgds.preprocess.convert import ConvertOptions, convert

    store = work / f"synthetic_{h}x{w}x{b}.zarr"
    if (store / "zarr.json").is_file():
        return store
    src = work / f"synthetic_{h}x{w}x{b}.npy"
    cube = np.lib.format.open_memmap(src, mode="w+", dtype=np.int16, shape=(h, w, b))
    rng = np.random.default_rng(0)
    base = rng.integers(500, 4000, (8, b)).astype(np.int16)
    for y in range(0, h, 64):
        n = min(64, h - y)
        cls = rng.integers(0, 8, (n, w))
        cube[y:y + n] = base[cls] + rng.integers(-50, 50, (n, w, b), dtype=np.int16)
    labels = np.zeros((h, w), np.uint8)
    labels[::7, ::5] = (np.arange(h)[::7, None] // 64 % 8 + 1).astype(np.uint8)
    cube.flush()
    del cube
    np.save(work / "synthetic_gt.npy", labels, allow_pickle=False)
    convert(src, store, ConvertOptions(labels=work / "synthetic_gt.npy", overwrite=True))
    src.unlink()
    return store


def indian_pines(work: Path) -> Path:
    from hsgds.datasets import INDIAN_PINES_CLASSES, indian_pines_files
    from hsgds.preprocess.convert import ConvertOptions, convert

    store = work / "indian_pines.zarr"
    if not (store / "zarr.json").is_file():
        cube, gt = indian_pines_files()
        convert(cube, store, ConvertOptions(labels=gt, class_names=INDIAN_PINES_CLASSES, overwrite=True))
    return store


def _child(store: Path, contender: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE), "--run-one", contender, "--store", str(store), "--patch", str(args.patch),
           "--batch", str(args.batch), "--threads", str(args.threads), "--window-rows", str(args.window_rows)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HSGDS_DEVICE": "cpu"})
    if proc.returncode != 0:
        return {"contender": contender, "status": "failed", "error": proc.stderr.strip().splitlines()[-1:]}
    return {**json.loads(proc.stdout), "status": "ok"}


def bench_scene(name: str, store: Path, args: argparse.Namespace) -> dict[str, Any]:
    import hsgds

    scene = hsgds.open_scene(store)
    h, w, b = scene.shape
    runs: dict[str, list[dict[str, Any]]] = {"loader": [], "predict": []}
    for _ in range(args.repeats):
        for contender in ("loader", "predict"):
            runs[contender].append(_child(store, contender, args))
            r = runs[contender][-1]
            print(f"{name} {contender}: {r.get('pixels_per_s', 0):.0f} px/s, {r.get('pixels_per_cpu_s', 0):.0f} px/cpu-s",
                  file=sys.stderr)
    window = _child(store, "sliding_window", args)
    print(f"{name} sliding_window: {window.get('pixels_per_s', 0):.0f} px/s, "
          f"{window.get('pixels_per_cpu_s', 0):.0f} px/cpu-s", file=sys.stderr)
    best = {c: max((r for r in rs if r["status"] == "ok"), key=lambda r: r["pixels_per_s"], default=None)
            for c, rs in runs.items()}
    k = max(scene.num_classes, 2)
    out: dict[str, Any] = {"scene": name, "shape": [h, w, b], "dtype": str(scene.dtype), "store_mb":
                           scene.grid.num_tiles * scene.grid.tile_nbytes / 2**20,
                           "runs": runs, "sliding_window": window}
    p, lo = best["predict"], best["loader"]
    if p and lo:
        classmap_mb = h * w * 4 / 2**20  # the int32 map on the device (the CPU here)
        out["predict_vs_loader"] = p["pixels_per_s"] / lo["pixels_per_s"]
        out["predict_vs_loader_per_cpu_s"] = p["pixels_per_cpu_s"] / lo["pixels_per_cpu_s"]
        # the bound: the baseline (imports, model, store, the compiled cut kernel), the ring, the map, and
        # the one batch the model reads; and with the model's own forward memory (measured alone)
        bound = p["baseline_rss_mb"] + (lo.get("ring_mb") or 0) + classmap_mb + p["batch_mb"]
        out["memory"] = {"predict_peak_rss_mb": p["peak_rss_mb"], "baseline_rss_mb": p["baseline_rss_mb"],
                         "cut_kernel_code_mb": p.get("cut_kernel_code_mb"), "ring_mb": lo.get("ring_mb"),
                         "classmap_mb": classmap_mb, "batch_mb": p.get("batch_mb"),
                         "model_forward_mb": p.get("model_forward_mb"), "bound_mb": bound,
                         "bound_with_forward_mb": bound + (p.get("model_forward_mb") or 0)}
        out["memory"]["peak_over_bound"] = p["peak_rss_mb"] / bound
        out["memory"]["peak_over_bound_with_forward"] = p["peak_rss_mb"] / out["memory"]["bound_with_forward_mb"]
    if p and window["status"] == "ok":
        out["predict_vs_sliding_window"] = p["pixels_per_s"] / window["pixels_per_s"]
        out["predict_vs_sliding_window_per_cpu_s"] = p["pixels_per_cpu_s"] / window["pixels_per_cpu_s"]
        out["sliding_window_whole_scene_mb"] = (h + args.patch) * (w + args.patch) * b * 4 / 2**20 + h * w * k * 8 / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1024x512x224 synthetic scene instead of 4096x1024x224")
    ap.add_argument("--synthetic", default=None, help="HxWxB of the synthetic scene (overrides --quick)")
    ap.add_argument("--scenes", default="indian_pines,synthetic")
    ap.add_argument("--patch", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--window-rows", type=int, default=128, help="rows the sliding window runs on (large scenes)")
    ap.add_argument("--work", default=None, help="folder for the stores (default: the hsgds cache dir)")
    ap.add_argument("--run-one", choices=["predict", "loader", "sliding_window"], help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_one:
        print(json.dumps(run_one(argparse.Namespace(**{**vars(args), "contender": args.run_one}))))
        return
    from hsgds import defaults

    work = Path(args.work or Path(defaults.get("cache_dir")) / "bench_predict")
    work.mkdir(parents=True, exist_ok=True)
    shape = args.synthetic or ("1024x512x224" if args.quick else "4096x1024x224")
    h, w, b = (int(v) for v in shape.split("x"))
    doc: dict[str, Any] = {"machine": {"cores": os.cpu_count(), "platform": platform.platform(),
                                       "python": platform.python_version(),
                                       "load_avg_1min": os.getloadavg()[0]},
                           "args": {k: v for k, v in vars(args).items() if k not in ("run_one", "store")},
                           "model": "SpectralSpatialCNN(reduce=16, width=16)", "scenes": []}
    for name in args.scenes.split(","):
        store = indian_pines(work) if name == "indian_pines" else make_synthetic(work, h, w, b)
        doc["scenes"].append(bench_scene(name if name == "indian_pines" else f"synthetic {shape}", store, args))
    doc["machine"]["load_avg_1min_after"] = os.getloadavg()[0]
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
