"""Training, evaluation and accuracy metrics for the demo, ``hsgds bench`` and the benchmarks.

Metrics follow the hyperspectral literature: overall accuracy (OA, the fraction of test pixels right),
average accuracy (AA, the mean of the per-class recalls over the classes present in the test split) and
Cohen's kappa (agreement corrected for chance, from the confusion matrix). Given the train pixels per class,
AA is also averaged over the classes that had train pixels (``aa_trained``): a class a split left without
train pixels (a block split's unsplittable class, docs/splits.md) is scored but never trained on, a
guaranteed error that drags AA down whatever the model.

The timed loops separate the time the training loop waits for its next batch (``data_wait_s``) from the
rest of the step, so that a slow input pipeline shows up as a stall fraction rather than hiding in the
step time. On CUDA the GPU runs asynchronously, so the loop synchronizes once per step (after the
optimizer step) to make the split honest; the cost of that sync is the same for every loader compared.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hsgds.errors import ConfigError, InputError

__all__ = [
    "Metrics",
    "StepTimes",
    "class_weights",
    "classification_metrics",
    "compute_only",
    "confusion_matrix",
    "evaluate",
    "train_epochs",
    "train_steps",
]


# ------------------------------------------------------------------------------------------- metrics

def confusion_matrix(y_true: Any, y_pred: Any, num_classes: int) -> np.ndarray:
    """(num_classes, num_classes) int64 counts; row = true class, column = predicted class."""
    t = np.asarray(y_true, dtype=np.int64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.int64).reshape(-1)
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred differ in length: {t.size} vs {p.size}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    for name, a in (("y_true", t), ("y_pred", p)):
        if a.size and (a.min() < 0 or a.max() >= num_classes):
            raise ValueError(f"{name} holds classes outside 0..{num_classes - 1}")
    return np.bincount(t * num_classes + p, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


@dataclass(frozen=True)
class Metrics:
    """Overall accuracy, average (per-class) accuracy, Cohen's kappa, per-class recall (NaN for a class
    absent from the test split) and the confusion matrix; with the train pixels per class (``train_pixels``),
    also AA over the classes that had train pixels (``aa_trained``)."""

    oa: float
    aa: float
    kappa: float
    per_class: tuple[float, ...]
    confusion: np.ndarray = field(repr=False, compare=False)
    train_pixels: tuple[int, ...] | None = None

    @property
    def test_pixels(self) -> tuple[int, ...]:
        """Test pixels of each class (the confusion matrix's row sums)."""
        return tuple(int(v) for v in self.confusion.sum(axis=1))

    @property
    def untested(self) -> tuple[int, ...]:
        """The classes (indices) without test pixels: not in AA."""
        return tuple(i for i, n in enumerate(self.test_pixels) if n == 0)

    @property
    def untrained(self) -> tuple[int, ...]:
        """The classes (indices) without train pixels (none when the train pixels are not known)."""
        return () if self.train_pixels is None else tuple(i for i, n in enumerate(self.train_pixels) if n == 0)

    @property
    def trained_scored(self) -> tuple[int, ...]:
        """The classes (indices) with test pixels and train pixels: those ``aa_trained`` averages."""
        return tuple(i for i, n in enumerate(self.test_pixels) if n > 0 and i not in self.untrained)

    @property
    def aa_trained(self) -> float | None:
        """AA over the classes that had train pixels (NaN when none of the scored classes had any; None when
        the train pixels are not known): what the model learned, without the classes it never saw."""
        if self.train_pixels is None:
            return None
        scored = self.trained_scored
        return float(np.mean([self.per_class[i] for i in scored])) if scored else float("nan")

    def as_dict(self) -> dict[str, Any]:
        aa_trained = self.aa_trained
        return {"oa": self.oa, "aa": self.aa, "kappa": self.kappa,
                "per_class": [None if np.isnan(v) else v for v in self.per_class],
                "aa_classes": len(self.per_class) - len(self.untested),
                "aa_trained": None if aa_trained is None or np.isnan(aa_trained) else aa_trained,
                "aa_trained_classes": None if self.train_pixels is None else len(self.trained_scored),
                "test_pixels_per_class": list(self.test_pixels),
                "train_pixels_per_class": None if self.train_pixels is None else list(self.train_pixels)}


def classification_metrics(y_true: Any, y_pred: Any, num_classes: int, train_pixels: Any = None) -> Metrics:
    """OA, AA and kappa of predictions ``y_pred`` against labels ``y_true`` (class indices 0..K-1).
    ``train_pixels``: the train pixels of each class (e.g. ``PatchLoader.class_counts()`` of the training
    loader), for AA over the classes that had any (:attr:`Metrics.aa_trained`)."""
    cm = confusion_matrix(y_true, y_pred, num_classes).astype(np.float64)
    n = cm.sum()
    if n == 0:
        raise ValueError("no samples to score")
    trained = None
    if train_pixels is not None:
        counts = np.asarray(train_pixels, dtype=np.int64).reshape(-1)
        if counts.size > num_classes or (counts < 0).any():
            raise ValueError(f"train_pixels must be at most {num_classes} counts, each >= 0; got {counts.tolist()}")
        trained = tuple(int(v) for v in np.pad(counts, (0, num_classes - counts.size)))  # (classes past it: none)
    oa = float(np.trace(cm) / n)
    support = cm.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(support > 0, np.diag(cm) / support, np.nan)
    aa = float(np.nanmean(recall))
    pe = float((cm.sum(axis=0) * support).sum() / (n * n))  # agreement expected by chance
    kappa = 1.0 if pe == 1.0 else float((oa - pe) / (1.0 - pe))
    return Metrics(oa=oa, aa=aa, kappa=kappa, per_class=tuple(float(v) for v in recall), confusion=cm.astype(np.int64),
                   train_pixels=trained)


# ------------------------------------------------------------------------------------------- loops

@dataclass
class StepTimes:
    """What a timed training loop did: steps, samples, wall time, and the time spent waiting for data."""

    steps: int = 0
    samples: int = 0
    elapsed_s: float = 0.0
    data_wait_s: float = 0.0
    first_batch_s: float | None = None
    losses: list[float] = field(default_factory=list, repr=False)

    @property
    def step_s(self) -> float:
        return self.elapsed_s / self.steps if self.steps else float("nan")

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def stall_fraction(self) -> float:
        return self.data_wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("losses")
        d.update(step_s=self.step_s, steps_per_s=self.steps_per_s, stall_fraction=self.stall_fraction,
                 final_loss=self.losses[-1] if self.losses else None)
        return d


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA); a no-op on the CPU. For timing loops."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def class_weights(counts: Any, power: float = 0.5) -> torch.Tensor:
    """Cross-entropy weights ``(largest class count / class count) ** power`` from the train samples per class
    (e.g. ``PatchLoader.class_counts()``): ``nn.CrossEntropyLoss(weight=class_weights(loader.class_counts()))``.

    ``power`` 0 weighs every sample alike; 1 makes every class weigh as much as the largest; 0.5 (inverse
    square root of the frequency) is the usual middle: on Indian Pines' 10% split (``hsgds demo``) the three
    classes of 2-5 train pixels go from 0-5% recall to 44-100% at about the same OA (AA 78% -> 91-93%). A class
    without train pixels gets 1 (it never is a target).
    """
    if isinstance(power, bool) or not isinstance(power, numbers.Real) or not math.isfinite(power) or power < 0:
        raise ConfigError(f"the class balance power must be a finite number >= 0 (0: every sample alike), got "
                          f"{power!r}")
    counts = np.asarray(counts, dtype=np.float64)
    present = counts > 0
    weights = np.ones(len(counts))
    weights[present] = (counts.max() / counts[present]) ** float(power)
    return torch.tensor(weights, dtype=torch.float32)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          weight: torch.Tensor | None = None) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y, weight=weight)
    loss.backward()
    optimizer.step()
    return loss


