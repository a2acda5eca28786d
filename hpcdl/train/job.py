"""A built-in training run: data and network from the config, results written into one folder.

The folder holds model.pt (a state dict that loads with weights_only=True),
info.json (every record), result.json (the summary), metrics.jsonl and the
progress plot. ``load_result`` reads them back without unpickling anything.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import Dataset, random_split

from hpcdl.store.atomic import atomic_save, atomic_write_text, make_folder
from hpcdl.config.compose import config_to_dict
from hpcdl.errors import ConfigError
from hpcdl.config import Config, ModelConfig
from hpcdl.config.fields import restore
from hpcdl.config.model import MODEL_SUPPLIES
from hpcdl.config.targets import TARGET, build_part, locate, supplied_arguments
from hpcdl.data.augment import AugmentedImageDatastore
from hpcdl.data.images import image_datastore
from hpcdl.data.transformed import TransformedDatastore
from hpcdl.models import build_model
from hpcdl.plan import JobPlan
from hpcdl.train.loop import seed_everything, train_network
from hpcdl.store.files import CHECKPOINTS, CONFUSION, INFO, MODEL, RESULT
from hpcdl.train.predict import predict
from hpcdl.train.progress import TrainingInfo


def _instantiate(target: str, arguments: dict[str, Any]) -> Any:
    """The user's target called with ``arguments``, by Hydra's instantiate (plain Python values, not configs)."""
    from hydra.utils import instantiate

    return instantiate({TARGET: target, **arguments}, _convert_="all")


def training_data(config: Config) -> tuple[Dataset, Optional[Dataset]]:
    """The training and validation data the data section names: the built-in image datastore split per label
    (augmented as configured), or the user's dataset (its pair as given, a single one split at random)."""
    data, seed = config.data, config.training.seed or 0
    if data.built_in:
        store = image_datastore(data.name, data.root, data.image_size, data.labels_csv, data.on_bad_file)
        train_set, validation_set = store.split(data.validation_fraction, seed=seed)
        validation_view = augmented(validation_set, config, False) if len(validation_set) else None
        train_view = augmented(train_set, config, True)
        if data.transform:
            train_view = TransformedDatastore(train_view, build_part(data.transform, data.transform_args,
                                                                     "data.transform"))
        return train_view, validation_view
    made = _instantiate(data._target_, data.args)
    if isinstance(made, (tuple, list)) and len(made) == 2:
        return made[0], made[1]
    if not isinstance(made, Dataset):
        raise TypeError(f"data._target_={data._target_} returned a {type(made).__name__}, "
                        "not a torch Dataset or a (train, validation) pair of them")
    if data.validation_fraction == 0:
        return made, None
    parts = random_split(made, [1 - data.validation_fraction, data.validation_fraction],
                         generator=torch.Generator().manual_seed(seed))
    for part in parts:
        part.classes = getattr(made, "classes", None)  # type: ignore[attr-defined]
    return parts[0], parts[1]


def augmented(store: Dataset, config: Config, training: bool) -> Dataset:
    """The training (augmented) or validation (resized or center-cropped) view of ``store``."""
    settings = config.data.augmentation
    if settings.output_size is None:
        return store
    return AugmentedImageDatastore.from_config(store, settings, seed=config.training.seed or 0, training=training)


def network_shape(data: Dataset) -> dict[str, Any]:
    """What hpcdl can tell a network of the data: the channels and size of CxHxW images, the classes' count."""
    shape: dict[str, Any] = {}
    first = data[0][0]
    if isinstance(first, torch.Tensor) and first.dim() == 3:
        shape.update(in_channels=first.shape[0], image_size=list(first.shape[1:]))
    classes = getattr(data, "classes", None)
    if classes is not None:
        shape["num_classes"] = len(classes)
    return shape


