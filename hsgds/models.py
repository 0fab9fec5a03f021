"""A small standard hyperspectral classifier for the demo and the end-to-end benchmarks.

:class:`Hamida3D` is a 3-D CNN in the style of Hamida et al. (2018, "3-D deep learning approach for remote
sensing image classification", IEEE TGRS 56(8)): 3-D convolutions over (band, y, x) whose spectral strides
replace pooling, then a linear classifier. It is sized so that a CPU trains it on Indian Pines in about a
minute; on a GPU it is small enough that a slow loader shows up in the step time.
"""

from __future__ import annotations

import torch
from torch import nn

from hsgds.errors import ConfigError

__all__ = ["MIN_BANDS", "Hamida3D", "make_model"]

#: fewest bands the spectral convolutions and strides leave at least one band for
MIN_BANDS = 37


class Hamida3D(nn.Module):
    """3-D CNN over a (N, B, p, p) patch batch (NCHW, bands as channels) -> (N, classes) logits.

    Parameters
    ----------
    bands : int
        Spectral bands B of the input.
    classes : int
        Number of output classes.
    patch_size : int
        Side p of the input patches (odd, >= 3).
    width : int
        Filters of the first block; later blocks use twice as many.
    """

    def __init__(self, bands: int, classes: int, patch_size: int, width: int = 8) -> None:
        super().__init__()
        if patch_size < 3:
            raise ConfigError(f"patch_size must be >= 3 for the Hamida3D model, got {patch_size}")
        if bands < MIN_BANDS:
            raise ConfigError(f"the Hamida3D model needs at least {MIN_BANDS} bands (its spectral strides), "
                              f"but the store has {bands}")
        w1, w2 = width, 2 * width
        self.bands, self.classes, self.patch_size = bands, classes, patch_size
        self.features = nn.Sequential(
            # spectral-spatial block; the spectral stride shrinks the band axis (the paper's pooling)
            nn.Conv3d(1, w1, (7, 3, 3), stride=(3, 1, 1), padding=(0, 1, 1)),
            nn.BatchNorm3d(w1),
            nn.ReLU(inplace=True),
            nn.Conv3d(w1, w1, (3, 1, 1), stride=(2, 1, 1)),  # spectral "pooling" by a strided convolution
            nn.ReLU(inplace=True),
            nn.Conv3d(w1, w2, (3, 3, 3), stride=(1, 1, 1)),  # spatial extent p -> p - 2
            nn.BatchNorm3d(w2),
            nn.ReLU(inplace=True),
            nn.Conv3d(w2, w2, (3, 1, 1), stride=(2, 1, 1)),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool3d((4, 3, 3)),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(w2 * 4 * 3 * 3, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.bands:
            raise ValueError(f"expected (N, {self.bands}, p, p) NCHW patches, got {tuple(x.shape)}")
        return self.classifier(self.features(x.unsqueeze(1)))


def make_model(bands: int, classes: int, patch_size: int, **kwargs: int) -> nn.Module:
    """The benchmark / demo model (:class:`Hamida3D`)."""
    return Hamida3D(bands, classes, patch_size, **kwargs)