def _to(batch: Any, device: torch.device, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch[0], batch[1]
    x = x.to(device, non_blocking=True)
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    return x, y.to(device, non_blocking=True)


def train_steps(model: nn.Module, batches: Iterable[Any], optimizer: torch.optim.Optimizer, *,
                device: Any, steps: int | None = None, warmup: int = 0, dtype: torch.dtype | None = None,
                times: StepTimes | None = None, scheduler: Any = None,
                class_weight: torch.Tensor | None = None) -> StepTimes:
    """Train on ``batches`` ((x, y, ...) tuples) for ``steps`` steps (None: until exhausted).

    The first ``warmup`` steps run untimed (allocator, kernel selection). The clock starts before the first
    timed ``next()``; ``data_wait_s`` sums the time blocked in ``next()`` (plus the copy to ``device``).
    ``dtype`` casts the inputs (e.g. to float32 when a loader yields bfloat16 for a float32 model).
    Pass ``times`` to accumulate over several calls (e.g. epochs). ``scheduler`` (optional) is stepped
    after every optimizer step (e.g. OneCycleLR). ``class_weight``: per-class cross-entropy weights (e.g.
    :func:`class_weights`).
    """
    device = torch.device(device)
    weight = None if class_weight is None else class_weight.to(device)
    model.train()
    times = StepTimes() if times is None else times
    it: Iterator[Any] = iter(batches)
    done = 0
    for _ in range(warmup):
        try:
            x, y = _to(next(it), device, dtype)
        except StopIteration:
            break
        _step(model, optimizer, x, y, weight)
        done += 1
    synchronize(device)
    t0 = time.perf_counter()
    while steps is None or done < steps + warmup:
        w = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        x, y = _to(batch, device, dtype)
        got = time.perf_counter()
        times.data_wait_s += got - w
        if times.first_batch_s is None:
            times.first_batch_s = got - t0
        loss = _step(model, optimizer, x, y, weight)
        if scheduler is not None:
            scheduler.step()
        synchronize(device)
        times.steps += 1
        times.samples += len(y)
        done += 1
        if times.steps % 10 == 1:
            times.losses.append(float(loss.detach()))
    times.elapsed_s += time.perf_counter() - t0
    return times


def train_epochs(model: nn.Module, loader: Any, optimizer: torch.optim.Optimizer, *, epochs: int, device: Any,
                 dtype: torch.dtype | None = None, scheduler: Any = None, step_scheduler: Any = None,
                 log: Any = None, log_every: int = 1, class_weight: torch.Tensor | None = None) -> StepTimes:
    """Train for ``epochs`` full passes over ``loader`` (set_epoch is called when the loader has it).

    ``scheduler`` is stepped once per epoch, ``step_scheduler`` once per optimizer step; ``log`` gets a
    line every ``log_every`` epochs (and after the last); ``class_weight`` as for :func:`train_steps`."""
    times = StepTimes()
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        before = times.steps
        train_steps(model, loader, optimizer, device=device, dtype=dtype, times=times, scheduler=step_scheduler,
                    class_weight=class_weight)
        if scheduler is not None:
            scheduler.step()
        if log is not None and ((epoch + 1) % log_every == 0 or epoch + 1 == epochs):
            log(f"epoch {epoch + 1}/{epochs}: {times.steps - before} steps, loss "
                f"{times.losses[-1] if times.losses else float('nan'):.3f}, {times.elapsed_s:.1f} s so far")
    return times


def compute_only(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
                 optimizer: torch.optim.Optimizer, *, steps: int, warmup: int = 2) -> StepTimes:
    """The ceiling: the same training step on batches already resident on the device (no loader)."""
    if not batches:
        raise ValueError("compute_only needs at least one resident batch")
    device = batches[0][0].device

    def cycle() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield from batches

    return train_steps(model, cycle(), optimizer, device=device, steps=steps, warmup=warmup)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Any], *, device: Any,
             dtype: torch.dtype | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(y_true, y_pred) over ``batches`` in eval mode."""
    device = torch.device(device)
    model.eval()
    trues, preds = [], []
    for batch in batches:
        x, y = _to(batch, device, dtype)
        preds.append(model(x).argmax(1).cpu().numpy())
        trues.append(y.cpu().numpy())
    model.train()
    if not trues:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(trues), np.concatenate(preds)


# ------------------------------------------------------------------------------------------- demo

#: ``hsgds demo`` defaults, chosen so that a 2-core CPU reaches OA >= 85% on Indian Pines (10% train) in
#: about three minutes (benchmarks/README.md has the measurements).
DEMO_EPOCHS = 40
DEMO_PATCH_SIZE = 9
DEMO_BATCH_SIZE = 64
DEMO_LR = 3e-3
DEMO_CLASS_BALANCE = 0.5  # the class_weights power: rare classes learned at about the same OA


def _check_test_split(scene: Any) -> None:
    """A one-line InputError when ``scene`` has no test pixels: training would end with nothing to score (an
    empty --test-mask, a block split that left none)."""
    if len(scene.samples("test")[0]):
        return
    method = scene.meta.split.get("method")
    raise InputError(f"{scene.path} has no test pixels (its {method} split left none): a model trained on it could "
                     f"not be scored; give it a test split first (`hsgds resplit {scene.path} --split blocks`, a "
                     "--test-mask holding labelled pixels, or `hsgds demo --refresh` for the demo's own copy)")


def run_demo(store: Any, *, epochs: int = DEMO_EPOCHS, patch_size: int = DEMO_PATCH_SIZE,
             batch_size: int = DEMO_BATCH_SIZE, lr: float = DEMO_LR, device: Any = None, seed: int = 0,
             out_dir: Any = None, log: Any = print, augment: Any = None,
             class_balance: float = DEMO_CLASS_BALANCE) -> dict[str, Any]:
    """Train :class:`~hsgds.models.SpectralSpatialCNN` on ``store``'s train split with
    :class:`~hsgds.PatchLoader` (AdamW, one-cycle learning rate), score the test split, and, with
    ``out_dir``, save the model (``model.ckpt``, with the statistics it was trained on), predict the whole
    scene and write the class map (``classmap.png``: prediction | ground truth | errors). Returns metrics,
    timings, loader stats and the paths written. ``augment``: an :class:`~hsgds.Augment` for the training
    loader; ``class_balance``: the power of :func:`class_weights` (0: plain cross-entropy). A store without
    test pixels is refused (InputError) before training: nothing could be scored."""
    from pathlib import Path

    from hsgds.inference import predict
    from hsgds.loader import PatchLoader
    from hsgds.models import SpectralSpatialCNN, save_checkpoint

    torch.manual_seed(seed)
    with PatchLoader(store, patch_size=patch_size, batch_size=batch_size, split="train", device=device,
                     seed=seed, augment=augment) as train:
        dev = train.device
        scene = train.scene
        _check_test_split(scene)  # before training, and before out_dir is made: nothing is left behind
        if out_dir is not None:  # fail on an unwritable folder or a missing matplotlib before training
            from hsgds import writers

            out_dir = Path(out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            writers.check_output(out_dir / "classmap.png")
        classes = scene.num_classes or int(train.samples.label.max()) + 1
        model = SpectralSpatialCNN(scene.shape[2], classes, patch_size).to(dev)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
        per_step = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=max(1, epochs * len(train)))
        log(f"training SpectralSpatialCNN ({sum(p.numel() for p in model.parameters())} parameters) on {dev}: "
            f"{len(train.samples)} train pixels, {epochs} epochs of {len(train)} batches of {batch_size}, "
            f"{patch_size}x{patch_size} patches; {train.stats.reader} reader, {train.stats.engine} engine")
        train_counts = train.class_counts()
        weight = class_weights(train_counts, class_balance) if class_balance else None
        times = train_epochs(model, train, optimizer, epochs=epochs, device=dev, step_scheduler=per_step, log=log,
                             log_every=max(1, epochs // 8), class_weight=weight)
        train_stats = train.stats.as_dict()
        # kept with the model: the store's statistics follow its current split, which `hsgds resplit` changes
        # (a model fed other statistics than it trained on loses accuracy: 95% -> 65% OA on Indian Pines)
        norm_stats = train.norm_stats
    with PatchLoader(store, patch_size=patch_size, batch_size=max(batch_size, 256), split="test", device=dev,
                     shuffle=False) as test:
        t0 = time.perf_counter()
        y_true, y_pred = evaluate(model, test, device=dev)
        eval_s = time.perf_counter() - t0
        test_stats = test.stats.as_dict()
    # the pixels the model was trained on, per class: AA is also given over the classes that had any
    metrics = classification_metrics(y_true, y_pred, classes, train_pixels=train_counts)
    result = {"metrics": metrics, "train": times, "eval_s": eval_s, "test_pixels": int(len(y_true)),
              "train_loader": train_stats, "test_loader": test_stats, "device": str(dev),
              "class_names": scene.class_names, "model": "SpectralSpatialCNN",
              "settings": {"epochs": epochs, "patch_size": patch_size, "batch_size": batch_size, "lr": lr,
                           "seed": seed, "augment": None if augment is None else repr(augment),
                           "class_balance": class_balance}}
    if out_dir is not None:
        # the training loader's input, its statistics included: what `hsgds predict` feeds the model
        result["checkpoint"] = str(save_checkpoint(out_dir / "model.ckpt", model, loader=train))
        t0 = time.perf_counter()
        predict(scene, model, patch_size=patch_size, batch_size=1024, device=dev, out=out_dir / "classmap.png",
                norm_stats=norm_stats)
        result["predict_s"] = time.perf_counter() - t0
        result["classmap"] = str(out_dir / "classmap.png")
    return result
