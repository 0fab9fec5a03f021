"""GPU checks (run by benchmarks/gpu_check.sh on a CUDA machine; skipped without a CUDA driver):
kvikio / pinned readers into device memory, ring events under slot reuse, both engines on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hsgds
from tests.test_loader import _collect, _train_pixels, border_scene, reference_patches  # noqa: F401

pytestmark = pytest.mark.gpu


def _readers():
    out = ["posix-pinned"]
    try:
        import kvikio  # noqa: F401

        out.append("kvikio")
    except ImportError:
        pass
    return out


def _engines():
    out = ["torch"]
    try:
        import nvidia.dali  # noqa: F401

        out.append("dali")
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("reader", _readers())
@pytest.mark.parametrize("engine", _engines())
def test_gpu_loader_matches_reference(border_scene, reader, engine):  # noqa: F811
    cube, labels, stores = border_scene
    store = stores["reflect"]
    with hsgds.PatchLoader(store, patch_size=13, batch_size=101, split=None, device="cuda", reader=reader,
                           engine=engine, dtype=torch.float32, return_coords=True) as loader:
        assert loader.stats.reader.startswith(reader.split("-")[0])
        got, lab, coords = _collect(loader)
        assert loader.stats.device.startswith("cuda")
    ref = reference_patches(cube, "reflect", 7, _train_pixels(cube, store), coords[:, 0], coords[:, 1], 13)
    np.testing.assert_allclose(got, ref.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(lab, labels[coords[:, 0], coords[:, 1]] - 1)


@pytest.mark.parametrize("reader", _readers())
def test_ring_events_protect_reused_slots(border_scene, reader):  # noqa: F811
    """Two slots for nine tiles, many epochs, no shuffle window: every slot is overwritten again and
    again while earlier kernels may still run; a missing event would corrupt patches."""
    cube, labels, stores = border_scene
    store = stores["zero"]
    nbytes = hsgds.open_scene(store).grid.tile_nbytes
    train = _train_pixels(cube, store)
    with hsgds.PatchLoader(store, patch_size=15, batch_size=16, split=None, device="cuda", reader=reader,
                           ring_bytes=3 * nbytes, shuffle_window=1, return_coords=True) as loader:
        for _ in range(3):
            got, _, coords = _collect(loader)
            ref = reference_patches(cube, "zero", 7, train, coords[:, 0], coords[:, 1], 15)
            np.testing.assert_allclose(got, ref.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)
        assert loader.stats.slots == 3
        assert loader.stats.tiles_loaded > 9  # slots really were reused


def test_auto_choice_on_gpu(border_scene):  # noqa: F811
    with hsgds.PatchLoader(border_scene[2]["edge"], patch_size=5, batch_size=64, split=None) as loader:
        patches, labels = next(iter(loader))
        assert patches.is_cuda and labels.is_cuda
        assert patches.shape == (64, 6, 5, 5)


@pytest.mark.parametrize("src", [torch.uint16, torch.int16, torch.float32, torch.uint8])
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fused_kernel_equals_plain_torch_ops(src, out, layout):
    """The one-pass Triton kernel gives bit-identical results to the multi-pass torch path."""
    from hsgds import defaults
    from hsgds.engines import PatchSpec, TorchEngine, triton_cut

    if not triton_cut.available():
        pytest.skip("Triton not importable")
    g = torch.Generator().manual_seed(0)
    slots, side, bands, p, halo = 3, 48, 37, 13, 7
    if src.is_floating_point:
        storage = torch.randn(slots, side, side, bands, generator=g).to(src)
    else:
        hi = 65535 if src == torch.uint16 else 255 if src == torch.uint8 else 32767
        lo = 0 if src in (torch.uint16, torch.uint8) else -32768
        storage = torch.randint(lo, hi + 1, (slots, side, side, bands), generator=g, dtype=torch.int64)
        storage = storage.to(torch.int32).to(torch.int16 if src == torch.uint16 else src)
        if src == torch.uint16:
            storage = storage.view(torch.uint16)
    storage = storage.cuda()
    rng = np.random.default_rng(1)
    spec = PatchSpec(patch_size=p, halo=halo, bands=bands, tile_side=side, layout=layout, out_dtype=out,
                     offset=rng.normal(100, 10, bands), scale=1 / rng.uniform(1, 50, bands))
    n = 300
    slot = torch.from_numpy(rng.integers(0, slots, n)).cuda()
    y = torch.from_numpy(rng.integers(halo, side - halo, n)).cuda()
    x = torch.from_numpy(rng.integers(halo, side - halo, n)).cuda()
    engine = TorchEngine(spec, "cuda")
    fused = engine.cut(storage, slot, y, x)
    with defaults.set(triton=0):
        plain = engine.cut(storage, slot, y, x)
    assert fused.shape == plain.shape and fused.dtype == plain.dtype
    torch.testing.assert_close(fused, plain, rtol=0, atol=0)



@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_fused_kernel_on_a_gpu_other_than_the_current_one():
    """A ring on cuda:1 while cuda:0 is current (device="cuda:1" without set_device): Triton launches on the
    current device, so the kernel must be launched with the ring's made current, as torch ops are."""
    from hsgds.engines import PatchSpec, TorchEngine, triton_cut

    if not triton_cut.available():
        pytest.skip("Triton not importable")
    rng = np.random.default_rng(4)
    host = rng.integers(0, 60000, (2, 24, 24, 5)).astype(np.uint16)
    spec = PatchSpec(patch_size=5, halo=2, bands=5, tile_side=24, layout="NCHW", out_dtype=torch.float32,
                     offset=np.zeros(5), scale=np.ones(5))
    slot, y, x = rng.integers(0, 2, 40), rng.integers(2, 22, 40), rng.integers(2, 22, 40)
    want = np.stack([host[s, a - 2:a + 3, b - 2:b + 3] for s, a, b in zip(slot, y, x)]).astype(np.float32)
    torch.cuda.set_device(0)
    on1 = [torch.from_numpy(v).to("cuda:1") for v in (host.view(np.int16), slot, y, x)]
    got = TorchEngine(spec, "cuda:1").cut(on1[0].view(torch.uint16), *on1[1:])
    assert got.device == torch.device("cuda:1")
    np.testing.assert_array_equal(got.cpu().numpy(), want.transpose(0, 3, 1, 2))

