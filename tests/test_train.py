"""train_network, predict and classify on real image files and small tensor problems, on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpcdl import ImageDatastore, TrainingOptions, build_model, classify, predict, train_network
from tests.conftest import linear_model

QUIET = {"verbose": False, "execution_environment": "cpu"}


def test_loss_decreases_and_info_holds_every_iteration(blobs) -> None:
    options = TrainingOptions(solver="sgdm", initial_learn_rate=0.1, max_epochs=5, mini_batch_size=16, **QUIET)
    _, info = train_network(blobs, linear_model(), options)
    per_epoch = -(-len(blobs[0]) // 16)
    assert [r["iteration"] for r in info.history] == list(range(1, 5 * per_epoch + 1))
    first, last = info.history[:per_epoch], info.history[-per_epoch:]
    assert sum(r["loss"] for r in last) < 0.5 * sum(r["loss"] for r in first)
    assert {"epoch", "time_s", "accuracy", "learn_rate", "samples_per_s"} <= set(info.history[0])
    assert info.stop_reason == "max-epochs" and info.device.startswith("cpu")


def test_digits_example_reaches_95_percent_validation_accuracy(digits_root: Path, tmp_path: Path, capsys) -> None:
    store = ImageDatastore(digits_root)
    train_set, validation_set = store.split(0.2, seed=0)
    torch.manual_seed(0)
    model = build_model("small_cnn", in_channels=1, num_classes=10)
    options = TrainingOptions(solver="adam", max_epochs=8, mini_batch_size=64, validation_frequency=20,
                              verbose_frequency=20, plots="training-progress", output_dir=str(tmp_path),
                              execution_environment="cpu")
    model, info = train_network(train_set, model, options, validation_data=validation_set)
    assert info.final_validation["accuracy"] >= 0.95
    table = capsys.readouterr().out
    assert "Training on cpu (execution_environment=cpu)" in table
    assert "|  Epoch  |  Iteration  |  Time Elapsed  |" in table and "Training finished: max-epochs" in table
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in records if r["kind"] == "iteration"]) == len(info.history)
    assert [r for r in records if r["kind"] == "validation"] == info.validation_history
    assert (tmp_path / "training-progress.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels, scores = classify(model, validation_set, TrainingOptions(**QUIET))
    assert labels[:3] == [validation_set.classes[validation_set[i][1]] for i in range(3)]


class FrozenNet(torch.nn.Module):
    """A network whose outputs never change: its one trainable parameter enters the output times 0."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = linear_model().requires_grad_(False)
        self.unused = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frozen(x) + 0 * self.unused


def test_progress_table_ends_with_the_last_iteration_and_its_validation(blobs, capsys) -> None:
    """192 samples in batches of 20: 10 iterations an epoch, 30 in all; rows every 4th iteration end at 28."""
    options = TrainingOptions(max_epochs=3, mini_batch_size=20, verbose_frequency=4, validation_frequency=100,
                              execution_environment="cpu")
    _, info = train_network(blobs, linear_model(), options, validation_data=blobs)
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("|  ")][2:]
    assert [int(row[2]) for row in rows] == [1, 4, 8, 12, 16, 20, 24, 28, 30]
    assert rows[-1][5].strip() == f"{100 * info.final_validation['accuracy']:.2f}%"  # the final validation
    assert info.history[-1]["total"] == 30


def test_early_stop_fires_after_patience_validations_without_improvement(blobs) -> None:
    # the validation loss is the same float every time (no rounding can make it fall), and MATLAB's rule
    # counts a loss that is not below the best against the patience
    options = TrainingOptions(max_epochs=50, mini_batch_size=32, validation_frequency=2, validation_patience=3,
                              **QUIET)
    _, info = train_network(blobs, FrozenNet(), options, validation_data=blobs)
    losses = {record["loss"] for record in info.validation_history}
    assert len(losses) == 1
    assert info.stop_reason == "validation-patience"
    assert len(info.validation_history) == 4  # the first sets the best, three more do not beat it
    assert info.history[-1]["iteration"] == 8


def test_callback_receives_each_record_and_can_stop_training(blobs) -> None:
    seen = []

    def stop_at_five(record: dict) -> bool:
        seen.append(record["iteration"])
        return record["iteration"] == 5

    _, info = train_network(blobs, linear_model(), TrainingOptions(max_epochs=10, mini_batch_size=8, **QUIET),
                            callbacks=[stop_at_five])
    assert seen == [1, 2, 3, 4, 5]
    assert info.stop_reason == "callback" and info.history[-1]["iteration"] == 5


def test_same_seed_gives_identical_cpu_runs(blobs) -> None:
    options = TrainingOptions(solver="adam", max_epochs=3, mini_batch_size=16, shuffle="every-epoch", seed=7, **QUIET)
    model_a, info_a = train_network(blobs, linear_model(1), options)
    model_b, info_b = train_network(blobs, linear_model(1), options)
    assert [r["loss"] for r in info_a.history] == [r["loss"] for r in info_b.history]
    assert all(torch.equal(a, b) for a, b in zip(model_a.state_dict().values(), model_b.state_dict().values()))


