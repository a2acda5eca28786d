"""Sweeps on the local profile: Hydra's own launcher test suites with hydra/launcher=hpcdl, hpcdl.submit -m,
the sweep's record, summary and cancel, and bad input refused before anything is written."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite

from hpcdl.cluster.slurm import array_tasks
from hpcdl.host import is_running
from hpcdl.store.folders import JobRecord, load_record
from hpcdl.lifecycle.job import Job
from tests.conftest import job_folders

WAIT = ["hydra.launcher.wait=true", "hydra.launcher.poll_s=0.2"]


@pytest.fixture(autouse=True)
def _own_store(store: Path) -> Path:
    return store


@pytest.mark.parametrize("launcher_name, overrides", [("hpcdl", [*WAIT, "hydra.job.chdir=True"])])
class TestHpcdlLauncher(LauncherTestSuite):
    """Hydra's launcher suite: every point runs as a local hpcdl job, its JobReturn read back from the store."""


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", "hydra/launcher=hpcdl", *WAIT])])
class TestHpcdlLauncherIntegration(IntegrationTestSuite):
    """Hydra's integration suite: apps in their own process, run through the launcher."""


def _submit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcdl.submit", "-m", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.mark.parametrize("overrides, message", [
    (["training.max_epochs=1,2", "hydra.launcher.parallelism=0"], "parallelism: at least 1 point at once, got 0"),
    (["training.max_epochs=1,2", "hydra.launcher.points_per_task=-1"], "points_per_task: at least 1, got -1"),
    (["training.max_epoch=1,2"], "unknown option 'max_epoch' (did you mean 'max_epochs'?)"),
    (["+training.max_epoch=1,2"], "unknown option 'max_epoch' (did you mean 'max_epochs'?)"),
    (["training.max_epochs=1,0"], "training.max_epochs"),
    (["cluster=local,slurm"], "a sweep runs on one cluster backend and store"),
])
def test_bad_sweeps_are_refused_before_anything_is_written(store: Path, overrides: list[str],
                                                           message: str) -> None:
    done = _submit(*overrides)
    assert done.returncode == 2
    assert message in done.stderr + done.stdout, done.stderr
    assert job_folders(store) == []


def test_local_points_run_at_once_in_the_background_and_the_sweep_is_one_record(store: Path) -> None:
    started = time.monotonic()
    done = _submit("training.max_epochs=1", "training.initial_learn_rate=0.1,0.05")
    submit_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    sweep = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    assert Job.attach(sweep).wait(timeout=240) == "COMPLETED"
    points = [load_record(store / f"{sweep}_{i}") for i in range(2)]
    spans = [(p.status["started_at"], p.status["ended_at"]) for p in points]
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans  # they overlapped: run at once
    assert submit_s < min(end - start for start, end in spans) + 5  # and it returned without waiting for them
    listing = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "list"], capture_output=True, text=True).stdout
    assert re.search(rf"^{sweep}\s+train\s+local\s+COMPLETED\s+2/2 done: 2 COMPLETED", listing, re.M), listing
    assert f"{sweep}_0" not in listing
    for point in points:
        hydra = point.folder / ".hydra"
        assert yaml.safe_load((hydra / "overrides.yaml").read_text())[-1].startswith("training.initial_learn_rate=")
        assert yaml.safe_load((hydra / "hydra.yaml").read_text())["hydra"]["job"]["id"] == point.id
        assert point.manifest["output_dir"] == str(point.folder)


def test_a_waited_for_sweep_counts_its_points_done_and_ends_with_their_table(store: Path) -> None:
    done = _submit("training.max_epochs=1", "training.initial_learn_rate=0.1,0.05", "wait=true",
                   "hydra.launcher.poll_s=0.2")
    assert done.returncode == 0, done.stderr
    assert "sweep points: 2 of 2 done (2 COMPLETED)" in done.stdout + done.stderr
    table = done.stdout.splitlines()[-3:]
    assert table[0].split()[:3] == ["NUM", "OVERRIDES", "STATE"], done.stdout
    assert [row.split()[:3] for row in table[1:]] == [["0", "training.initial_learn_rate=0.1", "COMPLETED"],
                                                      ["1", "training.initial_learn_rate=0.05", "COMPLETED"]]