def test_fused_kernel_with_strided_coordinates():
    """Coordinates given as columns of an (N, 3) tensor (not contiguous) give the same patches."""
    from hsgds.engines import PatchSpec, TorchEngine

    rng = np.random.default_rng(3)
    storage = torch.from_numpy(rng.integers(0, 60000, (2, 40, 40, 9)).astype(np.int32)).to(torch.int16)
    storage = storage.view(torch.uint16).cuda()
    spec = PatchSpec(patch_size=9, halo=4, bands=9, tile_side=40, layout="NCHW", out_dtype=torch.float32,
                     offset=np.zeros(9), scale=np.ones(9))
    idx = torch.from_numpy(np.stack([rng.integers(0, 2, 64), rng.integers(4, 36, 64), rng.integers(4, 36, 64)],
                                    axis=1)).cuda()
    engine = TorchEngine(spec, "cuda")
    strided = engine.cut(storage, idx[:, 0], idx[:, 1], idx[:, 2])
    plain = engine.cut(storage, idx[:, 0].contiguous(), idx[:, 1].contiguous(), idx[:, 2].contiguous())
    torch.testing.assert_close(strided, plain, rtol=0, atol=0)


def test_predict_runs_a_model_file_where_the_loader_cuts(border_scene, tmp_path, run_cli):  # noqa: F811
    """A model file (loaded on the CPU) runs on the GPU the loader picks, from Python and from `hsgds predict`;
    a CPU module given without a device stays on the CPU."""
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    _, _, stores = border_scene
    store = stores["reflect"]
    with hsgds.PatchLoader(store, patch_size=5, batch_size=64, device="cpu") as loader:
        pass
    torch.manual_seed(0)
    model = SpectralSpatialCNN(hsgds.open_scene(store).shape[2], 4, 5, reduce=4, width=8)
    ckpt = save_checkpoint(tmp_path / "m.ckpt", model, loader=loader)
    on_gpu = hsgds.predict(store, ckpt)
    on_cpu = hsgds.predict(store, ckpt, device="cpu")
    assert (on_gpu == on_cpu).mean() > 0.99  # cuDNN's sums may flip a near-tie
    assert np.array_equal(hsgds.predict(store, model, patch_size=5, norm_stats=loader.norm_stats), on_cpu)
    code, out, err = run_cli("predict", store, "--model", ckpt, "-o", tmp_path / "m.npy")
    assert code == 0, err
    assert (np.load(tmp_path / "m.npy") == on_gpu).mean() > 0.99


