"""The run's views drawn from its records: the training-progress plot read back as pixels, TensorBoard event files
read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import hpcdl
from hpcdl.view.progress_plot import (EPOCH_COLOR, LOSS_COLOR, PANEL_FACE, RAW_ALPHA, RunFacts, smoothed,
                                      write_progress_plot)
from tests.conftest import keep_screenshot


def _rgb(color: str) -> np.ndarray:
    return np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)], dtype=float)


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).astype(float)


def _runs(mask: np.ndarray, gap: int = 0) -> list[tuple[int, int]]:
    """(start, end) of the runs of True in a 1-D mask, runs closer than ``gap`` merged."""
    runs: list[list[int]] = []
    for i in np.flatnonzero(mask):
        if runs and i - runs[-1][1] <= gap + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return [(a, b) for a, b in runs]


def panels_in(pixels: np.ndarray) -> list[tuple[int, int]]:
    """The panels' row spans, found by their left frame line: the darkest column of the image's left part."""
    dark = np.all(pixels < 60, axis=2)
    column = int(np.argmax(dark[:, : pixels.shape[1] // 6].sum(axis=0)))
    return [(a, b) for a, b in _runs(dark[:, column]) if b - a > 60]


def epoch_lines_in(pixels: np.ndarray, rows: tuple[int, int]) -> int:
    """The vertical epoch lines a panel holds: what most of its rows cross (a curve or text may hide or mimic
    a pixel of one in a few rows)."""
    counts = []
    for row in range(rows[0] + 3, rows[1] - 3, 3):
        line = np.all(np.abs(pixels[row] - _rgb(EPOCH_COLOR)) < 1.5, axis=1)
        counts.append(len([run for run in _runs(line) if run[1] > run[0]]))  # a line is 2 or 3 pixels wide
    return max(set(counts), key=counts.count)


def color_count(pixels: np.ndarray, color: np.ndarray) -> int:
    return int(np.all(np.abs(pixels - color) < 2.5, axis=2).sum())


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-epoch run on 2-class blobs with validation, writing its plot and events."""
    folder = tmp_path_factory.mktemp("run")
    generator = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(96, 4, generator=generator) + 0.4, torch.randn(96, 4, generator=generator) - 0.4])
    y = torch.cat([torch.zeros(96, dtype=torch.long), torch.ones(96, dtype=torch.long)])
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    options = hpcdl.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, max_epochs=3, mini_batch_size=8,
                                    validation_frequency=6, verbose=False, verbose_frequency=5,
                                    plots="training-progress", output_dir=str(folder))
    hpcdl.train_network((x, y), model, options, validation_data=(x[::4], y[::4]))
    return folder


def test_progress_plot_has_a_panel_per_metric_smoothed_over_faint_raw_and_a_line_per_epoch_boundary(
        trained: Path) -> None:
    pixels = _pixels(trained / "training-progress.png")
    panels = panels_in(pixels)
    assert len(panels) == 2  # accuracy, loss
    assert [epoch_lines_in(pixels, rows) for rows in panels] == [2, 2]  # 3 epochs: 2 boundaries in each panel
    loss = _rgb(LOSS_COLOR)
    faint = RAW_ALPHA * loss + (1 - RAW_ALPHA) * _rgb(PANEL_FACE)
    assert color_count(pixels, loss) > 100 and color_count(pixels, faint) > 50  # smoothed drawn, raw behind it
    keep_screenshot(trained / "training-progress.png", "training-progress.png")


def test_smoothing_differs_from_the_raw_curve_and_follows_its_level() -> None:
    raw = [1.0, 0.2, 0.9, 0.1, 0.8, 0.15, 0.85, 0.1]
    smooth = smoothed(raw, 0.6)
    assert smooth[0] == raw[0]  # debiased: no pull toward 0 at the start
    assert max(smooth[2:]) - min(smooth[2:]) < 0.5 * (max(raw[2:]) - min(raw[2:]))
    assert abs(sum(smooth) / len(smooth) - sum(raw) / len(raw)) < 0.15