def test_cancelling_a_local_sweep_ends_its_running_and_waiting_points(store: Path) -> None:
    done = _submit("training.max_epochs=50", "training.initial_learn_rate=0.1,0.05,0.02,0.01",
                   "hydra.launcher.parallelism=1")
    sweep = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    job = Job.attach(sweep)
    deadline = time.monotonic() + 60
    while job.state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    job.cancel()
    assert job.wait(timeout=60) == "CANCELLED"
    assert {load_record(store / f"{sweep}_{i}").state for i in range(4)} == {"CANCELLED"}
    runner = job.manifest["backend_id"]
    deadline = time.monotonic() + 30
    while is_running(runner) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not is_running(runner)


KILLING_APP = '''
import os
import signal

import hydra


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg):
    if cfg.x == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would: no traceback, no result
    return cfg.x
'''


def test_a_point_killed_without_a_result_is_failed_and_a_lost_point_is_counted(store: Path, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("x: 0\n")
    (tmp_path / "app.py").write_text(KILLING_APP + "\n\nif __name__ == '__main__':\n    main()\n")
    done = subprocess.run([sys.executable, "app.py", "-m", "hydra/launcher=hpcdl", "x=0,1,2"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    sweep = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    assert Job.attach(sweep).wait(timeout=240) == "FAILED"
    watched = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "watch", sweep], capture_output=True, text=True)
    assert watched.returncode == 1 and "3 of 3 points done (2 COMPLETED, 1 FAILED)" in watched.stdout, watched.stdout
    assert re.search(r"^1\s+x=1\s+FAILED", watched.stdout, re.M), watched.stdout  # then the points' table
    killed = load_record(store / f"{sweep}_1")
    assert (killed.state, killed.reason) == ("FAILED", "its process killed by signal 9 without recording a result")
    assert {load_record(store / f"{sweep}_{i}").state for i in (0, 2)} == {"COMPLETED"}

    shutil.rmtree(store / f"{sweep}_2")  # a point's folder gone: counted, never silently dropped
    shown = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "show", sweep], capture_output=True, text=True).stdout
    assert "1 COMPLETED" in shown and "1 FAILED" in shown and "1 LOST" in shown, shown

    target = tmp_path / "fetched"
    target.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    (target / "sweep-summary.csv").symlink_to(victim)  # planted in a shared folder: never written through
    fetched = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "fetch", sweep, "--to", str(target)],
                             capture_output=True, text=True)
    assert fetched.returncode == 1 and "cannot write the sweep's summary" in fetched.stderr, fetched.stderr
    assert victim.read_text() == "untouched"


def test_array_task_ranges_name_every_task() -> None:
    assert array_tasks("12_[3-5,8%2]") == ["12_3", "12_4", "12_5", "12_8"]
    assert array_tasks("12_4") == ["12_4"] and array_tasks("12") == ["12"]


def test_packing_more_points_than_slots_says_they_run_in_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    from hpcdl.config.compose import compose_config
    from hpcdl.sweep.submit import _note_rounds

    profile = compose_config(["cluster=slurm", "cluster.cpus_per_task=2"]).cluster
    _note_rounds(profile, 2)
    assert capsys.readouterr().err == ""
    _note_rounds(profile, 5)
    assert "each task runs its points in 3 rounds within one time limit (cluster.time=01:00:00)" in \
        capsys.readouterr().err



