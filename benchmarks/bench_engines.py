"""Time the patch engines side by side on synthetic ring storage; print one JSON document.

Default case: uint16 store, B=200 bands, 4 slots of S=96 px, p=13 patches, batches of 256, NCHW, float32
and bfloat16 outputs; every available (engine, device) pair: torch and DALI on the CPU, and on CUDA if present.
Each run cycles through a few precomputed coordinate batches, so no two consecutive batches are alike.
On the CPU, "torch" is the torch engine with its fused numba kernel (when numba imports), "torch-ops" the
same engine on plain torch ops; each runs with every ``--cpu-threads`` count, and a ``memcpy`` row copies
the same output bytes (torch ``copy_`` on one thread, the loader benchmark's ceiling). Rows carry wall
time and the process's CPU time per batch: on a machine shared with other jobs the CPU time shows the
work itself, the wall time what other jobs left of the cores.

    python benchmarks/bench_engines.py [--seconds 2] [--layout NCHW] [--devices cpu,cuda] [--cpu-threads 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np
import torch

from hsgds import defaults
from hsgds.engines import PatchSpec, make_engine
from hsgds.errors import DependencyError
from hsgds.train import synchronize


def bench_one(engine_name: str, device: str, out_dtype: torch.dtype, args: argparse.Namespace,
              threads: int = 0) -> dict[str, Any]:
    p, bands, slots, side, batch, halo = args.patch, args.bands, args.slots, args.side, args.batch, args.halo
    gen = torch.Generator().manual_seed(0)
    storage = torch.randint(0, 65536, (slots, side, side, bands), generator=gen, dtype=torch.int32)
    storage = storage.to(torch.uint16).to(device)
    rng = np.random.default_rng(1)
    offset = rng.uniform(100, 5000, bands)
    scale = 1.0 / rng.uniform(50, 2000, bands)
    spec = PatchSpec(p, halo, bands, side, args.layout, out_dtype, offset, scale)
    coords = []
    for _ in range(8):
        c = [torch.randint(0, slots, (batch,), generator=gen)]
        c += [torch.randint(halo, side - halo, (batch,), generator=gen) for _ in range(2)]
        coords.append([t.to(device) for t in c])
    name = "torch" if engine_name == "torch-ops" else engine_name
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _bench_engine(engine_name, name, device, out_dtype, spec, storage, coords, args, threads, batch)
    finally:
        torch.set_num_threads(before)


def _bench_engine(engine_name: str, name: str, device: str, out_dtype: torch.dtype, spec: PatchSpec,
                  storage: torch.Tensor, coords: list, args: argparse.Namespace, threads: int,
                  batch: int) -> dict[str, Any]:
    try:
        with defaults.set(numba=engine_name != "torch-ops"):
            engine = make_engine(name, spec, device, max_batch_size=batch)
    except DependencyError as exc:
        return {"engine": engine_name, "device": device, "skipped": str(exc)}
    out = None
    for i in range(args.warmup):
        out = engine.cut(storage, *coords[i % len(coords)])
    synchronize(torch.device(device))
    out_bytes = out.numel() * out.element_size()
    n, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while True:
        engine.cut(storage, *coords[n % len(coords)])
        n += 1
        if n % 4 == 0:
            synchronize(torch.device(device))
            if time.perf_counter() - start >= args.seconds:
                break
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    reasons = list(engine.reasons)
    engine.close()
    row = {
        "engine": engine_name,
        "device": device,
        "out_dtype": str(out_dtype).removeprefix("torch."),
        "batches": n,
        "ms_per_batch": round(elapsed / n * 1e3, 3),
        "cpu_ms_per_batch": round(cpu / n * 1e3, 3),
        "patches_per_s": round(n * batch / elapsed, 1),
        "out_GB_per_s": round(n * out_bytes / elapsed / 1e9, 3),
        "out_bytes": out_bytes,
        "reasons": reasons,
    }
    if device == "cpu" and engine_name != "dali":
        row["threads"] = threads or torch.get_num_threads()
    return row


def memcpy_row(out_bytes: int, seconds: float) -> dict[str, Any]:
    """Copy ``out_bytes`` between two preallocated buffers with torch on one thread (the ceiling that
    bench_loader.py reports), timed like the engines."""
    src = torch.empty(out_bytes // 4, dtype=torch.float32).uniform_()
    dst = torch.zeros_like(src)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dst.copy_(src)
        n, start, cpu0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            dst.copy_(src)
            n += 1
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    finally:
        torch.set_num_threads(threads)
    return {"engine": "memcpy", "device": "cpu", "out_bytes": out_bytes, "batches": n, "threads": 1,
            "ms_per_batch": round(elapsed / n * 1e3, 3), "cpu_ms_per_batch": round(cpu / n * 1e3, 3),
            "out_GB_per_s": round(n * out_bytes / elapsed / 1e9, 3),
            "out_GB_per_s_cpu_time": round(n * out_bytes / cpu / 1e9, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patch", type=int, default=13)
    ap.add_argument("--bands", type=int, default=200)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--side", type=int, default=96, help="padded tile side S")
    ap.add_argument("--halo", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--layout", default="NCHW", choices=["NCHW", "NHWC"])
    ap.add_argument("--out-dtypes", default="float32,bfloat16")
    ap.add_argument("--engines", default="torch,torch-ops,dali",
                    help="torch (fused numba kernel on the CPU when numba imports), torch-ops, dali")
    ap.add_argument("--cpu-threads", default="0",
                    help="comma-separated thread counts for the CPU cut (torch.set_num_threads during the run; "
                         "the torch engine cuts with at most that many and the setting torch_threads; 0: torch's)")
    ap.add_argument("--devices", default=None, help="default: cpu, plus cuda when available")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per case")
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    devices = args.devices.split(",") if args.devices else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = []
    for device in devices:
        for out_name in args.out_dtypes.split(","):
            sizes = set()
            for engine_name in args.engines.split(","):
                cpu_engine = device == "cpu" and engine_name != "dali"
                counts = [int(t) for t in args.cpu_threads.split(",")] if cpu_engine else [0]
                for threads in counts:
                    if device != "cpu" and engine_name == "torch-ops":
                        continue  # the same engine as "torch" off the CPU
                    row = bench_one(engine_name, device, getattr(torch, out_name), args, threads)
                    results.append(row)
                    sizes.add(row.get("out_bytes"))
            if device == "cpu":
                for nbytes in sorted(b for b in sizes if b):
                    results.append({**memcpy_row(nbytes, args.seconds), "out_dtype": out_name})
    doc = {
        "case": {k: getattr(args, k) for k in ("patch", "bands", "slots", "side", "halo", "batch", "layout")},
        "store_dtype": "uint16",
        "host": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "results": results,
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