def test_panels_are_exactly_the_metrics_reported(tmp_path: Path) -> None:
    loss_only = [{"kind": "iteration", "iteration": i, "epoch": None, "loss": 1 / i, "accuracy": None}
                 for i in range(1, 40)]
    assert write_progress_plot(tmp_path / "a.png", loss_only, [], RunFacts()) == ["Loss"]
    assert len(panels_in(_pixels(tmp_path / "a.png"))) == 1
    named = [{**r, "reward": float(r["iteration"] % 7), "grad_norm": 2.0} for r in loss_only]
    labels = write_progress_plot(tmp_path / "b.png", named, [], RunFacts(), ["reward", "grad_norm"])
    assert labels == ["Loss", "reward", "grad_norm"]
    assert len(panels_in(_pixels(tmp_path / "b.png"))) == 3


def test_event_files_hold_every_recorded_metric(trained: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trained / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/accuracy", "train/learn_rate", "train/samples_per_s", "train/data_wait_s",
            "validation/loss", "validation/accuracy"} <= tags
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == list(range(1, 3 * 24 + 1))  # 192 samples / 8 per batch, 3 epochs
    assert len(events.Scalars("validation/accuracy")) == 3 * 24 // 6


def test_hyperparameters_of_a_sweep_point_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from hpcdl.view.tensorboard import run_hparams, write_hparams

    manifest = {"kind": "train", "overrides": ["training.max_epochs=2"],
                "plan": {"config": {"model": {"name": "mlp"}, "training": {"solver": "adam", "max_epochs": 2}}},
                "sweep": {"id": "s", "num": 1, "overrides": ["training.initial_learn_rate=0.03", "+model.wide=true"]}}
    write_hparams(tmp_path, run_hparams(manifest), 1.0)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert dict(start.hparams)["training.initial_learn_rate"].number_value == 0.03
    assert dict(start.hparams)["model.wide"].bool_value is True
    assert dict(start.hparams)["model.name"].string_value == "mlp"


def test_a_two_rank_job_writes_each_ranks_own_values_and_its_hparams(store: Path, digits_root: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "training.execution_environment=parallel",
                           "cluster.tasks_per_node=2", f"data.root={digits_root}", "training.max_epochs=1",
                           "training.initial_learn_rate=0.002", "wait=true"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    folder, = [p for p in store.iterdir() if not p.name.startswith(".")]
    ranks = []
    for events_dir in (folder / "tensorboard", folder / "tensorboard" / "rank1"):
        events = EventAccumulator(str(events_dir))
        events.Reload()
        assert {"train/loss", "train/accuracy", "train/data_wait_s"} <= set(events.Tags()["scalars"])
        ranks.append({e.step: e.value for e in events.Scalars("train/loss")})
    assert ranks[0].keys() == ranks[1].keys() and ranks[0] != ranks[1]  # each rank's own half of every batch
    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    assert "validation/accuracy" in events.Tags()["scalars"]
    start = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info
    assert dict(start.hparams)["training.initial_learn_rate"].number_value == 0.002
    assert dict(start.hparams)["model.name"].string_value == "small_cnn"


def test_jobs_watch_plot_keeps_a_png_and_shows_the_curves_as_text(store: Path, digits_root: Path,
                                                                  tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", f"data.root={digits_root}", "training.max_epochs=2",
                           "training.plots=none"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    watched = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "watch", "last", "--plot", str(tmp_path / "w.png")],
                             capture_output=True, text=True, timeout=300)
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.splitlines()
    loss = [line for line in lines if line.startswith("training loss")][-1]
    bars = loss.split()[2]
    assert 10 <= len(bars) <= 60 and set(bars) <= set("▁▂▃▄▅▆▇█") and bars[0] in "▆▇█" and bars[-1] in "▁▂▃"
    assert any(line.startswith("val. accuracy") for line in lines)
    assert f"plot      {tmp_path / 'w.png'}" in lines
    pixels = _pixels(tmp_path / "w.png")  # drawn from the records, though the job itself drew no plot
    assert len(panels_in(pixels)) == 2 and [epoch_lines_in(pixels, rows) for rows in panels_in(pixels)] == [1, 1]
    default = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "watch", "last", "--plot"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)  # an ended job: its final plot at once
    assert default.returncode == 0 and (tmp_path / f"{lines[0].split()[0]}-progress.png").is_file()