def test_a_restarted_array_task_runs_again_the_points_its_earlier_run_left_without_a_result_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After Slurm queues a packed array task again (restart 1), a point whose process ended without a result in
    run 0 goes on (its worker withdraws that failure); one that completed, was cancelled, failed with an error
    or failed in another Slurm job does not."""
    from hpcdl.cluster import backend_for
    from hpcdl.store.status import write_final
    from hpcdl.sweep.runner import _to_run

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    finals = {"left-without-a-result": ("FAILED", {"slurm_job": "4242", "restarts": 0}),
              "failed-with-an-error": ("FAILED", {"slurm_job": "4242", "restarts": 0, "traceback": "Traceback ..."}),
              "completed": ("COMPLETED", {}), "cancelled": ("CANCELLED", {}),
              "failed-in-another-job": ("FAILED", {"slurm_job": "4241", "restarts": 0}),
              "failed-in-this-run": ("FAILED", {"slurm_job": "4242", "restarts": 1})}
    for name, (state, fields) in finals.items():
        (tmp_path / name).mkdir()
        write_final(tmp_path / name, state, reason="r", **fields)
    (tmp_path / "waiting").mkdir()
    assert {name for name in [*finals, "waiting"] if _to_run(tmp_path / name, backend_for("slurm"))} == {"left-without-a-result", "waiting"}


@pytest.mark.parametrize("requeued", [False, True])
def test_a_point_process_that_dies_is_failed_unless_slurm_has_queued_the_task_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requeued: bool) -> None:
    from hpcdl.cluster.slurm import SlurmBackend
    from hpcdl.sweep.runner import Runner

    monkeypatch.setattr(SlurmBackend, "requeued_since_start", lambda self: requeued)
    point = tmp_path / "point"
    point.mkdir()
    runner = Runner([], slots=1, threads=1, gpus=[], packed=True, backend=SlurmBackend())
    process = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    process.wait()
    runner.running[process] = (point, [])
    runner._reap()
    assert not runner.running
    if requeued:  # its next run goes on: nothing recorded
        assert not (point / "final.json").exists()
    else:
        final = json.loads((point / "final.json").read_text())
        assert (final["state"], final["reason"]) == ("FAILED", "its process killed by signal 9 without recording a result")


def test_a_point_that_dies_over_a_damaged_final_state_leaves_it_and_the_runner_goes_on(tmp_path: Path) -> None:
    from hpcdl.cluster import backend_for
    from hpcdl.sweep.runner import Runner

    point = tmp_path / "point"
    point.mkdir()
    (point / "final.json").write_text("{damaged")
    runner = Runner([], slots=1, threads=1, gpus=[], packed=False, backend=backend_for("local"))
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    runner.running[process] = (point, [])
    runner._reap()  # raised JSONDecodeError, which ended every point of the runner
    assert not runner.running and (point / "final.json").read_text() == "{damaged"


def _point(folder: Path, num: int, overrides: list[str], losses: list[float]) -> JobRecord:
    """A finished point of sweep 's' in ``folder``, with one metrics record per loss and a validation at the end."""
    folder.mkdir()
    records = [{"kind": "iteration", "epoch": 1, "iteration": i + 1, "loss": loss, "accuracy": 0.5}
               for i, loss in enumerate(losses)]
    records.append({"kind": "validation", "epoch": 1, "iteration": len(losses), "loss": losses[-1], "accuracy": 0.9})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = {"id": folder.name, "plan": {"config": {}}, "sweep": {"id": "s", "num": num, "overrides": overrides}}
    return JobRecord(folder, manifest, {}, "COMPLETED")


def test_sweep_labels_name_only_the_overrides_that_vary_between_points() -> None:
    from hpcdl.lifecycle.sweep_report import varying_overrides

    assert varying_overrides([["name=a", "lr=0.1", "epochs=2"], ["name=a", "lr=0.01", "epochs=2"]]) == \
        ["lr=0.1", "lr=0.01"]
    assert varying_overrides([["lr=0.1", "bs=8"], ["lr=0.1", "bs=16"], ["lr=0.2", "bs=8"]]) == \
        ["lr=0.1 bs=8", "lr=0.1 bs=16", "lr=0.2 bs=8"]  # a grid: every key that takes several values
    assert varying_overrides([["lr=0.1"], ["lr=0.1", "+seed=1"]]) == ["", "+seed=1"]  # one point lacks it
    assert varying_overrides([["name=a", "lr=0.1"]]) == ["name=a lr=0.1"]  # a single point: all of its own


def test_sweep_table_and_plot_legend_name_the_varying_overrides_outside_the_panels(tmp_path: Path) -> None:
    from hpcdl.lifecycle.sweep_report import curves_figure, format_table, plot_curves, summary, write_csv
    from hpcdl.store.files import SUMMARY_CSV

    constant = ["name=digits", "training.max_epochs=2", "data.root=/a/long/path/to/the/data"]
    points = [_point(tmp_path / f"s_{n}", n, [*constant, f"training.initial_learn_rate={rate}"],
                     [1.0, 0.6 * rate * 10, 0.3]) for n, rate in enumerate((0.1, 0.05, 0.02))]
    table = format_table(summary(points))
    assert [line.split()[1] for line in table.splitlines()[1:]] == \
        ["training.initial_learn_rate=0.1", "training.initial_learn_rate=0.05", "training.initial_learn_rate=0.02"]
    assert "max_epochs" not in table and "data.root" not in table
    write_csv(summary(points), tmp_path / SUMMARY_CSV)  # the CSV keeps each point's every override
    assert "data.root=/a/long/path/to/the/data training.initial_learn_rate=0.05" in (tmp_path / SUMMARY_CSV).read_text()

    figure = curves_figure(points)
    legend, = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == \
        ["training.initial_learn_rate=0.1", "training.initial_learn_rate=0.05", "training.initial_learn_rate=0.02"]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    for axes in figure.axes:
        assert not box.overlaps(axes.get_window_extent(renderer)), axes.get_title()
    assert plot_curves(points, tmp_path / "curves.png")
    from matplotlib.image import imread

    height, width = imread(tmp_path / "curves.png").shape[:2]
    assert width > 1300 and height > 400  # the legend beside the panels (12 x 4.5 in at 100 dpi) is in the picture


def test_a_long_sweeps_legend_stands_in_columns_beside_the_panels(tmp_path: Path) -> None:
    from hpcdl.lifecycle.sweep_report import curves_figure

    points = [_point(tmp_path / f"s_{n}", n, ["name=a", f"training.initial_learn_rate={n / 1000}"],
                     [1.0, 0.5, 0.1 + n / 100]) for n in range(60)]
    figure = curves_figure(points)
    legend, = figure.legends
    assert legend._ncols == 3 and legend.get_texts()[59].get_text() == "training.initial_learn_rate=0.059"
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    assert box.height < 1.6 * figure.bbox.height  # not a tower of 60 rows far below the panels
    assert not any(box.overlaps(axes.get_window_extent(renderer)) for axes in figure.axes)


OPTUNA_APP = '''
import hydra


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg):
    return (cfg.x - 3) ** 2
'''
OPTUNA_CONFIG = """
defaults:
  - override hydra/sweeper: optuna
  - _self_
