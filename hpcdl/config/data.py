"""data: which images, how they are split and augmented."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Dict, List, Optional

from hpcdl.config.fields import check_types, options, require, require_choice
from hpcdl.config.targets import check_arguments, check_part, locate
from hpcdl.errors import ConfigError

BUILT_IN_DATA = "hpcdl.data.images.image_datastore"


@options("data.augmentation")
class AugmentationConfig:
    """MATLAB's imageDataAugmenter for the training images (validation images are only resized or center-cropped)."""

    output_size: Optional[List[int]] = None
    """[height, width] the network sees; null: no augmented datastore at all."""
    crop: str = "resize"
    """resize (to output_size), random (a random output_size window) or center."""
    random_x_reflection: bool = False
    """Mirror left-right with probability 1/2."""
    random_y_reflection: bool = False
    """Mirror top-bottom with probability 1/2."""
    rotation: Optional[List[float]] = None
    """[low, high] degrees."""
    scale: Optional[List[float]] = None
    """[low, high] zoom factors."""
    x_translation: Optional[List[float]] = None
    """[low, high] pixels."""
    y_translation: Optional[List[float]] = None
    """[low, high] pixels."""
    shear: Optional[List[float]] = None
    """[low, high] degrees."""
    brightness: float = 0.0
    """Colour jitter: brightness factor drawn from [1 - b, 1 + b]."""
    contrast: float = 0.0
    """Colour jitter: contrast factor from [1 - c, 1 + c]."""
    saturation: float = 0.0
    """Colour jitter: saturation factor from [1 - s, 1 + s]."""

    def __post_init__(self) -> None:
        check_types(self)
        require_choice(self, "crop", ("resize", "random", "center"))
        size = self.output_size
        require(self, "output_size", size is None or (len(size) == 2 and min(size) >= 1),
                "[height, width] of positive integers or null")
        for name in ("rotation", "scale", "x_translation", "y_translation", "shear"):
            bounds = getattr(self, name)
            require(self, name, bounds is None or (len(bounds) == 2 and bounds[0] <= bounds[1]),
                    "[low, high] with low <= high, or null")
        require(self, "scale", self.scale is None or self.scale[0] > 0, "[low, high] of factors above 0")
        for name in ("brightness", "contrast", "saturation"):
            require(self, name, 0 <= getattr(self, name) < 1, "in [0, 1)")


@options("data")
class DataConfig:
    """Which images to train on and how to split them: a built-in image datastore or your own dataset."""

    KEPT_WITH_TARGET = ("validation_fraction",)
    """Options that stay hpcdl's when ``_target_`` names the user's dataset."""

    _target_: str = BUILT_IN_DATA
    """The dataset's class or function: the built-in image folders, or your own (mypkg.data.make_dataset).

    Yours returns a torch Dataset of (input, label), split by validation_fraction, or a (train, validation)
    pair; the section's other keys are its arguments (+data.n=100)."""
    name: str = "digits"
    """digits (scikit-learn's 8x8 digits, written once as PNG files under root) or folder (class folders)."""
    root: Optional[str] = None
    """Folder of class folders; for digits, where the PNGs are written (default ~/.cache/hpcdl/digits)."""
    validation_fraction: float = 0.2
    """Share of each label held out for validation, in [0, 1)."""
    image_size: Optional[List[int]] = None
    """Resize every image to [height, width] as it is read; null keeps the files' size."""
    labels_csv: Optional[str] = None
    """A CSV of path,label (paths relative to root) instead of class folders."""
    on_bad_file: str = "error"
    """error (name the file and stop) or skip (warn, leave it out, count it in the summary)."""
    augmentation: AugmentationConfig = field(default_factory=AugmentationConfig)
    """Augmentation of the training images (data.augmentation.output_size turns it on)."""
    transform: Optional[str] = None
    """Your own transform of each training image (a uint8 CxHxW tensor) after the augmentation, in the workers:
    a dotted path to a class built with data.transform_args (torchvision.transforms.v2.ColorJitter) or a
    function called as f(image, **transform_args). It returns a tensor (uint8 is scaled to [0, 1] as usual) of
    the shape and dtype the validation images have, which it does not see. GPU decoding is off with it."""
    transform_args: Dict[str, Any] = field(default_factory=dict)
    """Arguments of data.transform."""
    args: Dict[str, Any] = field(default_factory=dict)
    """Your dataset's arguments: the section's other keys, gathered at composition (built-in: empty)."""

    @property
    def built_in(self) -> bool:
        """Whether this is one of hpcdl's image datastores."""
        return self._target_ == BUILT_IN_DATA

    def __post_init__(self) -> None:
        check_types(self)
        require(self, "validation_fraction", 0 <= self.validation_fraction < 1, "in [0, 1)")
        if not self.built_in:
            check_arguments(locate(self._target_, "data._target_"), self.args, (), "data")
            for name, given in (("augmentation", self.augmentation.output_size is not None),
                                ("transform", self.transform is not None)):
                if given:
                    raise ConfigError(f"data.{name}: for the built-in image datastores; "
                                      "transform your own data in your dataset")
            return
        if self.transform is not None:
            check_part(self.transform, self.transform_args, "data.transform", inputs=1)
        elif self.transform_args:
            raise ConfigError("data.transform_args: arguments of data.transform, which is not set")
        require(self, "args", not self.args, "empty for the built-in datastores (they take name, root, ...)")
        require_choice(self, "name", ("digits", "folder"))
        require_choice(self, "on_bad_file", ("error", "skip"))
        if self.name == "folder" and self.root is None:
            raise ConfigError("data.root: required when data.name=folder")
        size = self.image_size
        require(self, "image_size", size is None or (len(size) == 2 and min(size) >= 1),
                "[height, width] of positive integers or null")