def test_a_run_without_tensorboard_trains_and_says_how_to_get_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys; sys.modules['tensorboard'] = None\n"  # as if it were not installed
            "import torch, hpcdl\n"
            "x, y = torch.randn(64, 3), torch.randint(0, 2, (64,))\n"
            "options = hpcdl.TrainingOptions(max_epochs=2, mini_batch_size=16, verbose=False, "
            f"plots='training-progress', output_dir={str(tmp_path)!r})\n"
            "model, info = hpcdl.train_network((x, y), torch.nn.Linear(3, 2), options)\n"
            "print(info.stop_reason)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "max-epochs", done.stderr
    assert done.stderr.count("the tensorboard package is not installed (pip install tensorboard") == 1
    assert (tmp_path / "training-progress.png").is_file() and not (tmp_path / "tensorboard").exists()


def _steps_in(events_dir: Path, tag: str = "train/loss") -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(events_dir))
    events.Reload()
    return [e.step for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def _view_threads() -> set[object]:
    """The threads that draw a run's views or write its event files."""
    import threading

    return {t for t in threading.enumerate() if t.name == "hpcdl-views" or type(t).__name__ == "_AsyncWriterThread"}


def test_a_run_that_fails_closes_its_views_with_every_step_so_far_readable(tmp_path: Path) -> None:
    """A callback raises at iteration 7, well within the views' 10 s between updates (the first drew step 1)."""
    def fail_at_7(record: dict) -> None:
        if record["iteration"] == 7:
            raise RuntimeError("the run fails on purpose")

    before = _view_threads()
    x, y = torch.randn(96, 4, generator=torch.Generator().manual_seed(0)), torch.arange(96) % 2
    options = hpcdl.TrainingOptions(max_epochs=3, mini_batch_size=8, verbose=False, plots="training-progress",
                                    output_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="the run fails on purpose"):
        hpcdl.train_network((x, y), torch.nn.Linear(4, 2), options, callbacks=[fail_at_7])
    assert _view_threads() == before  # the views' thread and the event file's writer ended
    assert _steps_in(tmp_path / "tensorboard") == list(range(1, 8))
    from hpcdl.store.metrics import read_summary

    assert read_summary(tmp_path).iterations == 7, read_summary(tmp_path)  # the summary saved on closing
    assert (tmp_path / "training-progress.png").is_file()


REPORTS_THEN_FAILS = '''
import hpcdl


def report_then_fail(config=None):
    for step in range(1, 7):
        hpcdl.report(step, 1.0 / step, total=100)
    raise ValueError("fails after 6 steps on purpose")


if __name__ == "__main__":
    report_then_fail()
'''


def test_a_failing_jobs_reports_so_far_are_in_its_events_and_plot(store: Path, tmp_path: Path) -> None:
    """Your own code (entry= in the rank's process, script= in its own) reports 6 steps and raises: the job's
    final events and plot hold all 6, though the views drew only the first before the error."""
    from tests.faults import cli, submit

    (tmp_path / "reporter.py").write_text(REPORTS_THEN_FAILS)
    jobs = [submit(tmp_path, "entry=reporter:report_then_fail"), submit(tmp_path, "script=reporter.py")]
    for job_id in jobs:
        waited = cli(tmp_path, "hpcdl.jobs", "wait", job_id, "--timeout", "200")
        assert waited.stdout.strip() == "FAILED", (waited.stdout, cli(tmp_path, "hpcdl.jobs", "why", job_id).stdout)
        assert _steps_in(store / job_id / "tensorboard") == list(range(1, 7)), job_id
        assert (store / job_id / "training-progress.png").is_file()


def test_the_tensorboard_command_of_a_sweep_keeps_its_run_names_free_of_the_specs_separators() -> None:
    from hpcdl.view.tensorboard import logdir_command

    command = logdir_command({"0_cluster.time=0:10:00": Path("/s/a/tensorboard"),
                              "1_model.layers=[1,2]": Path("/s/b/tensorboard")}, "login1", "me").splitlines()[0]
    assert command == ("tensorboard --logdir_spec '0_cluster.time=0_10_00:/s/a/tensorboard,"
                       "1_model.layers=[1_2]:/s/b/tensorboard' --port 6006")
