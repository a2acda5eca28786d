"""The root of the tree: a job's name, its sections and what submit does with it."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import field
from typing import Optional

from hpcdl.config.cluster import ClusterConfig
from hpcdl.config.data import DataConfig
from hpcdl.config.fields import check_types, options
from hpcdl.config.model import ModelConfig
from hpcdl.config.training import TrainingOptions
from hpcdl.errors import ConfigError


def check_job_name(name: str, option: str) -> None:
    """ConfigError unless ``name`` is a non-empty line without control characters (it reaches scripts)."""
    if not name.strip() or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ConfigError(f"{option}: must be a non-empty line without control characters, got {name!r}")


@options("config")
class Config:
    """The root of a composed config: what to train, on what data, how and where."""

    name: str = "train"
    """Job name: shown in listings and used in folder names."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The network (config group model/)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The images (config group data/)."""
    training: TrainingOptions = field(default_factory=TrainingOptions)
    """How to train (config group training/)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Where to run (config group cluster/): local or a Slurm profile."""
    dry_run: bool = False
    """python -m hpcdl.submit: print the exact job script and environment, submit nothing."""
    wait: bool = False
    """python -m hpcdl.submit: follow the job with a progress bar until it ends, then print its result."""
    check_build: bool = False
    """python -m hpcdl.submit: build the dataset and the network once on this machine's CPU first, so that a
    constructor refusing its arguments is refused here, not on the node (costs the build)."""
    entry: Optional[str] = None
    """Your function to run on every rank instead of the built-in trainer (mypkg.train:main), given the Config."""
    script: Optional[str] = None
    """Your Python script to run on every rank instead of the built-in trainer; its arguments follow `--`."""

    def __post_init__(self) -> None:
        check_types(self)
        check_job_name(self.name, "name")
        if self.entry is not None and self.script is not None:
            raise ConfigError("entry and script: give one (a function or a script runs on every rank)")
        if self.training.validation_patience is not None and self.data.validation_fraction == 0:
            raise ConfigError("training.validation_patience: set, but data.validation_fraction=0 "
                              "leaves no validation data")
        if self.training.output_network == "best-validation-loss" and self.data.validation_fraction == 0:
            raise ConfigError("training.output_network=best-validation-loss: needs data.validation_fraction > 0")
        if self.data.transform is not None and self.training.gpu_decode == "on":
            raise ConfigError("training.gpu_decode=on: decodes and augments on the GPU, where data.transform "
                              "(run in the workers) cannot follow; set gpu_decode=auto or off")


@functools.cache
def sections() -> dict[str, type]:
    """Every section of the tree by its dotted path ("" is the root), in field order, found from ``Config``."""
    found: dict[str, type] = {}

    def walk(cls: type, path: str) -> None:
        found[path] = cls
        for name, hint in typing.get_type_hints(cls).items():
            if dataclasses.is_dataclass(hint):
                walk(hint, f"{path}.{name}".lstrip("."))

    walk(Config, "")
    return found
