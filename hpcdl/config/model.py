"""model: which network to train."""

from __future__ import annotations

from hpcdl.config.fields import check_types, options, require, require_choice
from hpcdl.models import MODELS


@options("model")
class ModelConfig:
    """Which built-in network to train (see ``hpcdl.models``)."""

    name: str = "small_cnn"
    """A network of hpcdl.models.MODELS: small_cnn, mlp, resnet18, resnet50."""
    width: int = 16
    """Channels of the first convolution (hidden units for mlp), >= 1."""
    dropout: float = 0.0
    """Dropout probability before the classifier, in [0, 1)."""

    def __post_init__(self) -> None:
        check_types(self)
        require_choice(self, "name", MODELS)
        require(self, "width", self.width >= 1, "a positive integer")
        require(self, "dropout", 0 <= self.dropout < 1, "in [0, 1)")
