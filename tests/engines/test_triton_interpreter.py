"""The Triton cut kernel's logic on the CPU, under Triton's interpreter (TRITON_INTERPRET=1, CPU tensors):
float32 output bit-identical to a plain numpy reference, bfloat16 within 1 ulp (the interpreter truncates
where a GPU rounds to nearest even), for both layouts, unsigned and signed stores, with and without
per-patch dihedral codes. Runs in a subprocess: the variable must be set before triton is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import numpy as np, torch
    from hsgds.engines import triton_cut
    from hsgds.augment import apply_dihedral_numpy

    rng = np.random.default_rng(0)
    slots, side, bands, p = 3, 9, 5, 5
    r = p // 2
    for store in (np.uint16, np.int16, np.float32):
        tiles = (rng.integers(0, 60000, (slots, side, side, bands)) if store == np.uint16 else
                 rng.integers(-3000, 3000, (slots, side, side, bands))).astype(store)
        n = 23
        slot = rng.integers(0, slots, n)
        y = rng.integers(r, side - r, n)
        x = rng.integers(r, side - r, n)
        codes = rng.integers(0, 8, n).astype(np.int8)
        offset = rng.normal(100, 10, bands)
        scale = 1 / rng.uniform(5, 50, bands)
        for use_codes in (False, True):
            ref = np.empty((n, p, p, bands), np.float32)
            for k in range(n):
                patch = tiles[slot[k], y[k] - r:y[k] + r + 1, x[k] - r:x[k] + r + 1].astype(np.float32)
                if use_codes:
                    patch = apply_dihedral_numpy(patch, int(codes[k]))
                ref[k] = (patch - offset.astype(np.float32)) * scale.astype(np.float32)
            for nchw in (False, True):
                for out_dtype in (torch.float32, torch.bfloat16):
                    shape = (n, bands, p, p) if nchw else (n, p, p, bands)
                    out = torch.empty(shape, dtype=out_dtype)
                    triton_cut.cut(torch.from_numpy(tiles), torch.from_numpy(slot), torch.from_numpy(y),
                                   torch.from_numpy(x), torch.tensor(offset, dtype=torch.float32),
                                   torch.tensor(scale, dtype=torch.float32), out, p, nchw,
                                   torch.from_numpy(codes) if use_codes else None)
                    got = out.float().numpy()
                    want = ref.transpose(0, 3, 1, 2) if nchw else ref
                    if out_dtype == torch.float32:
                        assert np.array_equal(got, want), (store, use_codes, nchw)
                    else:
                        bits = lambda a: (torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16)
                                          .view(torch.int16).int())
                        ulp = (out.view(torch.int16).int() - bits(want)).abs().max().item()
                        assert ulp <= 1, (store, use_codes, nchw, ulp)
    print("ok")
""")


def test_triton_kernel_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


EDGES = textwrap.dedent("""
    import itertools
    import numpy as np, torch
    from hsgds.engines import triton_cut
    from hsgds.augment import apply_dihedral_numpy

    rng = np.random.default_rng(1)
    stores = (np.uint8, np.int8, np.int16, np.uint16, np.int32, np.float16, np.float32)
    # (slots, side, bands, p, n): a 1x1 patch of one band in a 1x1 tile; a patch as large as its tile; a patch
    # row of 5000 values (two passes of the NHWC kernel's 4096-wide block) and 25000 NCHW values (25 programs)
    cases = [(1, 1, 1, 1, 1), (2, 3, 1, 3, 3), (4, 7, 3, 7, 5), (2, 9, 1000, 5, 2)]
    for (slots, side, bands, p, n), store in itertools.product(cases, stores):
        r = p // 2
        if np.issubdtype(store, np.integer):
            info = np.iinfo(store)
            tiles = rng.integers(max(info.min, -2**31), min(info.max, 2**31 - 1), (slots, side, side, bands),
                                 endpoint=True).astype(store)
        else:
            tiles = rng.normal(0, 1000, (slots, side, side, bands)).astype(store)
        slot, y, x = rng.integers(0, slots, n), rng.integers(r, side - r, n), rng.integers(r, side - r, n)
        slot[0], y[0], x[0], y[-1], x[-1] = slots - 1, r, r, side - 1 - r, side - 1 - r  # last slot, corners
        codes = rng.integers(0, 8, n).astype(np.int8)
        offset = rng.normal(100, 10, bands).astype(np.float32)
        scale = (1 / rng.uniform(5, 50, bands)).astype(np.float32)
        for nchw, use_codes in itertools.product((False, True), (False, True)):
            ref = np.empty((n, p, p, bands), np.float32)
            for k in range(n):
                patch = tiles[slot[k], y[k] - r:y[k] + r + 1, x[k] - r:x[k] + r + 1].astype(np.float32)
                ref[k] = ((apply_dihedral_numpy(patch, int(codes[k])) if use_codes else patch) - offset) * scale
            want = np.ascontiguousarray(ref.transpose(0, 3, 1, 2) if nchw else ref)
            out = torch.full(want.shape, float("nan"))
            triton_cut.cut(torch.from_numpy(tiles), torch.from_numpy(slot), torch.from_numpy(y), torch.from_numpy(x),
                           torch.from_numpy(offset), torch.from_numpy(scale), out, p, nchw,
                           torch.from_numpy(codes) if use_codes else None)
            assert np.array_equal(out.numpy(), want), (store, slots, side, bands, p, nchw, use_codes)
    print("ok")
""")


def test_triton_kernel_edge_shapes_and_store_dtypes_under_the_interpreter():
    """p=1, B=1, a patch the size of its tile, rows longer than one block, patches at the last slot's corners,
    every store dtype the kernel loads (8-, 16- and 32-bit integers, float16, float32): float32 output
    bit-identical to numpy."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", EDGES], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