def test_predict_and_classify_agree_with_the_forward_pass(blobs) -> None:
    model, _ = train_network(blobs, linear_model(), TrainingOptions(max_epochs=2, **QUIET))
    x, _ = blobs
    with torch.no_grad():
        expected = model(x)
    outputs = predict(model, blobs, TrainingOptions(mini_batch_size=7, **QUIET))
    torch.testing.assert_close(outputs, expected)
    labels, scores = classify(model, x, TrainingOptions(**QUIET), classes=["a", "b", "c"])
    assert labels == [["a", "b", "c"][i] for i in expected.argmax(1).tolist()]
    torch.testing.assert_close(scores, expected.softmax(1))


def test_resume_from_checkpoint_gives_identical_weights(blobs, tmp_path: Path) -> None:
    common = dict(solver="adam", max_epochs=4, mini_batch_size=16, shuffle="every-epoch", seed=3, **QUIET)
    straight, _ = train_network(blobs, linear_model(), TrainingOptions(**common))

    stop_mid_epoch = lambda record: record["iteration"] == 17  # noqa: E731 - a one-line callback
    checkpoints = str(tmp_path / "ckpt")
    options = TrainingOptions(checkpoint_path=checkpoints, checkpoint_frequency=5,
                              checkpoint_frequency_unit="iteration", **common)
    train_network(blobs, linear_model(), options, callbacks=[stop_mid_epoch])
    assert sorted(p.name for p in Path(checkpoints).iterdir()) == [
        "checkpoint-000000010.pt", "checkpoint-000000010.sha256", "checkpoint-000000015.pt",
        "checkpoint-000000015.sha256"]
    resumed, info = train_network(blobs, linear_model(99), options)
    assert [r["iteration"] for r in info.history] == list(range(1, 4 * 12 + 1))
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_best_validation_loss_network_is_returned(blobs) -> None:
    x, y = blobs
    options = TrainingOptions(initial_learn_rate=0.5, max_epochs=6, mini_batch_size=16, validation_frequency=3,
                              output_network="best-validation-loss", **QUIET)
    model, info = train_network(blobs, linear_model(), options, validation_data=(x[:60], y[:60]))
    best = min(r["loss"] for r in info.validation_history)
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(x[:60]), y[:60]).item()
    assert loss == pytest.approx(best, rel=1e-5)


@pytest.mark.parametrize("clip", ["norm", "value"])
def test_gradient_clipping_bounds_the_update(blobs, clip: str) -> None:
    model = linear_model()
    before = [p.detach().clone() for p in model.parameters()]
    options = TrainingOptions(solver="sgdm", momentum=0.0, l2_regularization=0.0, initial_learn_rate=1.0,
                              max_epochs=1, mini_batch_size=len(blobs[0]), gradient_clip=clip,
                              gradient_threshold=1e-3, **QUIET)
    train_network(blobs, model, options)
    deltas = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
    if clip == "norm":
        assert deltas.norm() <= 1e-3 * (1 + 1e-4)
    else:
        assert deltas.abs().max() <= 1e-3 * (1 + 1e-4)


@pytest.mark.parametrize("solver", ["sgdm", "adam", "rmsprop"])
def test_every_solver_trains(blobs, solver: str) -> None:
    _, info = train_network(blobs, linear_model(), TrainingOptions(solver=solver, max_epochs=4, **QUIET))
    assert info.history[-1]["loss"] < info.history[0]["loss"]


def test_bf16_mixed_precision_and_channels_last_train_on_cpu(digits_root: Path) -> None:
    store = ImageDatastore(digits_root)
    part = store.subset(range(0, len(store), 6))
    model = build_model("small_cnn", in_channels=1, num_classes=10)
    options = TrainingOptions(solver="adam", precision="bf16", channels_last=True, max_epochs=2, **QUIET)
    _, info = train_network(part, model, options)
    assert info.history[-1]["loss"] < info.history[0]["loss"]


def test_regression_with_mse_reports_no_accuracy() -> None:
    x = torch.randn(64, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    model = torch.nn.Linear(3, 1)
    _, info = train_network((x, y), model, TrainingOptions(loss="mse", initial_learn_rate=0.1, max_epochs=20,
                                                           mini_batch_size=16, **QUIET))
    assert info.history[-1]["accuracy"] is None and info.history[-1]["loss"] < 0.01


class FailsAtIndex(torch.utils.data.Dataset):
    """Eight observations; reading index 5 raises, as a broken reader would."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == 5:
            raise OSError("the disk went away")
        return torch.ones(4), torch.tensor(0)


def test_background_workers_are_stopped_when_training_fails() -> None:
    import multiprocessing

    options = TrainingOptions(max_epochs=1, mini_batch_size=2, shuffle="never", dispatch_in_background=True,
                              num_workers=2, **QUIET)
    with pytest.raises(OSError, match="the disk went away") as raised:
        train_network(FailsAtIndex(), linear_model(), options)
    assert raised.value.__traceback__ is not None  # the traceback (and its frames) are still held here
    assert multiprocessing.active_children() == []