def network_for(model: ModelConfig, shape: dict[str, Any]) -> nn.Module:
    """The configured network for data of ``shape``: a built-in one, or the user's target given what of
    ``shape`` it takes by name (in_channels, num_classes, image_size)."""
    if not model.built_in:
        return _instantiate(model._target_, {**supplied_arguments(locate(model._target_, "model._target_"), shape),
                                             **model.args})
    missing = [key for key in MODEL_SUPPLIES if key not in shape]
    if missing:
        raise ValueError(f"model: the built-in networks need images of CxHxW with classes; the data gives no "
                         f"{', '.join(missing)} (give your dataset a classes attribute, or use your own network)")
    return build_model(model.name, in_channels=shape["in_channels"], num_classes=shape["num_classes"],
                       width=model.width, dropout=model.dropout, image_size=tuple(shape["image_size"]))


def check_build(config: Config) -> None:
    """Build the training data and the network once, here, on the CPU; ConfigError naming the section whose
    constructor failed, with its error (python -m hpcdl.submit check_build=true)."""
    try:
        train_view, _ = training_data(config)
        shape = network_shape(train_view)
    except Exception as e:  # the user's dataset may raise anything
        raise ConfigError(f"data: building {config.data._target_} failed: {_own_error(e)}") from e
    try:
        network_for(config.model, shape)
    except Exception as e:  # the user's network may raise anything
        raise ConfigError(f"model: building {config.model._target_} failed: {_own_error(e)}") from e


def _own_error(error: BaseException) -> str:
    """The constructor's own error, out of Hydra's InstantiationException around it."""
    from hydra.errors import InstantiationException

    while isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"


def run_training(plan: JobPlan, folder: str | Path) -> dict[str, Any]:
    """Train as the plan of a training job says (its config, and the loads, global batch, learning rate and
    collective timeout it resolved), write every result into ``folder``, return the summary.

    In a distributed run only the lead worker writes (and returns) the summary; the others return {}.
    """
    config = plan.config
    if plan.kind != "train" or config is None:
        raise ConfigError(f"run_training: a {plan.kind} job's plan; only a training job's runs the trainer")
    folder = make_folder(folder)
    options = config.training
    train_view, validation_view = training_data(config)
    seed_everything(options.seed)
    shape = network_shape(train_view)
    model = network_for(config.model, shape)
    model, info = train_network(train_view, model, options, validation_data=validation_view,
                                output_dir=folder, checkpoint_path=folder / CHECKPOINTS, ranks=plan.ranks)
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
        "data_wait_share": round(info.data_wait_share, 4), "checkpoint_s": info.checkpoint_s, "speed": info.speed,
        "config": config_to_dict(config),
    }
    atomic_write_text(folder / RESULT, json.dumps(summary, indent=2))
    if validation_view is not None and info.classes and final.get("accuracy") is not None:  # classification
        atomic_write_text(folder / CONFUSION, json.dumps(confusion(model, validation_view, options, info.classes)))
    return summary


def confusion(model: nn.Module, data: Dataset, options: Any, classes: list[str]) -> dict[str, Any]:
    """The network's confusion matrix on ``data``: counts[true][predicted], rows and columns in ``classes``'
    order (the experiment page shows it)."""
    predicted = predict(model, data, options).argmax(dim=1).tolist()
    counts = [[0] * len(classes) for _ in classes]
    for index, guess in enumerate(predicted):
        counts[int(data[index][1])][guess] += 1
    return {"classes": [str(c) for c in classes], "counts": counts}


def load_result(folder: str | Path) -> tuple[nn.Module, TrainingInfo, dict[str, Any]]:
    """The trained network, its TrainingInfo and summary from a finished run's folder."""
    folder = Path(folder)
    summary = json.loads((folder / RESULT).read_text())
    info = TrainingInfo(**json.loads((folder / INFO).read_text()))
    model = network_for(restore(ModelConfig, summary["config"]["model"]), summary["network"])
    model.load_state_dict(torch.load(folder / MODEL, map_location="cpu", weights_only=True))
    return model.eval(), info, summary

