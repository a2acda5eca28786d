"""tests/run-all.sh shares the Slurm cluster of its state folder: a run that found it up leaves it up; the run
that started it takes it down at exit, once every other run using it has ended. Dry runs (HPCDL_RUN_ALL_DRY=1):
the file dry-run-up in the state folder stands for the cluster, and a given command runs in place of pytest."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.test_states import _alive, _until

RUN_ALL = Path(__file__).resolve().parent / "run-all.sh"
WAIT_FOR_GO = 'touch "$1"; while [ ! -e "$2" ]; do sleep 0.05; done'  # the "tests": say they run, then wait


def _run_all(state: Path, log: Path, *command: str) -> subprocess.Popen:
    """A dry run of tests/run-all.sh against STATE, its messages written to LOG."""
    env = {**os.environ, "HPCDL_RUN_ALL_DRY": "1", "HPCDL_SLURM_STATE": str(state)}
    with log.open("w") as out:
        return subprocess.Popen(["bash", str(RUN_ALL), *command], env=env, stdout=out, stderr=subprocess.STDOUT)


def _waiting_run(state: Path, folder: Path, name: str) -> subprocess.Popen:
    """A dry run whose tests touch FOLDER/NAME.testing, then wait until FOLDER/NAME.go exists."""
    return _run_all(state, folder / f"{name}.log", "sh", "-c", WAIT_FOR_GO, "sh", str(folder / f"{name}.testing"),
                    str(folder / f"{name}.go"))


def _end(folder: Path, *runs: subprocess.Popen) -> None:
    """Let every waiting test command in FOLDER go, and end the runs that have not."""
    for name in ("starter", "joiner", "first", "second"):
        (folder / f"{name}.go").touch()
    for run in runs:
        run.kill()


def test_a_run_that_found_the_cluster_up_leaves_it_up(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "dry-run-up").touch()  # a cluster someone else started
    run = _run_all(state, tmp_path / "run.log", "true")
    assert run.wait(timeout=30) == 0
    said = (tmp_path / "run.log").read_text()
    assert "already up; this run leaves it up" in said and "took the cluster" not in said
    assert (state / "dry-run-up").exists()


def test_a_run_that_started_the_cluster_takes_it_down_and_exits_with_the_tests_status(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = _run_all(state, tmp_path / "run.log", "sh", "-c", 'test -e "$1/dry-run-up" && exit 3', "sh", str(state))
    assert run.wait(timeout=30) == 3  # the tests saw the cluster up, and their failure is the run's
    said = (tmp_path / "run.log").read_text()
    assert "starting the cluster" in said and f"took the cluster at {state} down" in said
    assert not (state / "dry-run-up").exists()


def test_the_run_that_started_the_cluster_waits_for_a_second_run_before_taking_it_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    starter = _waiting_run(state, tmp_path, "starter")
    _until(lambda: (tmp_path / "starter.testing").exists(), 30, "the starter's tests run")
    leftover = tmp_path / "leftover.pid"  # a process the second run's tests leave behind holds no lock
    joiner = _run_all(state, tmp_path / "joiner.log", "sh", "-c",
                      f'{WAIT_FOR_GO}; sleep 60 >/dev/null 2>&1 & echo $! > "$3"', "sh",
                      str(tmp_path / "joiner.testing"), str(tmp_path / "joiner.go"), str(leftover))
    try:
        _until(lambda: (tmp_path / "joiner.testing").exists(), 30, "the second run's tests run")
        (tmp_path / "starter.go").touch()
        _until(lambda: "waiting for the other runs" in (tmp_path / "starter.log").read_text(), 30, "starter done")
        time.sleep(1)
        assert starter.poll() is None and (state / "dry-run-up").exists()  # still up under the second run
        (tmp_path / "joiner.go").touch()
        assert joiner.wait(timeout=30) == 0
        assert starter.wait(timeout=10) == 0
        assert _alive(int(leftover.read_text()))
    finally:
        _end(tmp_path, starter, joiner)
        if leftover.exists():
            os.kill(int(leftover.read_text()), signal.SIGKILL)
    joiner_said = (tmp_path / "joiner.log").read_text()
    assert "already up; this run leaves it up" in joiner_said and "took the cluster" not in joiner_said
    assert f"took the cluster at {state} down" in (tmp_path / "starter.log").read_text()
    assert not (state / "dry-run-up").exists()


def test_two_runs_started_together_start_the_cluster_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    runs = [_waiting_run(state, tmp_path, name) for name in ("first", "second")]
    try:
        for name in ("first", "second"):
            _until(lambda: (tmp_path / f"{name}.testing").exists(), 30, f"the {name} run's tests run")
        said = [(tmp_path / f"{name}.log").read_text() for name in ("first", "second")]
        assert sorted("starting the cluster" in text for text in said) == [False, True], said
        for name in ("first", "second"):
            (tmp_path / f"{name}.go").touch()
        assert [run.wait(timeout=30) for run in runs] == [0, 0]
    finally:
        _end(tmp_path, *runs)
    assert not (state / "dry-run-up").exists()
