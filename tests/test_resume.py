"""Exact resume on the CPU: a run killed after a checkpoint and resumed ends with the same weights, bit for
bit, as one that ran straight through, with dropout, augmentation and background workers on; a damaged
newest checkpoint is passed over, with a warning, for the one before it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.resumable_run import run


def _kill_after(root: Path, checkpoints: Path, iteration: int) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.resumable_run", str(root), str(checkpoints), str(iteration)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, done.stderr  # SIGKILL: no clean-up ran


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


@pytest.fixture(scope="module")
def straight(digits_root: Path) -> tuple[torch.nn.Module, object]:
    return run(str(digits_root), None)


def test_a_killed_run_resumes_to_the_same_weights_with_no_gap_in_its_records(digits_root: Path, tmp_path: Path,
                                                                             straight) -> None:
    checkpoints = tmp_path / "checkpoints"
    _kill_after(digits_root, checkpoints, 14)  # checkpoints after 4, 8, 12; killed two iterations later
    assert sorted(p.name for p in checkpoints.glob("*.pt")) == [f"checkpoint-{i:09d}.pt" for i in (4, 8, 12)]
    resumed, info = run(str(digits_root), str(checkpoints))
    _same_weights(straight[0], resumed)
    iterations = [record["iteration"] for record in info.history]
    assert iterations == list(range(1, len(straight[1].history) + 1))
    assert [r["loss"] for r in info.history] == [r["loss"] for r in straight[1].history]


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(digits_root: Path, tmp_path: Path, straight,
                                                                  capfd: pytest.CaptureFixture) -> None:
    checkpoints = tmp_path / "checkpoints"
    _kill_after(digits_root, checkpoints, 9)  # checkpoints after 4 and 8
    newest = checkpoints / "checkpoint-000000008.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: the file still has its size and its name
    newest.write_bytes(bytes(data))
    resumed, info = run(str(digits_root), str(checkpoints))
    assert f"checkpoint {newest} is damaged (its SHA-256 is" in capfd.readouterr().err
    _same_weights(straight[0], resumed)
    assert [r["iteration"] for r in info.history] == list(range(1, len(straight[1].history) + 1))


def test_a_checkpoint_whose_save_did_not_finish_is_not_used(digits_root: Path, tmp_path: Path, straight,
                                                             capfd: pytest.CaptureFixture) -> None:
    checkpoints = tmp_path / "checkpoints"
    _kill_after(digits_root, checkpoints, 9)
    (checkpoints / "checkpoint-000000008.sha256").unlink()  # as if killed between the file and its checksum
    resumed, _ = run(str(digits_root), str(checkpoints))
    assert "checkpoint-000000008.pt is damaged (it has no checksum" in capfd.readouterr().err
    _same_weights(straight[0], resumed)


def test_a_checkpoint_slower_than_half_the_signals_lead_is_warned_of_once(digits_root: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capfd: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("HPCDL_SIGNAL_DELAY_S", "0.000001")  # any save is slower than half of this
    _, info = run(str(digits_root), str(tmp_path / "checkpoints"))
    assert info.checkpoint_s > 0
    assert capfd.readouterr().err.count("[hpcdl] warning: a checkpoint took") == 1
