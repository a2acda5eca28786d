"""Sweeps on the real Slurm cluster: Hydra's launcher suites, one array per sweep, a failing point, a split."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite

from tests.test_slurm import _cli, slurm_cluster  # noqa: F401 - the fixture
from tests.test_sweeps import optuna_app, optuna_study

pytestmark = pytest.mark.slurm
ON_SLURM = ["hydra.launcher.cluster=slurm", "hydra.launcher.wait=true", "hydra.launcher.poll_s=0.5"]
APP = '''
import time

import hydra

import hpcdl


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg):
    for step in range(1, 4):
        hpcdl.report(step=step, loss=1.0 / (cfg.x + step), total=3)
    time.sleep(cfg.nap)
    if cfg.x == 5:
        raise ValueError(f"point x={cfg.x} fails on purpose")
    return cfg.x * cfg.x


if __name__ == "__main__":
    main()
'''


@pytest.fixture(autouse=True)
def _own_store(store: Path) -> Path:
    return store


@pytest.mark.parametrize("launcher_name, overrides", [("hpcdl", [*ON_SLURM, "hydra.job.chdir=True"])])
class TestHpcdlLauncherOnSlurm(LauncherTestSuite):
    """Hydra's launcher suite, every point a task of a job array on the two-node cluster."""


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", "hydra/launcher=hpcdl", *ON_SLURM])])
class TestHpcdlLauncherIntegrationOnSlurm(IntegrationTestSuite):
    """Hydra's integration suite, apps in their own process, points on Slurm."""


def _app(folder: Path) -> Path:
    (folder / "config.yaml").write_text("x: 0\nnap: 0\n")
    (folder / "sweep_app.py").write_text(APP)
    return folder / "sweep_app.py"


def _sweep(app: Path, *overrides: str) -> tuple[str, subprocess.CompletedProcess]:
    done = subprocess.run([sys.executable, str(app), "-m", "hydra/launcher=hpcdl", "hydra.launcher.cluster=slurm",
                           *overrides], cwd=app.parent, capture_output=True, text=True, timeout=300)
    found = re.search(r"Submitted sweep (\S+):", done.stdout)
    assert found, done.stdout + done.stderr
    return found.group(1), done


def _manifest(store: Path, job: str) -> dict:
    return json.loads((store / job / "manifest.json").read_text())


def test_a_six_point_sweep_is_one_array_returns_at_once_and_reports_a_failing_point(store: Path,
                                                                                  tmp_path: Path) -> None:
    sweep, submitted = _sweep(_app(tmp_path), "x=0,1,2,3,4,5", "nap=6")
    assert submitted.returncode == 0, submitted.stderr
    listing = _cli("hpcdl.jobs", "list").stdout
    assert re.search(rf"^{sweep}\s.*\b(PENDING|RUNNING)\b", listing, re.M), listing  # returned before the end
    arrays = _manifest(store, sweep)["backend_id"].split(",")
    assert len(arrays) == 1, arrays

    waited = _cli("hpcdl.jobs", "wait", sweep, check=False).stdout  # k of N as points end, then their table
    assert waited.splitlines()[-1] == "FAILED" and "6 of 6 points done (5 COMPLETED, 1 FAILED)" in waited, waited
    assert re.search(r"^4\s+x=4\s+COMPLETED\s", waited, re.M), waited
    tasks = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID", "-j", arrays[0]], capture_output=True,
                           text=True, check=True).stdout.split()
    assert sorted(tasks) == [f"{arrays[0]}_{i}" for i in range(6)], tasks

    shown = _cli("hpcdl.jobs", "show", sweep).stdout
    assert "5 COMPLETED, 1 FAILED" in shown, shown
    for x in range(5):
        assert re.search(rf"^{x}\s+x={x}\s+COMPLETED\s.*\s{x * x}$", shown, re.M), shown  # nap=6: all alike
    assert f"point 5 ({sweep}_5) FAILED: rank 0: ValueError: point x=5 fails on purpose" in shown, shown
    assert "fails on purpose" in _cli("hpcdl.jobs", "show", f"{sweep}_5").stdout

    fetched = _cli("hpcdl.jobs", "fetch", sweep, "--to", str(tmp_path / "out")).stdout
    assert "sweep-curves.png" in fetched, fetched
    rows = list(csv.DictReader((tmp_path / "out" / "sweep-summary.csv").open()))
    assert [(r["state"], r["value"]) for r in rows] == [("COMPLETED", str(x * x)) for x in range(5)] + [("FAILED", "")]
    assert all(r["iteration"] == "3" for r in rows), rows
    point = store / f"{sweep}_0"
    assert (point / ".hydra" / "overrides.yaml").read_text().split() == ["-", "x=0", "-", "nap=6"]
    assert (store / sweep / "multirun.yaml").is_file()


