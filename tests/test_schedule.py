"""Learning-rate schedules give the rates MATLAB's options describe."""

from __future__ import annotations

import math

import pytest

from hpcdl import TrainingOptions
from hpcdl.train.schedule import learn_rate_at


def test_constant_rate_uses_the_solver_default() -> None:
    assert learn_rate_at(TrainingOptions(solver="sgdm"), 123, 10) == 0.01
    assert learn_rate_at(TrainingOptions(solver="adam"), 0, 10) == 0.001


def test_piecewise_drops_by_the_factor_every_period() -> None:
    options = TrainingOptions(initial_learn_rate=0.1, learn_rate_schedule="piecewise",
                              learn_rate_drop_factor=0.5, learn_rate_drop_period=2)
    per_epoch = 10
    rates = [learn_rate_at(options, epoch * per_epoch, per_epoch) for epoch in range(6)]
    assert rates == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    assert learn_rate_at(options, 19, per_epoch) == pytest.approx(0.1)


def test_cosine_goes_from_the_initial_rate_to_zero() -> None:
    options = TrainingOptions(initial_learn_rate=0.2, learn_rate_schedule="cosine", max_epochs=4)
    total = 4 * 25
    assert learn_rate_at(options, 0, 25) == pytest.approx(0.2)
    assert learn_rate_at(options, total // 2, 25) == pytest.approx(0.1)
    assert learn_rate_at(options, total, 25) == pytest.approx(0.0, abs=1e-12)
    assert learn_rate_at(options, 30, 25) == pytest.approx(0.1 * (1 + math.cos(math.pi * 30 / total)))


def test_warmup_ramps_linearly_then_follows_the_schedule() -> None:
    options = TrainingOptions(initial_learn_rate=0.4, warmup_iterations=4, learn_rate_schedule="piecewise",
                              learn_rate_drop_period=1, learn_rate_drop_factor=0.5)
    assert [learn_rate_at(options, i, 100) for i in range(5)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4])
    assert learn_rate_at(options, 100, 100) == pytest.approx(0.2)
