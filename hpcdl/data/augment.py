"""An augmented datastore (MATLAB's augmentedImageDatastore + imageDataAugmenter), deterministic per sample.

Each item's random draws come from a generator seeded by (seed, epoch, index),
so a run repeats exactly, a resumed run sees the same images, and background
workers need no shared random state. Geometry (reflection, rotation, scale,
translation, shear) is one affine resampling; crops and resizes come first.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from hpcdl.config.data import AugmentationConfig

RANGES = ("rotation", "scale", "x_translation", "y_translation", "shear")


class AugmentedImageDatastore(Dataset):
    """Wraps a datastore of (uint8 CxHxW, label); resizes or crops to ``output_size`` and augments.

    The keyword arguments are those of ``data.augmentation`` and follow its rules (AugmentationConfig);
    ``from_config`` builds the datastore from a section that was already checked.
    """

    accepts_epoch = True
    """Items may be asked for as (index, epoch), which the background loader does."""

    def __init__(self, store: Dataset, output_size: Sequence[int], *, crop: str = "resize",
                 random_x_reflection: bool = False, random_y_reflection: bool = False,
                 rotation: Optional[Sequence[float]] = None, scale: Optional[Sequence[float]] = None,
                 x_translation: Optional[Sequence[float]] = None, y_translation: Optional[Sequence[float]] = None,
                 shear: Optional[Sequence[float]] = None, brightness: float = 0.0, contrast: float = 0.0,
                 saturation: float = 0.0, seed: int = 0) -> None:
        ranges = {"rotation": rotation, "scale": scale, "x_translation": x_translation,
                  "y_translation": y_translation, "shear": shear}
        settings = AugmentationConfig(  # the config's own rules, in one place
            output_size=[int(n) for n in output_size], crop=crop, random_x_reflection=random_x_reflection,
            random_y_reflection=random_y_reflection, brightness=float(brightness), contrast=float(contrast),
            saturation=float(saturation),
            **{name: None if value is None else [float(v) for v in value] for name, value in ranges.items()})
        self._configure(store, settings, seed)

    @classmethod
    def from_config(cls, store: Dataset, settings: AugmentationConfig, seed: int = 0,
                    training: bool = True) -> "AugmentedImageDatastore":
        """The training view of ``store`` as ``settings`` (already checked) say, or with ``training=False``
        the validation view: only resized, or center-cropped where training crops."""
        view = cls.__new__(cls)
        view._configure(store, settings if training else None, seed, settings.output_size,
                        "resize" if settings.crop == "resize" else "center")
        return view

    def _configure(self, store: Dataset, settings: Optional[AugmentationConfig], seed: int,
                   output_size: Optional[Sequence[int]] = None, crop: Optional[str] = None) -> None:
        """Take the sizes and ranges of ``settings``; None: no random transform at all."""
        size = output_size or settings.output_size
        self.store, self.output_size, self.seed = store, (int(size[0]), int(size[1])), seed
        self.crop = crop or settings.crop
        self.reflect = (settings.random_x_reflection, settings.random_y_reflection) if settings else (False, False)
        bounds = {name: getattr(settings, name) if settings else None for name in RANGES}
        self.rotation, self.scale, self.shear = bounds["rotation"], bounds["scale"], bounds["shear"]
        self.translation = (bounds["x_translation"], bounds["y_translation"])
        self.jitter = (settings.brightness, settings.contrast, settings.saturation) if settings else (0.0,) * 3
        self.classes = getattr(store, "classes", None)
        self.channels = getattr(store, "channels", None)

    def __len__(self) -> int:
        return len(self.store)

    def reopen(self) -> None:
        """Reopen the wrapped datastore's files in a new worker process."""
        if hasattr(self.store, "reopen"):
            self.store.reopen()

    def __getitem__(self, key: Any) -> Optional[tuple[torch.Tensor, int]]:
        index, epoch = key if isinstance(key, tuple) else (key, 0)
        item = self.store[index]
        if item is None:  # a bad file skipped by the store
            return None
        image, label = item
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 10_000_019 + index)
        return self.augment(image, generator), label

    def augment(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One uint8 CxHxW image, cropped or resized to output_size, then transformed as configured."""
        uniform = lambda low, high: low + (high - low) * torch.rand((), generator=generator).item()  # noqa: E731
        image = self._fit(image, uniform)
        flip_x = self.reflect[0] and uniform(0, 1) < 0.5
        flip_y = self.reflect[1] and uniform(0, 1) < 0.5
        matrix = self._affine(uniform, flip_x, flip_y)
        if matrix is None:  # reflections alone are exact index flips
            dims = [d for d, flip in ((-1, flip_x), (-2, flip_y)) if flip]
            image = image.flip(dims) if dims else image
        else:
            grid = F.affine_grid(matrix.unsqueeze(0), [1, *image.shape], align_corners=False)
            image = F.grid_sample(image.unsqueeze(0).float(), grid, mode="bilinear", padding_mode="zeros",
                                  align_corners=False)[0].round_().clamp_(0, 255).to(torch.uint8)
        if any(self.jitter):
            image = self._colour(image, uniform)
        return image

    def _fit(self, image: torch.Tensor, uniform: Any) -> torch.Tensor:
        height, width = self.output_size
        h, w = image.shape[-2:]
        if self.crop == "resize" or h < height or w < width:
            if (h, w) == (height, width):
                return image
            return F.interpolate(image.unsqueeze(0).float(), size=(height, width), mode="bilinear",
                                 antialias=True, align_corners=False)[0].round_().clamp_(0, 255).to(torch.uint8)
        if self.crop == "center":
            top, left = (h - height) // 2, (w - width) // 2
        else:
            top, left = int(uniform(0, h - height + 1 - 1e-9)), int(uniform(0, w - width + 1 - 1e-9))
        return image[:, top:top + height, left:left + width]

    def _affine(self, uniform: Any, flip_x: bool, flip_y: bool) -> Optional[torch.Tensor]:
        """The 2x3 sampling matrix (output to input, normalised coordinates); None when only flips remain."""
        angle = math.radians(uniform(*self.rotation)) if self.rotation else 0.0
        zoom = uniform(*self.scale) if self.scale else 1.0
        shear = math.radians(uniform(*self.shear)) if self.shear else 0.0
        height, width = self.output_size
        tx = uniform(*self.translation[0]) * 2 / width if self.translation[0] else 0.0
        ty = uniform(*self.translation[1]) * 2 / height if self.translation[1] else 0.0
        if not (angle or zoom != 1.0 or shear or tx or ty):
            return None
        cos, sin = math.cos(angle), math.sin(angle)
        forward = torch.tensor([[zoom * cos, zoom * (-sin + math.tan(shear) * cos), tx],
                                [zoom * sin, zoom * (cos + math.tan(shear) * sin), ty],
                                [0.0, 0.0, 1.0]])
        flip = torch.diag(torch.tensor([-1.0 if flip_x else 1.0, -1.0 if flip_y else 1.0, 1.0]))
        return torch.linalg.inv(forward @ flip)[:2]

    def _colour(self, image: torch.Tensor, uniform: Any) -> torch.Tensor:
        brightness, contrast, saturation = self.jitter
        x = image.float()
        if brightness:
            x = x * uniform(1 - brightness, 1 + brightness)
        if contrast:
            x = (x - x.mean()) * uniform(1 - contrast, 1 + contrast) + x.mean()
        if saturation and x.shape[0] == 3:
            grey = (0.299 * x[0] + 0.587 * x[1] + 0.114 * x[2]).unsqueeze(0)
            x = (x - grey) * uniform(1 - saturation, 1 + saturation) + grey
        return x.round_().clamp_(0, 255).to(torch.uint8)