x: 0
hydra:
  sweeper:
    sampler:
      seed: 0
    direction: minimize
    n_trials: 4
    n_jobs: 2
    params:
      x: choice(1, 3, 6)
"""


def optuna_app(folder: Path) -> Path:
    """A @hydra.main app under Hydra's Optuna sweeper: 4 trials of x in 1, 3, 6, value (x - 3)^2."""
    (folder / "config.yaml").write_text(OPTUNA_CONFIG)
    (folder / "app.py").write_text(OPTUNA_APP + "\n\nif __name__ == '__main__':\n    main()\n")
    return folder / "app.py"


def optuna_study(app: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the study with hydra/launcher=hpcdl; the command and its optimization_results.yaml (empty if none)."""
    done = subprocess.run([sys.executable, app.name, "-m", "hydra/launcher=hpcdl", "hydra.sweep.dir=study",
                           *overrides], cwd=app.parent, capture_output=True, text=True, timeout=300)
    results = app.parent / "study" / "optimization_results.yaml"
    return done, yaml.safe_load(results.read_text()) if results.is_file() else {}


def test_an_optuna_study_gets_its_trials_values_without_a_wait_setting(store: Path, tmp_path: Path) -> None:
    done, results = optuna_study(optuna_app(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "Failed experiment" not in done.stderr + done.stdout, done.stderr
    sweep = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    points = [load_record(store / f"{sweep}_{i}") for i in range(4)]
    assert {p.state for p in points} == {"COMPLETED"}  # every trial had ended when the study did
    tried = [int(p.manifest["sweep"]["overrides"][0].partition("=")[2]) for p in points]
    assert results["best_value"] == min((x - 3) ** 2 for x in tried), (tried, results)


def test_an_optuna_study_told_not_to_wait_is_refused_before_anything_is_submitted(store: Path,
                                                                                  tmp_path: Path) -> None:
    done, _ = optuna_study(optuna_app(tmp_path), "hydra.launcher.wait=false")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: hydra.launcher.wait=false: the sweeper "), done.stderr
    assert "set hydra.launcher.wait=true" in done.stderr
    assert job_folders(store) == []


@pytest.mark.parametrize("overrides, message", [
    (["+hydra.launcher.resources.cpus_per_task=-3"], "cluster.cpus_per_task: must be a positive integer or null"),
    (["hydra.launcher.cluster=slurmm"], "cluster=slurmm: no such option in group cluster (did you mean slurm?)"),
])
def test_a_bad_launcher_setting_in_a_users_app_is_one_error_line(store: Path, tmp_path: Path,
                                                                 overrides: list[str], message: str) -> None:
    (tmp_path / "config.yaml").write_text("x: 0\n")
    (tmp_path / "app.py").write_text(OPTUNA_APP + "\n\nif __name__ == '__main__':\n    main()\n")
    done = subprocess.run([sys.executable, "app.py", "-m", "hydra/launcher=hpcdl", "x=1,2", *overrides],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.startswith("error: hydra.launcher ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr
    assert job_folders(store) == []


def test_a_waiting_sweep_interrupted_cancels_its_points(store: Path, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("x: 0\n")
    (tmp_path / "app.py").write_text(
        "import time\n\nimport hydra\n\n\n@hydra.main(version_base=None, config_path='.', config_name='config')\n"
        "def main(cfg):\n    time.sleep(120)\n\n\nif __name__ == '__main__':\n    main()\n")
    app = subprocess.Popen([sys.executable, "app.py", "-m", "hydra/launcher=hpcdl", "hydra.launcher.wait=true",
                            "x=1,2"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    submitted = app.stdout.readline()
    sweep = re.search(r"Submitted sweep (\S+):", submitted).group(1)
    app.send_signal(signal.SIGINT)  # Ctrl-C while it waits
    _, stderr = app.communicate(timeout=60)
    assert app.returncode != 0 and f"cancelling sweep {sweep}" in stderr, stderr
    assert Job.attach(sweep).wait(timeout=60) == "CANCELLED"
    assert {load_record(store / f"{sweep}_{i}").state for i in range(2)} == {"CANCELLED"}


def test_cancel_says_the_state_of_a_sweep_whose_point_ended_while_it_cancelled(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A point that records its own end after cancel read it (10,000-point sweeps see this) counts as it ended,
    not as the RUNNING that was read."""
    import hpcdl.lifecycle.job as lifecycle_job
    from hpcdl.store.status import write_final

    (tmp_path / "config.yaml").write_text("x: 0\n")
    (tmp_path / "app.py").write_text(
        "import time\n\nimport hydra\n\n\n@hydra.main(version_base=None, config_path='.', config_name='config')\n"
        "def main(cfg):\n    time.sleep(120)\n\n\nif __name__ == '__main__':\n    main()\n")
    done = subprocess.run([sys.executable, "app.py", "-m", "hydra/launcher=hpcdl", "hydra.launcher.parallelism=3",
                           "x=1,2,3"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    sweep = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    deadline = time.monotonic() + 60
    while Job.attach(f"{sweep}_0").state != "RUNNING":
        assert time.monotonic() < deadline, "the points never ran"
        time.sleep(0.2)
    read = lifecycle_job.resolve_sweep

    def read_then_point_0_completes(record: JobRecord, known: dict) -> list[JobRecord]:
        points = read(record, known)
        write_final(store / f"{sweep}_0", "COMPLETED")
        return points

    monkeypatch.setattr(lifecycle_job, "resolve_sweep", read_then_point_0_completes)
    job = Job.attach(sweep)
    job.cancel()
    assert job.last_seen_state == "CANCELLED", job.last_seen_state
    assert load_record(store / sweep) is not None
    monkeypatch.undo()
    assert {load_record(store / f"{sweep}_{i}").state for i in range(3)} == {"COMPLETED", "CANCELLED"}


SQUARE_APP = '''
import hydra


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg):
    return cfg.x * cfg.x


if __name__ == "__main__":
    main()
'''


def _square_app(folder: Path) -> Path:
    (folder / "config.yaml").write_text("x: 0\n")
    (folder / "app.py").write_text(SQUARE_APP)
    return folder / "app.py"


def test_a_bad_point_in_a_later_batch_is_refused_before_the_first_batch_runs(store: Path) -> None:
    done = _submit("training.max_epochs=1,2,0", "hydra.sweeper.max_batch_size=2")
    assert done.returncode == 2 and "training.max_epochs" in done.stderr + done.stdout, done.stderr
    assert job_folders(store) == []  # the first batch (1, 2) was submitted and ran


def test_the_basic_sweepers_batches_go_in_as_one_sweep_with_plain_values_as_hydra_composes_them(
        store: Path, tmp_path: Path) -> None:
    app = _square_app(tmp_path)
    done = subprocess.run([sys.executable, str(app), "-m", "hydra/launcher=hpcdl", "hydra.sweeper.max_batch_size=2",
                           "x=2,3,5", "+y=7"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(re.findall(r"Submitted sweep (\S+): 3 point\(s\)", done.stdout)) == 1, done.stdout
    sweep = re.search(r"Submitted sweep (\S+):", done.stdout).group(1)
    assert Job.attach(sweep).wait(timeout=240) == "COMPLETED"
    for num, x in enumerate((2, 3, 5)):
        point = Job.attach(f"{sweep}_{num}")
        assert point.result().return_value == x * x
        hydra = yaml.safe_load((point.folder / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert (hydra["job"]["num"], hydra["job"]["id"]) == (num, point.id)
        assert hydra["overrides"]["task"] == [f"x={x}", "+y=7"] and hydra["job"]["override_dirname"] == f"+y=7,x={x}"
        assert yaml.safe_load((point.folder / ".hydra" / "config.yaml").read_text()) == {"x": x, "y": 7}


def _moment(store: Path, moment: str, points: int) -> bool:
    """Whether a submission of ``points`` points has reached ``moment``."""
    sweeps = [p for p in store.iterdir() if "_" not in p.name] if store.is_dir() else []
    if not sweeps or not (sweeps[0] / "manifest.json").exists():
        return False
    if moment == "sweep recorded":
        return True
    written = sum(1 for p in store.iterdir() if (p / "manifest.json").exists()) - 1
    if moment == "some points written":
        return written >= 20
    manifest = sweeps[0] / "manifest.json"
    return written >= points and manifest.exists() and '"backend_id": "' in manifest.read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.parametrize("moment", ["sweep recorded", "some points written", "handed to the runner"])
def test_an_interrupted_sweep_submission_leaves_nothing_or_a_sweep_listed_interrupted_that_cancel_removes(
        store: Path, tmp_path: Path, signum: int, moment: str) -> None:
    points = 300
    app = _square_app(tmp_path)
    submitting = subprocess.Popen([sys.executable, str(app), "-m", "hydra/launcher=hpcdl", f"x=range({points})"],
                                  cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not _moment(store, moment, points) and submitting.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    submitting.send_signal(signum)
    submitting.wait(timeout=60)
    sweeps = [name for name in job_folders(store) if "_" not in name]
    if not sweeps:
        assert job_folders(store) == []
        return
    assert len(sweeps) == 1, sweeps
    sweep = sweeps[0]
    named = json.loads((store / sweep / "manifest.json").read_text())["points"]
    assert set(job_folders(store)) - {sweep} <= set(named)  # every folder left is named by the sweep
    listing = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "list"], capture_output=True, text=True).stdout
    state = re.search(rf"^{sweep}\s+app\s+local\s+(\S+)", listing, re.M)
    assert state and state.group(1) in ("INTERRUPTED", "PENDING", "RUNNING", "COMPLETED"), listing
    assert "FAILED" not in listing, listing
    if state.group(1) == "INTERRUPTED":
        time.sleep(1)  # a runner it started has looked at its points meanwhile
        assert not list(store.glob("*/status.json"))  # none of its points ran
    cancelled = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "cancel", sweep], capture_output=True,
                               text=True, timeout=120)
    assert cancelled.returncode == 0, cancelled.stderr
    if state.group(1) == "INTERRUPTED":
        assert f"removed {sweep}" in cancelled.stdout
        assert job_folders(store) == []
    else:
        assert "state now CANCELLED" in cancelled.stdout, cancelled.stdout


def test_a_submission_cut_in_a_later_batch_holds_back_that_batch_alone(tmp_path: Path) -> None:
    from hpcdl.host import process_id
    from hpcdl.store.folders import write_json
    from hpcdl.store.sweeps import SUBMITTING_MARK, handed_over, submission_state

    submitter = subprocess.Popen(["sleep", "30"])
    submitted_from = {"host": "vm", "cwd": "/", "process": process_id(submitter.pid)}
    sweep = "261205-120000-abcd"
    points = [f"{sweep}_{n}" for n in range(4)]

    def record(mark: int) -> JobRecord:
        manifest = {"id": sweep, "kind": "sweep", "points": points, SUBMITTING_MARK: mark,
                    "submitted_from": submitted_from}
        (tmp_path / sweep).mkdir(exist_ok=True)
        write_json(tmp_path / sweep / "manifest.json", manifest)
        return JobRecord(tmp_path / sweep, manifest, {})

    def point(n: int) -> dict:
        return {"id": points[n], "backend_id": "1:0", "sweep": {"id": sweep, "num": n},
                "submitted_from": submitted_from}

    second_batch = record(2)  # points 2 and 3 are being handed over; 0 and 1 went in with the first batch
    assert submission_state(second_batch) == "SUBMITTING"
    assert handed_over(point(0), tmp_path) is True and handed_over(point(3), tmp_path) is None
    submitter.kill()
    submitter.wait()
    assert submission_state(second_batch) is None  # not INTERRUPTED: cancelling it would remove the first batch
    assert handed_over(point(1), tmp_path) is True and handed_over(point(2), tmp_path) is False
    assert submission_state(record(4)) == "INTERRUPTED"  # cut in its first batch: none of it runs
    assert handed_over(point(0), tmp_path) is False
