"""A built-in training run: data and network from the config, results written into one folder.

The folder holds model.pt (a state dict that loads with weights_only=True),
info.json (every record), result.json (the summary), metrics.jsonl and the
progress plot. ``load_result`` reads them back without unpickling anything.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from hpcdl.store.atomic import atomic_save, atomic_write_text, make_folder
from hpcdl.config.compose import config_to_dict
from hpcdl.config import Config, ModelConfig
from hpcdl.data.augment import AugmentedImageDatastore
from hpcdl.data.digits import digits_folder
from hpcdl.data.images import ImageDatastore
from hpcdl.models import build_model
from hpcdl.train.loop import seed_everything, train_network
from hpcdl.store.files import CHECKPOINTS, INFO, MODEL, RESULT
from hpcdl.train.progress import TrainingInfo



def open_datastore(config: Config) -> ImageDatastore:
    """The image datastore the data section names."""
    data = config.data
    root = digits_folder(data.root) if data.name == "digits" else data.root
    return ImageDatastore(root, image_size=data.image_size, labels_csv=data.labels_csv, on_bad_file=data.on_bad_file)


def augmented(store: Dataset, config: Config, training: bool) -> Dataset:
    """The training (augmented) or validation (resized or center-cropped) view of ``store``."""
    settings = dataclasses.asdict(config.data.augmentation)
    size = settings.pop("output_size")
    if size is None:
        return store
    if not training:
        crop = "center" if settings["crop"] != "resize" else "resize"
        return AugmentedImageDatastore(store, size, crop=crop)
    return AugmentedImageDatastore(store, size, seed=config.training.seed or 0, **settings)


def network_shape(data: Dataset) -> dict[str, Any]:
    """What a network needs to know of the data: channels, classes, image size."""
    channels, height, width = data[0][0].shape
    return {"in_channels": channels, "num_classes": len(data.classes), "image_size": [height, width]}


def network_for(model: ModelConfig, shape: dict[str, Any]) -> nn.Module:
    """The configured network for inputs and outputs of ``shape``."""
    return build_model(model.name, in_channels=shape["in_channels"], num_classes=shape["num_classes"],
                       width=model.width, dropout=model.dropout, image_size=tuple(shape["image_size"]))


def run_training(config: Config, folder: str | Path) -> dict[str, Any]:
    """Train as ``config`` says, write every result into ``folder``, return the summary.

    In a distributed run only the lead worker writes (and returns) the summary; the others return {}.
    """
    folder = make_folder(folder)
    options = dataclasses.replace(
        config.training,
        output_dir=config.training.output_dir or str(folder),
        checkpoint_path=config.training.checkpoint_path or str(folder / CHECKPOINTS),
    )
    store = open_datastore(config)
    train_set, validation_set = store.split(config.data.validation_fraction, seed=options.seed or 0)
    seed_everything(options.seed)
    train_view, validation_view = augmented(train_set, config, True), augmented(validation_set, config, False)
    shape = network_shape(train_view)
    model = network_for(config.model, shape)
    model, info = train_network(train_view, model, options,
                                validation_data=validation_view if len(validation_set) else None)
    if not info.writer:
        return {}
    atomic_save(folder / MODEL, lambda f: torch.save(model.state_dict(), f))
    atomic_write_text(folder / INFO, json.dumps(dataclasses.asdict(info)))
    final = info.final_validation or {}
    summary = {
        "name": config.name, "device": info.device, "stop_reason": info.stop_reason,
        "iterations": info.history[-1]["iteration"] if info.history else 0,
        "final_loss": info.history[-1]["loss"] if info.history else None,
        "validation_loss": final.get("loss"), "validation_accuracy": final.get("accuracy"),
        "classes": info.classes, "network": shape, "skipped_files": info.skipped_files,
        "data_wait_share": round(info.data_wait_share, 4), "config": config_to_dict(config),
    }
    atomic_write_text(folder / RESULT, json.dumps(summary, indent=2))
    return summary


def load_result(folder: str | Path) -> tuple[nn.Module, TrainingInfo, dict[str, Any]]:
    """The trained network, its TrainingInfo and summary from a finished run's folder."""
    folder = Path(folder)
    summary = json.loads((folder / RESULT).read_text())
    info = TrainingInfo(**json.loads((folder / INFO).read_text()))
    model = network_for(ModelConfig(**summary["config"]["model"]), summary["network"])
    model.load_state_dict(torch.load(folder / MODEL, map_location="cpu", weights_only=True))
    return model.eval(), info, summary

