"""Validation bookkeeping: the best loss so far, the validations since it, and the best weights.

MATLAB's rule: a validation whose loss is not below the best so far counts
against ValidationPatience; one below it resets the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn


@dataclass
class BestValidation:
    """The best validation loss of a run and what goes with it."""

    keep_weights: bool
    """Keep a copy of the weights at the best loss (output_network=best-validation-loss)."""
    loss: float = math.inf
    """The lowest validation loss so far."""
    bad_validations: int = 0
    """Validations since the best one."""
    weights: Optional[dict[str, torch.Tensor]] = None
    """The weights at the best loss, when kept."""

    def note(self, loss: float, model: nn.Module) -> None:
        """Count one validation of ``model`` whose loss was ``loss``."""
        if loss < self.loss:
            self.loss, self.bad_validations = loss, 0
            if self.keep_weights:
                self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.bad_validations += 1

    def exhausted(self, patience: Optional[int]) -> bool:
        """True once ``patience`` validations in a row did not improve on the best."""
        return patience is not None and self.bad_validations >= patience
