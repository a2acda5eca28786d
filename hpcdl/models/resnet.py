"""ResNet-18 and ResNet-50 (He et al., 2016), laid out as torchvision's, without torchvision."""

from __future__ import annotations

from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, 1, 1, bias=False), nn.BatchNorm2d(planes),
        )
        self.shortcut = _shortcut(cin, planes * self.expansion, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):  # noqa: ANN001, ANN201 - nn.Module protocol
        return self.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        out = planes * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out),
        )
        self.shortcut = _shortcut(cin, out, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):  # noqa: ANN001, ANN201 - nn.Module protocol
        return self.relu(self.body(x) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


def _resnet(block: type, layers: list[int], in_channels: int, num_classes: int, width: int,
            dropout: float) -> nn.Module:
    stem = [nn.Conv2d(in_channels, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    stages, cin = [], width
    for i, blocks in enumerate(layers):
        planes = width * 2**i
        for j in range(blocks):
            stages.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1))
            cin = planes * block.expansion
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(cin, num_classes)]
    return nn.Sequential(*stem, *stages, *head)


def resnet18(*, in_channels: int, num_classes: int, width: int = 64, dropout: float = 0.0,
             image_size: tuple[int, int] = (224, 224)) -> nn.Module:
    """ResNet-18; ``width`` is the stem's channels (64 in the paper)."""
    return _resnet(BasicBlock, [2, 2, 2, 2], in_channels, num_classes, width, dropout)


def resnet50(*, in_channels: int, num_classes: int, width: int = 64, dropout: float = 0.0,
             image_size: tuple[int, int] = (224, 224)) -> nn.Module:
    """ResNet-50; ``width`` is the stem's channels (64 in the paper)."""
    return _resnet(Bottleneck, [3, 4, 6, 3], in_channels, num_classes, width, dropout)