def test_a_mask_made_on_the_gpu_is_taken_by_the_loader_and_predict(border_scene):  # noqa: F811
    """`labels > 0` computed on the GPU has no host buffer for numpy: both take it as the same mask on the host."""
    cube, labels, stores = border_scene
    store = stores["reflect"]
    mask = torch.from_numpy(labels > 0).cuda()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(cube.shape[2] * 25, 3)).cuda()
    on_host = hsgds.predict(store, model, patch_size=5, mask=labels > 0)
    assert np.array_equal(hsgds.predict(store, model, patch_size=5, mask=mask), on_host)
    with hsgds.PatchLoader(store, patch_size=5, batch_size=64, pixels="all", mask=mask, device="cuda",
                           return_coords=True) as loader:
        _, _, coords = _collect(loader)
    assert sorted(map(tuple, coords)) == sorted(map(tuple, np.argwhere(labels > 0)))


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature:UserWarning")
def test_augmentation_after_the_cut_never_waits_for_the_stream():
    """On CUDA the noise, mixture and dropout arrays of a batch reach the device through the loader's pinned
    staging (one asynchronous copy): ``.to(device)`` of each pageable array made the host wait for everything
    queued on the stream (the training step) three to seven times a batch. Under torch's sync debug mode any
    such wait raises; the batch equals the CPU's."""
    from hsgds.augment import Augment, Augmenter, draw
    from hsgds.batches import PinnedStaging

    n, bands, p = 64, 8, 5
    aug = Augment(radiation_noise=0.5, mixture_noise=0.5, band_dropout=0.2)
    batch = draw(aug, 0, 0, np.arange(n), np.arange(n) % 3, bands=bands, patch_size=p)
    clean = torch.randn(n, bands, p, p, generator=torch.Generator().manual_seed(0))
    want = clean.clone()
    Augmenter(aug, 0, "NCHW")(want, batch)
    on_gpu = Augmenter(aug, 0, "NCHW", to_device=PinnedStaging(torch.device("cuda")).stage_all)
    on_gpu._bank_on(torch.device("cuda", torch.cuda.current_device()))  # the noise bank: uploaded once per device
    out = clean.cuda()
    torch.cuda.synchronize()
    try:  # the mode is set before torch warns that it is a prototype: reset it whatever happens
        torch.cuda.set_sync_debug_mode("error")
        on_gpu(out, batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(out.cpu(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif("dali" not in _engines(), reason="needs nvidia-dali")
def test_the_dali_engine_gets_the_coordinates_on_the_host(border_scene):  # noqa: F811
    """DALI feeds its pipeline host anchors: the loader hands it the coordinates it made on the host rather than
    their device copy, which the engine copied back every batch (a device-to-host copy waits for the stream:
    the training step queued on it). Its batches equal the torch engine's, flips and turns included."""
    cube, labels, stores = border_scene
    store = stores["reflect"]
    seen = []

    def batches(engine_name):
        with hsgds.PatchLoader(store, patch_size=13, batch_size=101, split=None, device="cuda", engine=engine_name,
                               dtype=torch.float32, return_coords=True,
                               augment=hsgds.Augment(flip=True, rot90=True)) as loader:
            engine = loader._engine
            start_cut = engine.start_cut

            def recording(storage, slot, y, x, table=None, dihedral=None, **kw):
                seen.append((engine_name, {t.device.type for t in (slot, y, x, dihedral)}))
                return start_cut(storage, slot, y, x, table, dihedral, **kw)

            engine.start_cut = recording
            return _collect(loader)

    dali, torch_ = batches("dali"), batches("torch")
    assert [d for name, d in seen if name == "dali"] and all(d == {"cpu"} for name, d in seen if name == "dali")
    assert all(d == {"cuda"} for name, d in seen if name == "torch")  # the fused kernel reads the device copy
    for a, b in zip(dali, torch_):
        np.testing.assert_array_equal(a, b)
