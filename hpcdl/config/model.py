"""model: which network to train, a built-in one or the user's own (``_target_``)."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Dict, Optional

from hpcdl.config.fields import check_types, options, require, require_choice
from hpcdl.config.targets import check_arguments, locate
from hpcdl.models import MODELS

BUILT_IN_MODEL = "hpcdl.models.build_model"
MODEL_SUPPLIES = ("in_channels", "num_classes", "image_size")
"""What hpcdl passes from the data to a network that takes it by name."""


@options("model")
class ModelConfig:
    """Which network to train: a built-in one (see ``hpcdl.models``) or your own."""

    _target_: str = BUILT_IN_MODEL
    """The network's class or function: the built-in networks' builder, or your own (mypkg.nets.MyNet).

    With your own, the section's other keys are its arguments (+model.depth=34), and in_channels,
    num_classes and image_size come from the data when it takes them by name."""
    name: str = "small_cnn"
    """A network of hpcdl.models.MODELS: small_cnn, mlp, resnet18, resnet50."""
    width: Optional[int] = None
    """Channels of the first convolution (hidden units for mlp), >= 1; null: the network's standard width
    (resnet18/resnet50 64 as in the paper, small_cnn and mlp 16)."""
    dropout: float = 0.0
    """Dropout probability before the classifier, in [0, 1)."""
    args: Dict[str, Any] = field(default_factory=dict)
    """Your network's arguments: the section's other keys, gathered at composition (built-in: empty)."""

    @property
    def built_in(self) -> bool:
        """Whether this is one of hpcdl's networks."""
        return self._target_ == BUILT_IN_MODEL

    def __post_init__(self) -> None:
        check_types(self)
        if not self.built_in:
            check_arguments(locate(self._target_, "model._target_"), self.args, MODEL_SUPPLIES, "model")
            return
        require(self, "args", not self.args, "empty for the built-in networks (they take name, width, dropout)")
        require_choice(self, "name", MODELS)
        require(self, "width", self.width is None or self.width >= 1, "a positive integer or null")
        require(self, "dropout", 0 <= self.dropout < 1, "in [0, 1)")
