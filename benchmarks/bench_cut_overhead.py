"""Host time of one CPU batch before its first kernel call: what the calling thread does in
``TorchEngine.cut`` (argument checks, patch starts and bounds, the output buffer, the hand-off to the
cutting threads) while no thread is cutting yet.

    python benchmarks/bench_cut_overhead.py [--batches 400] [--threads 2] [--json out.json]

One engine (fused numba kernel), Indian Pines-shaped batches (256 x 13 x 13 x 200, uint16 ring of 4
tiles of 157 px, float32 NCHW), cut back to back, so every call starts right after a cut has streamed
35 MB through the caches, as in a loader. Prints the medians (after 50 warm-up batches) of the time from
the call to the first ``cpu_cut.cut_range`` call and of the whole call, in µs. White-box on purpose:
it wraps the kernel's entry point to see when the first range starts. Run it from two checkouts,
alternated, to compare their per-batch host work (``PYTHONPATH=/other/checkout``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from hsgds.engines import PatchSpec, cpu_cut, make_engine

P, BANDS, SIDE, HALO, SLOTS, N = 13, 200, 157, 6, 4, 256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not cpu_cut.available():
        raise SystemExit(cpu_cut.unavailable_reason())
    gen = torch.Generator().manual_seed(0)
    storage = torch.randint(0, 9000, (SLOTS, SIDE, SIDE, BANDS), generator=gen, dtype=torch.int32).to(torch.uint16)
    rng = np.random.default_rng(1)
    spec = PatchSpec(P, HALO, BANDS, SIDE, "NCHW", torch.float32, rng.uniform(100, 5000, BANDS),
                     1 / rng.uniform(50, 2000, BANDS))
    batches = [torch.from_numpy(np.stack([rng.integers(0, SLOTS, N), rng.integers(HALO, SIDE - HALO, N),
                                          rng.integers(HALO, SIDE - HALO, N)])) for _ in range(8)]
    torch.set_num_threads(args.threads)
    engine = make_engine("torch", spec, "cpu", max_batch_size=N)
    first: list[float | None] = [None]
    cut_range = cpu_cut.cut_range

    def timed_range(*a, **k):  # the first range of a batch marks the end of the host work before it
        if first[0] is None:
            first[0] = time.perf_counter()
        cut_range(*a, **k)

    cpu_cut.cut_range = timed_range
    before, whole = [], []
    try:
        for b in range(args.batches):
            index = batches[b % len(batches)]
            first[0] = None
            t0 = time.perf_counter()
            engine.cut(storage, index[0], index[1], index[2])
            t1 = time.perf_counter()
            assert first[0] is not None
            before.append(first[0] - t0)
            whole.append(t1 - t0)
    finally:
        cpu_cut.cut_range = cut_range
        engine.close()
    result = {"before_first_kernel_us": 1e6 * float(np.median(before[50:])),
              "whole_cut_us": 1e6 * float(np.median(whole[50:])), "threads": args.threads,
              "batch": [N, BANDS, P, P], "batches": args.batches}
    print(f"before the first kernel: {result['before_first_kernel_us']:.0f} us; whole cut: "
          f"{result['whole_cut_us']:.0f} us (medians, {args.threads} threads)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
