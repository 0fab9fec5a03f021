"""Where the consuming thread's time goes, batch by batch: cProfile of ``next(loader)`` on one device.

    python benchmarks/profile_batches.py [--device cuda] [--batches 400] [--top 30] [--cases NAME,...]

Cases (Indian Pines from the demo store, p=13, float32 NCHW, z-score, every labelled pixel):
``torch-posix`` and ``torch-kvikio`` (the torch engine, batch 256), ``torch-kvikio-4096`` (batch 4096),
``augment`` (torch engine, Augment(flip, rot90, radiation_noise=0.1, band_dropout=0.05)), ``dali``
(the DALI engine), and ``verify-on`` / ``verify-off`` (bench_verify.py's store: 81 tiles of 2 MiB through
a ring of 16, read again every epoch, tiles checked or not). Each case: a warm-up, then ``--batches``
batches under cProfile; prints the wall time per batch, the loader's own per-batch host median, its
waits, and the functions with the most time of their own. From Python 3.12 cProfile records every thread
(it is built on sys.monitoring): the consuming thread, the batch-prep thread and the ring's reader threads
together, so the profile's total is the Python a batch costs wherever it runs (before 3.12: this thread
only). Text on stdout: a profile to read, not a benchmark (cProfile slows Python).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_verify import make_store  # noqa: E402

import hsgds  # noqa: E402
from hsgds import defaults  # noqa: E402
from hsgds.cli import demo_store  # noqa: E402
from hsgds.train import synchronize  # noqa: E402

CASES = ("torch-posix", "torch-kvikio", "torch-kvikio-4096", "augment", "dali", "verify-on", "verify-off")


def forever(loader):
    while True:
        yield from loader


def profile(name: str, loader: hsgds.PatchLoader, device: torch.device, batches: int, top: int) -> None:
    it = forever(loader)
    for _ in range(min(50, batches)):  # warm-up: kernels compiled, tiles read, pinned buffers made
        next(it)
    synchronize(device)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for _ in range(batches):
        next(it)
    prof.disable()
    synchronize(device)
    wall = time.perf_counter() - t
    st = loader.stats
    print(f"\n===== {name}: {1e6 * wall / batches:.0f} us/batch under cProfile ({batches} batches); "
          f"reader {st.reader}, engine {st.engine}; host median {st.host_us_median or 0:.0f} us, "
          f"cut median {st.cut_us_median or 0:.0f} us; consumer waited {st.consumer_wait_s:.3f} s, "
          f"tiles loaded {st.tiles_loaded}, reused {st.tiles_reused}")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    print("\n".join(ln for ln in out.getvalue().splitlines() if ln.strip())[:12000])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    device = torch.device(args.device)
    store = demo_store()
    common = dict(patch_size=13, split=None, dtype=torch.float32, device=device, seed=0)
    aug = hsgds.Augment(flip=True, rot90=True, radiation_noise=0.1, band_dropout=0.05)
    with tempfile.TemporaryDirectory(prefix="hsgds-profile-") as tmp:
        for name in args.cases.split(","):
            try:
                if name.startswith("verify-"):
                    vstore = Path(tmp) / "store.zarr"
                    if not vstore.exists():
                        make_store(Path(tmp), False)
                    grid = hsgds.open_scene(vstore).grid
                    with defaults.set(verify_reads=name == "verify-on"):
                        loader = hsgds.PatchLoader(vstore, patch_size=5, batch_size=256, split=None, device=device,
                                                   ring_bytes=16 * grid.tile_nbytes, shuffle_window=4, seed=1)
                else:
                    kw = {"torch-posix": dict(reader="posix-pinned"), "torch-kvikio-4096": dict(batch_size=4096),
                          "augment": dict(augment=aug), "dali": dict(engine="dali")}.get(name, {})
                    loader = hsgds.PatchLoader(store, **{"batch_size": 256, **common, **kw})
                with loader:
                    profile(name, loader, device, args.batches // 4 if name == "dali" else args.batches, args.top)
            except Exception as exc:  # one case failing must not hide the others
                print(f"\n===== {name}: failed: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
