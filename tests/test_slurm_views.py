"""The views of a sweep run on the real Slurm cluster: one trial cancelled with jobs cancel --point (its array task
ended, the others go on), the experiment page showing it, each point's TensorBoard events and hyperparameters."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_slurm import _cli, slurm_cluster  # noqa: F401 - the fixture
from tests.test_slurm_sweeps import _app, _sweep

pytestmark = pytest.mark.slurm


def test_a_trial_cancelled_on_slurm_is_shown_on_the_page_and_the_others_write_their_events(
        store: Path, tmp_path: Path, slurm_cluster: None) -> None:  # noqa: F811 - the fixture
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    sweep, submitted = _sweep(_app(tmp_path), "x=0,1,2", "nap=8")
    assert submitted.returncode == 0, submitted.stderr
    cancelled = _cli("hpcdl.jobs", "cancel", sweep, "--point", "2").stdout
    assert f"cancelled point 2 ({sweep}_2) of sweep {sweep}; state now CANCELLED" in cancelled, cancelled
    waited = _cli("hpcdl.jobs", "wait", sweep, check=False).stdout
    assert "3 of 3 points done (2 COMPLETED, 1 CANCELLED)" in waited, waited
    array = (store / sweep / "manifest.json").read_text()
    array_id = re.search(r'"backend_id": "(\d+)', array).group(1)

    def accounted() -> dict[str, str]:
        return dict(line.split("|")[:2] for line in subprocess.run(
            ["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", array_id], capture_output=True, text=True,
            check=True).stdout.splitlines())  # a state may have words: "CANCELLED by 0"

    deadline = time.monotonic() + 60  # a point records its end before Slurm's accounting has its task's
    while (tasks := accounted()).get(f"{array_id}_0") == "RUNNING" or tasks.get(f"{array_id}_1") == "RUNNING":
        assert time.monotonic() < deadline, tasks
        time.sleep(1)
    assert tasks[f"{array_id}_0"] == tasks[f"{array_id}_1"] == "COMPLETED", tasks
    assert tasks.get(f"{array_id}_2", "CANCELLED").startswith("CANCELLED"), tasks  # ended alone (or never ran)

    page = tmp_path / "sweep.html"
    _cli("hpcdl.jobs", "report", sweep, "--to", str(page))
    text = page.read_text()
    for num, state in ((0, "COMPLETED"), (1, "COMPLETED"), (2, "CANCELLED")):
        row = re.search(rf'<tr id="row-{num}" data-state="(\w+)"', text)
        assert row and row.group(1) == state, num
        assert f'href="#trial-{num}"' in text and f'id="trial-{num}"' in text
    for num in (0, 1):
        events = EventAccumulator(str(store / f"{sweep}_{num}" / "tensorboard"))
        events.Reload()
        assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3]
        start = plugin_data_pb2.HParamsPluginData.FromString(
            events.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info
        assert dict(start.hparams)["x"].number_value == num
