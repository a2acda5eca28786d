"""python -m hpcdl.run: a built-in training run from Hydra overrides, results read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from hpcdl.train.job import load_result


def test_run_trains_and_writes_results_that_load_without_pickle(tmp_path: Path, digits_root: Path) -> None:
    folder = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl.run", f"data.root={digits_root}", "training.max_epochs=2",
         f"training.output_dir={folder}", "training.verbose=false"],
        capture_output=True, text=True, check=True)
    assert f"Results in {folder}" in done.stdout
    for name in ("model.pt", "info.json", "result.json", "metrics.jsonl", "training-progress.png"):
        assert (folder / name).is_file(), name
    assert list((folder / "checkpoints").glob("checkpoint-*.pt"))
    model, info, summary = load_result(folder)
    assert summary["stop_reason"] == "max-epochs" and summary["validation_accuracy"] > 0.5
    assert info.history[-1]["iteration"] == summary["iterations"]
    assert isinstance(torch.load(folder / "model.pt", weights_only=True), dict)
    assert json.loads((folder / "result.json").read_text())["classes"] == [str(d) for d in range(10)]


def test_run_rejects_a_bad_override_before_training(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "hpcdl.run", "training.max_epochs=-1",
                           f"training.output_dir={tmp_path / 'never'}"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "training.max_epochs: must be a positive integer" in done.stderr
    assert not (tmp_path / "never").exists()