def test_waiting_hands_hydra_a_failed_point_and_the_command_fails(store: Path, tmp_path: Path) -> None:
    sweep, done = _sweep(_app(tmp_path), "x=4,5", "hydra.launcher.wait=true", "hydra.launcher.poll_s=0.5")
    assert done.returncode != 0
    assert "point x=5 fails on purpose" in done.stderr, done.stderr
    assert "1 COMPLETED, 1 FAILED" in _cli("hpcdl.jobs", "show", sweep).stdout


def test_a_sweep_above_max_array_size_is_split_and_cancelled_as_one(store: Path, tmp_path: Path) -> None:
    limit = int(re.search(r"MaxArraySize\s*=\s*(\d+)", subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout).group(1))
    sweep, done = _sweep(_app(tmp_path), f"x=range(0,{limit + 1})", "hydra.launcher.parallelism=2")
    assert done.returncode == 0, done.stderr
    arrays = _manifest(store, sweep)["backend_id"].split(",")
    try:
        assert len(arrays) == 2, arrays
        headers = [re.search(r"^#SBATCH --array=(\S+)$", (store / sweep / "slurm" / f"array-{i}.sh").read_text(),
                             re.M).group(1) for i in range(2)]
        assert headers == [f"0-{limit - 1}%2", "0-0%1"], headers
        for array in arrays:  # the controller has each
            assert subprocess.run(["scontrol", "show", "job", array], capture_output=True).returncode == 0
    finally:
        cancelled = _cli("hpcdl.jobs", "cancel", sweep).stdout
    assert "state now CANCELLED" in cancelled, cancelled
    assert not subprocess.run(["squeue", "-h", "-j", ",".join(arrays)], capture_output=True, text=True).stdout.strip()


def test_packed_points_share_an_array_task_and_run_there_at_once(store: Path) -> None:
    done = _cli("hpcdl.submit", "-m", "cluster=slurm", "cluster.cpus_per_task=2", "training.max_epochs=1",
                "training.seed=range(4)", "hydra.launcher.points_per_task=2", "hydra.launcher.wait=true",
                "hydra.launcher.poll_s=0.5")
    sweep = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    points = [_manifest(store, f"{sweep}_{i}") for i in range(4)]
    array = _manifest(store, sweep)["backend_id"]
    assert [p["backend_id"] for p in points] == [f"{array}_0", f"{array}_0", f"{array}_1", f"{array}_1"]
    spans = [(s["started_at"], s["ended_at"]) for s in
             (json.loads((store / f"{sweep}_{i}" / "final.json").read_text()) | json.loads(
                 (store / f"{sweep}_{i}" / "status.json").read_text()) for i in range(4))]
    for first, second in ((0, 1), (2, 3)):  # the two points of a task overlapped: they ran at once
        assert spans[first][0] < spans[second][1] and spans[second][0] < spans[first][1], spans
    assert "4/4 done: 4 COMPLETED" in _cli("hpcdl.jobs", "list").stdout


def test_an_optuna_study_on_slurm_gets_its_trials_values_without_a_wait_setting(store: Path, tmp_path: Path) -> None:
    done, results = optuna_study(optuna_app(tmp_path), "hydra.launcher.cluster=slurm")
    assert done.returncode == 0, done.stderr
    sweep = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    assert "4/4 done: 4 COMPLETED" in _cli("hpcdl.jobs", "list").stdout
    shown = _cli("hpcdl.jobs", "show", sweep).stdout
    tried = [int(x) for x in re.findall(r"^\d+\s+x=(\d+)\s+COMPLETED", shown, re.M)]
    assert len(tried) == 4, shown
    assert results["best_value"] == min((x - 3) ** 2 for x in tried), (tried, results)
    assert "Failed experiment" not in done.stderr + done.stdout
