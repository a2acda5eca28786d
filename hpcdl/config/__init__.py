"""THE typed config tree, defined once: one keyword-only dataclass per section, a docstring under every field.

The same classes are Python arguments (``TrainingOptions(max_epochs=3)``), Hydra
structured configs (composed from ``hpcdl/conf/`` and overrides by ``compose_config``)
and the source of the CLI help and the README's option tables.
"""

from __future__ import annotations

from hpcdl.config.cluster import ClusterConfig
from hpcdl.config.data import AugmentationConfig, DataConfig
from hpcdl.config.model import ModelConfig
from hpcdl.config.network import NetworkConfig
from hpcdl.config.root import Config
from hpcdl.config.training import TrainingOptions

__all__ = ["AugmentationConfig", "ClusterConfig", "Config", "DataConfig", "ModelConfig", "NetworkConfig",
           "TrainingOptions"]
