"""The torch engine's CPU output pool: a batch the caller still holds is never overwritten; an idle one is
reused; chunks cut by several threads give exactly the single-threaded result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hsgds.engines import PatchSpec, TorchEngine


def _setup(layout="NCHW", dtype=torch.float32, n=40, bands=12, p=5, side=20, slots=3):
    rng = np.random.default_rng(0)
    storage = torch.from_numpy(rng.integers(0, 60000, (slots, side, side, bands)).astype(np.uint16))
    spec = PatchSpec(p, 3, bands, side, layout, dtype, rng.uniform(0, 1000, bands), rng.uniform(1e-4, 1e-2, bands))

    def coords(seed):
        g = np.random.default_rng(seed)
        return [torch.from_numpy(a) for a in (g.integers(0, slots, n), g.integers(3, side - 3, n),
                                              g.integers(3, side - 3, n))]
    return storage, spec, coords


@pytest.mark.parametrize("hold", ["tensor", "view", "numpy", "storage"])
def test_held_batches_are_never_overwritten(hold):
    storage, spec, coords = _setup()
    engine = TorchEngine(spec)
    first = engine.cut(storage, *coords(1))
    expected = first.clone()
    shape, offset = first.shape, first.storage_offset()
    kept = {"tensor": first, "view": first[3:7], "numpy": first.numpy(), "storage": first.untyped_storage()}[hold]
    del first
    for seed in range(2, 12):  # more batches than the pool holds
        engine.cut(storage, *coords(seed))
    if hold == "storage":  # a storage handle alone (not a use of the storage that torch counts)
        again = torch.empty(0, dtype=expected.dtype).set_(kept, offset, shape, expected.stride())
    else:
        again = torch.as_tensor(kept) if hold == "numpy" else kept
    ref = expected if hold != "view" else expected[3:7]
    assert torch.equal(again, ref)


def test_idle_buffers_are_reused():
    storage, spec, coords = _setup()
    engine = TorchEngine(spec)
    a = engine.cut(storage, *coords(1))
    ptr = a.data_ptr()
    del a
    b = engine.cut(storage, *coords(2))
    assert b.data_ptr() == ptr  # nobody held the first batch: its buffer served the second
    c = engine.cut(storage, *coords(3))
    assert c.data_ptr() != b.data_ptr()  # b is still held


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_threads_and_chunks_give_the_same_bits(layout, dtype):
    from hsgds import defaults

    storage, spec, coords = _setup(layout, dtype, n=57)
    co = coords(4)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = TorchEngine(spec).cut(storage, *co).clone()
    finally:
        torch.set_num_threads(threads)
    torch.set_num_threads(max(2, threads))
    try:
        with defaults.set(torch_chunk_bytes=4096):  # many small chunks, shared by the threads
            many = TorchEngine(spec).cut(storage, *co)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one.view(torch.uint8), many.view(torch.uint8))


def test_pool_threads_find_the_openmp_runtime():
    """Where torch runs on OpenMP (Linux wheels), the cut threads must find it: without it their kernels
    would form OpenMP teams per small step, which stall on shared cores."""
    import sys

    import hsgds.engines.torch_engine as te

    if not sys.platform.startswith("linux") or "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch does not use OpenMP here")
    lib = te._openmp()
    assert lib is not None and hasattr(lib, "omp_set_num_threads")
