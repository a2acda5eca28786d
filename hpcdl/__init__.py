"""hpcdl: train PyTorch networks on Slurm clusters from a login node.

The public API is loaded on first use, so that command-line tools which need
no torch (``python -m hpcdl.jobs``) start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainingOptions": "hpcdl.config",
    "ModelConfig": "hpcdl.config",
    "DataConfig": "hpcdl.config",
    "HpcdlError": "hpcdl.errors",
    "ConfigError": "hpcdl.errors",
    "SubmissionError": "hpcdl.errors",
    "JobFailedError": "hpcdl.errors",
    "FolderGoneError": "hpcdl.errors",
    "ImageDatastore": "hpcdl.data.images",
    "TrainingInfo": "hpcdl.train.progress",
    "train_network": "hpcdl.train.loop",
    "seed_everything": "hpcdl.train.loop",
    "predict": "hpcdl.train.predict",
    "classify": "hpcdl.train.predict",
    "build_model": "hpcdl.models",
    "batch": "hpcdl.lifecycle.submission",
    "report": "hpcdl.reporting",
    "report_validation": "hpcdl.reporting",
    "save_result": "hpcdl.reporting",
    "results_dir": "hpcdl.reporting",
    "load_checkpoint": "hpcdl.resumable",
    "save_checkpoint": "hpcdl.resumable",
    "stop_requested": "hpcdl.resumable",
    "stop": "hpcdl.resumable",
    "Job": "hpcdl.lifecycle.job",
    "ClusterConfig": "hpcdl.config.cluster",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hpcdl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
