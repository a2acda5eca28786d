"""An augmented datastore (MATLAB's augmentedImageDatastore + imageDataAugmenter), deterministic per sample.

Each item's random draws come from a generator seeded by (seed, epoch, index),
so a run repeats exactly, a resumed run sees the same images, and background
workers need no shared random state. Geometry (reflection, rotation, scale,
translation, shear) is one affine resampling; crops and resizes come first.
``augment`` works on a batch on any device: a worker calls it on one image
decoded on the CPU, the GPU path on a whole batch decoded by nvJPEG, with the
same draws and so the same crops and flips.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from hpcdl.config.data import AugmentationConfig
from hpcdl.data.batches import pinned_to
from hpcdl.data.views import DatastoreView

RANGES = ("rotation", "scale", "x_translation", "y_translation", "shear")
DRAWS = 12
"""Uniform numbers drawn per image, by position: crop top, crop left, x flip, y flip, rotation, scale, shear,
x translation, y translation, brightness, contrast, saturation (each used only where configured)."""


class AugmentedImageDatastore(DatastoreView):
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
        self._show(store)
        self.output_size, self.seed = (int(size[0]), int(size[1])), seed
        self.crop = crop or settings.crop
        self.reflect = (settings.random_x_reflection, settings.random_y_reflection) if settings else (False, False)
        bounds = {name: getattr(settings, name) if settings else None for name in RANGES}
        self.rotation, self.scale, self.shear = bounds["rotation"], bounds["scale"], bounds["shear"]
        self.translation = (bounds["x_translation"], bounds["y_translation"])
        self.jitter = (settings.brightness, settings.contrast, settings.saturation) if settings else (0.0,) * 3

    def __getitem__(self, key: Any) -> Optional[tuple[torch.Tensor, int]]:
        index, epoch = key if isinstance(key, tuple) else (key, 0)
        item = self.store.item(index, self.draft) if hasattr(self.store, "item") else self.store[index]
        if item is None:  # a bad file skipped by the store
            return None
        image, label = item
        return self.augment([image], self.draws(index, epoch)[None])[0], label

    @property
    def draft(self) -> Optional[tuple[int, int]]:
        """The size a reader may decode down to (JPEG DCT scaling): the output size when images are resized."""
        return self.output_size if self.crop == "resize" else None

    def draws(self, index: int, epoch: int) -> torch.Tensor:
        """Image ``index``'s DRAWS uniform numbers in [0, 1) for ``epoch``, from (seed, epoch, index) alone."""
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 10_000_019 + index)
        return torch.rand(DRAWS, generator=generator, dtype=torch.float64)

    def augment(self, images: Sequence[torch.Tensor], draws: torch.Tensor) -> torch.Tensor:
        """uint8 CxHxW images (any sizes, one device) and their draws (on the CPU) as one uint8 BxCxhxw batch,
        cropped or resized to output_size, then transformed as configured."""
        device = images[0].device
        x = torch.stack([self._fit(image, u) for image, u in zip(images, draws.tolist())])
        flip = draws[:, 2:4] < 0.5
        flip &= torch.tensor(self.reflect)
        matrices = self._affine(draws, flip)
        if matrices is None:  # reflections alone are exact index flips
            for dim, column in ((-1, flip[:, 0]), (-2, flip[:, 1])):
                if column.any():
                    x = torch.where(pinned_to(column, device)[:, None, None, None], x.flip(dim), x)
        else:
            grid = F.affine_grid(pinned_to(matrices, device), list(x.shape), align_corners=False)
            x = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="zeros",
                              align_corners=False).round_().clamp_(0, 255).to(torch.uint8)
        if any(self.jitter):
            x = self._colour(x, draws)
        return x

    def _fit(self, image: torch.Tensor, u: Sequence[float]) -> torch.Tensor:
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
            top, left = int(u[0] * (h - height + 1 - 1e-9)), int(u[1] * (w - width + 1 - 1e-9))
        return image[:, top:top + height, left:left + width]

    def _affine(self, draws: torch.Tensor, flip: torch.Tensor) -> Optional[torch.Tensor]:
        """Bx2x3 sampling matrices (output to input, normalised coordinates); None when only flips are set."""
        if not (self.rotation or self.scale or self.shear or any(self.translation)):
            return None
        angle = _between(self.rotation, draws[:, 4], 0.0).deg2rad()
        zoom = _between(self.scale, draws[:, 5], 1.0)
        shear = _between(self.shear, draws[:, 6], 0.0).deg2rad()
        height, width = self.output_size
        tx = _between(self.translation[0], draws[:, 7], 0.0) * 2 / width
        ty = _between(self.translation[1], draws[:, 8], 0.0) * 2 / height
        cos, sin, tan = angle.cos(), angle.sin(), shear.tan()
        forward = torch.zeros(len(draws), 3, 3, dtype=torch.float64)
        forward[:, 0, 0], forward[:, 0, 1], forward[:, 0, 2] = zoom * cos, zoom * (-sin + tan * cos), tx
        forward[:, 1, 0], forward[:, 1, 1], forward[:, 1, 2] = zoom * sin, zoom * (cos + tan * sin), ty
        forward[:, 2, 2] = 1.0
        mirror = torch.diag_embed(torch.cat([1.0 - 2.0 * flip.double(), torch.ones(len(draws), 1)], dim=1))
        return torch.linalg.inv(forward @ mirror)[:, :2].float()

    def _colour(self, image: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        brightness, contrast, saturation = self.jitter
        x = image.float()
        factor = lambda amount, u: pinned_to(1 - amount + 2 * amount * u, x.device).float()[:, None, None, None]  # noqa: E731
        if brightness:
            x = x * factor(brightness, draws[:, 9])
        if contrast:
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            x = (x - mean) * factor(contrast, draws[:, 10]) + mean
        if saturation and x.shape[1] == 3:
            grey = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)
            x = (x - grey) * factor(saturation, draws[:, 11]) + grey
        return x.round_().clamp_(0, 255).to(torch.uint8)


def _between(bounds: Optional[tuple[float, float]], u: torch.Tensor, default: float) -> torch.Tensor:
    """low + (high - low) * u, or ``default`` everywhere when the range is not set."""
    return bounds[0] + (bounds[1] - bounds[0]) * u if bounds else torch.full_like(u, default)

