"""Every bad option is rejected with a message naming the option, before training starts."""

from __future__ import annotations

import pytest
import torch

from hpcdl import ConfigError, TrainingOptions, train_network
from hpcdl.config.compose import compose_config
from tests.conftest import linear_model


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_epoch": 3}, "unknown option 'max_epoch' (did you mean 'max_epochs'?)"),
        ({"max_epochs": 0}, "training.max_epochs: must be a positive integer"),
        ({"mini_batch_size": -4}, "training.mini_batch_size: must be a positive integer"),
        ({"max_epochs": 2.5}, "training.max_epochs: expected int"),
        ({"max_epochs": "3"}, "training.max_epochs: expected int"),
        ({"verbose": 1}, "training.verbose: expected bool"),
        ({"solver": "lbfgs"}, "training.solver: 'lbfgs' is not allowed; choose one of sgdm, adam, rmsprop"),
        ({"learn_rate_schedule": "step"}, "choose one of none, piecewise, cosine"),
        ({"execution_environment": "tpu"}, "choose one of auto, cpu, gpu, multi-gpu, parallel"),
        ({"precision": "fp8"}, "choose one of float32, bf16, fp16"),
        ({"shuffle": "always"}, "choose one of once, every-epoch, never"),
        ({"initial_learn_rate": 0.0}, "training.initial_learn_rate: must be a positive finite number"),
        ({"momentum": 1.0}, "training.momentum: must be in [0, 1)"),
        ({"l2_regularization": -1e-4}, "training.l2_regularization: must be >= 0"),
        ({"gradient_clip": "norm"}, "training.gradient_threshold: required when training.gradient_clip=norm"),
        ({"validation_patience": 0}, "training.validation_patience: must be a positive integer or null"),
        ({"gpus": [0, 0]}, "training.gpus: must be a list without repeats"),
        ({"gpus": [-1]}, "training.gpus: must be a non-empty list of indices >= 0"),
        ({"gpus": [0], "execution_environment": "cpu"}, "execution_environment=cpu uses no GPU"),
        ({"loss": "focal"}, "training.loss: 'focal' is neither crossentropy nor mse nor a dotted path"),
        ({"loss": "torch.nn.CrossEntropyLos"}, "module 'torch.nn' has no 'CrossEntropyLos' (did you mean "
                                              "'torch.nn.CrossEntropyLoss'?)"),
        ({"loss": "torch.nn.CrossEntropyLoss", "loss_args": {"label_smothing": 0.1}},
         "training.loss_args.label_smothing: torch.nn.modules.loss.CrossEntropyLoss takes no argument "
         "'label_smothing' (did you mean 'label_smoothing'?)"),
        ({"loss": "torch.nn.functional.cross_entropy", "loss_args": {"smoothing": 0.1}},
         "takes no argument 'smoothing'"),
        ({"loss_args": {"label_smoothing": 0.1}}, "training.loss_args: the built-in loss crossentropy takes none"),
    ],
)
def test_bad_training_option_is_rejected_with_its_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        TrainingOptions(**kwargs)
    assert message in str(error.value)


def test_unknown_option_lists_every_valid_option() -> None:
    with pytest.raises(ConfigError) as error:
        TrainingOptions(bogus=1)
    assert "valid options:" in str(error.value) and "mini_batch_size" in str(error.value)


def test_patience_without_validation_data_fails_before_training(blobs) -> None:
    model = linear_model()
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match="validation_patience: set, but no validation_data"):
        train_network(blobs, model, TrainingOptions(validation_patience=3, verbose=False))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_plots_without_output_dir_is_an_error(blobs) -> None:
    with pytest.raises(ConfigError, match="training.output_dir: required"):
        train_network(blobs, linear_model(), TrainingOptions(plots="training-progress", verbose=False))


def test_data_of_wrong_kind_is_an_error() -> None:
    with pytest.raises(ConfigError, match="data: expected a torch Dataset"):
        train_network([1, 2, 3], linear_model(), TrainingOptions(verbose=False))


def test_gpu_requested_without_gpu_is_an_error_not_a_cpu_run(blobs) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="execution_environment=gpu: no usable CUDA GPU"):  # never a CPU run
        train_network(blobs, linear_model(), TrainingOptions(execution_environment="gpu", verbose=False))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.mini_batch_sze=4"], "training: unknown option 'mini_batch_sze' (did you mean 'mini_batch_size'?)"),
        (["training.max_epochs=abc"], "could not be converted to Integer"),
        (["training.max_epochs=0"], "training.max_epochs: must be a positive integer"),
        (["training.solver=newton"], "training.solver: 'newton' is not allowed"),
        (["model=transformer"], "model=transformer: no such option in group model; options: mlp, resnet50, small_cnn"),
        (["cluster=slurmm"], "cluster=slurmm: no such option in group cluster (did you mean slurm?); options: local, slurm"),
        (["model.name=transformer"], "model.name: 'transformer' is not allowed"),
        (["data=folder"], "data.root"),
        (["data.validation_fraction=0", "training.validation_patience=2"], "leaves no validation data"),
        (["nonsense=1"], "config: unknown option 'nonsense'"),
    ],
)
def test_bad_override_is_a_config_error(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        compose_config(overrides)
    assert message in str(error.value)


def test_overrides_reach_the_typed_config() -> None:
    config = compose_config(["training.max_epochs=3", "training.gpus=[0,2]", "model=mlp"])
    assert isinstance(config.training, TrainingOptions)
    assert config.training.max_epochs == 3 and config.training.gpus == [0, 2]
    assert config.model.name == "mlp"


def test_an_own_loss_function_trains_exactly_as_the_built_in_one_and_its_arguments_count(blobs) -> None:
    def train(**loss: object) -> tuple[torch.nn.Module, list[dict]]:
        model = linear_model()
        trained, info = train_network(blobs, model, TrainingOptions(max_epochs=2, mini_batch_size=32,
                                                                    verbose=False, **loss))
        return trained, info.history

    built_in, built_in_history = train()
    own, own_history = train(loss="torch.nn.functional.cross_entropy")
    assert all(torch.equal(a, b) for a, b in zip(built_in.parameters(), own.parameters()))
    assert own_history[-1]["accuracy"] == built_in_history[-1]["accuracy"] is not None  # class indices: counted
    _, smoothed = train(loss="torch.nn.CrossEntropyLoss", loss_args={"label_smoothing": 0.5})
    # with smoothing 0.5 over 3 classes no loss can fall below the entropy of (2/3, 1/6, 1/6) = 0.8676
    assert min(r["loss"] for r in smoothed) >= 0.867
    assert [r["loss"] for r in smoothed] != [r["loss"] for r in built_in_history]  # the argument was used


def test_an_own_loss_on_the_command_line_reaches_the_typed_config() -> None:
    config = compose_config(["training.loss=torch.nn.CrossEntropyLoss", "+training.loss_args.label_smoothing=0.1"])
    assert (config.training.loss, config.training.loss_args) == ("torch.nn.CrossEntropyLoss", {"label_smoothing": 0.1})
