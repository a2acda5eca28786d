"""Small networks for small images: a CNN in MATLAB's example style and an MLP."""

from __future__ import annotations

from torch import nn


def _conv_block(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def small_cnn(*, in_channels: int, num_classes: int, width: int = 16, dropout: float = 0.0,
              image_size: tuple[int, int] = (32, 32)) -> nn.Module:
    """conv-bn-relu x3 with two 2x poolings, global average pooling, a linear classifier."""
    return nn.Sequential(
        *_conv_block(in_channels, width), nn.MaxPool2d(2),
        *_conv_block(width, 2 * width), nn.MaxPool2d(2),
        *_conv_block(2 * width, 4 * width),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout),
        nn.Linear(4 * width, num_classes),
    )


def mlp(*, in_channels: int, num_classes: int, width: int = 16, dropout: float = 0.0,
        image_size: tuple[int, int] = (32, 32)) -> nn.Module:
    """Flatten, two hidden layers of ``8 * width`` units, a linear classifier."""
    features = in_channels * image_size[0] * image_size[1]
    hidden = 8 * width
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, hidden), nn.ReLU(inplace=True),
        nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout),
        nn.Linear(hidden, num_classes),
    )


__all__ = ["small_cnn", "mlp"]
