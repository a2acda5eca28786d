"""training.speed: what fast chooses and why, the user's own settings over it, and the compile's decision."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from hpcdl import TrainingOptions, build_model, train_network
from hpcdl.data.batches import TensorPair
from hpcdl.store.caches import compile_cache
from hpcdl.train.speed import COMPILE_TIMES, CompileDecision, TIMED_TO, choose_speed, _network_key

CPU = torch.device("cpu")


def _blobs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    y = torch.randint(3, (96,), generator=generator)
    return torch.randn(96, 1, 8, 8, generator=generator) + y[:, None, None, None].float(), y


def test_fast_on_the_cpu_trains_exactly_as_exact_and_says_so() -> None:
    runs = {}
    for speed in ("fast", "exact"):
        torch.manual_seed(0)
        model = build_model("small_cnn", in_channels=1, num_classes=3)
        model, info = train_network(_blobs(), model, TrainingOptions(speed=speed, max_epochs=2, mini_batch_size=16,
                                                                     verbose=False, execution_environment="cpu"))
        runs[speed] = (torch.cat([p.detach().flatten() for p in model.parameters()]), info.speed)
    assert torch.equal(runs["fast"][0], runs["exact"][0])
    assert runs["fast"][1]["precision"] == "float32" and runs["fast"][1]["compile"] is False
    assert runs["fast"][1]["reasons"][0] == "speed=fast: on the CPU as exact"


def test_an_option_the_user_set_wins_over_the_preset_and_is_named() -> None:
    model = build_model("small_cnn", in_channels=1, num_classes=3)
    choice = choose_speed(TrainingOptions(precision="bf16", channels_last=True), CPU, model, TensorPair(*_blobs()))
    assert (choice.precision, choice.channels_last, choice.compile) == ("bf16", True, False)
    assert "precision=bf16 (set)" in choice.reasons and "channels_last=True (set)" in choice.reasons
    assert not (choice.tf32 or choice.cudnn_benchmark or choice.fused_optimizer)


@pytest.mark.parametrize("known_cost_s, compiles", [(0.001, True), (1e9, False)])
def test_the_compile_is_decided_by_the_iterations_left_against_the_cost_an_earlier_run_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, known_cost_s: float,
        compiles: bool) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = build_model("small_cnn", in_channels=1, num_classes=3)
    (tmp_path / COMPILE_TIMES).write_text(json.dumps({_network_key(model): known_cost_s}))
    choice = choose_speed(TrainingOptions(speed="fast"), CPU, model, TensorPair(*_blobs()))
    open_choice = dataclasses.replace(choice, compile=None)  # as on a GPU; the rule itself is device-free
    decision = CompileDecision(open_choice, model, CPU)
    decision.plan(start=0, planned=10**9)
    answers = [decision.due(i) for i in range(1, TIMED_TO + 1)]
    assert answers[:-1] == [None] * (TIMED_TO - 1) and answers[-1] is compiles
    decision.decided(answers[-1], TIMED_TO)
    said = capsys.readouterr().out
    assert ("compile now" if compiles else "compile skipped") in said and "measured by an earlier run" in said
    assert decision.record["compile"] is compiles
    assert decision.due(TIMED_TO + 1) is None  # decided once


def test_the_compile_cache_is_private_and_one_another_user_planted_is_never_used(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    cache = compile_cache(root)
    assert cache is not None and cache.stat().st_mode & 0o777 == 0o700 and cache.name.startswith(".")
    planted = root / cache.name
    os.chmod(planted, 0o777)
    assert compile_cache(root) is None  # others can write there: its code is never loaded
    os.rmdir(planted)
    os.mkdir(planted, 0o700)
    os.chown(planted, 65534, 65534)  # made by another user (nobody)
    assert compile_cache(root) is None
