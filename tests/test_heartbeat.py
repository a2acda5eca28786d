"""Heartbeats on the local profile: a stopped rank fails its job fast, named, and jobs resume goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl.cluster import backend_for
from hpcdl.distributed import heartbeat
from hpcdl.store.files import FINAL, HEARTBEATS, METRICS


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300)


def _beat(folder: Path, rank: int, **fields) -> None:  # noqa: ANN003
    (folder / HEARTBEATS).mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "host": "n1", "pid": 100 + rank, "run": "this", "ticks": 1, "stepped": True,
              "done": False, **fields}
    (folder / HEARTBEATS / f"rank{rank}.json").write_text(json.dumps(record))


def test_the_watcher_names_the_first_rank_past_its_timeout(tmp_path: Path) -> None:
    watcher = heartbeat.Watcher(tmp_path, tmp_path / HEARTBEATS, 4, 0, "this", timeout_s=0.3, startup_s=1.2,
                                runs=backend_for("local"))
    _beat(tmp_path, 0)
    _beat(tmp_path, 1, stepped=False)  # still starting: the long allowance
    _beat(tmp_path, 2, done=True)  # returned: no more heartbeats expected
    _beat(tmp_path, 3, run="an earlier run")  # before a requeue: counts as not written yet
    assert watcher.silent_rank() is None
    time.sleep(0.5)
    _beat(tmp_path, 1, stepped=False, ticks=2)
    rank, beat, silent = watcher.silent_rank()
    assert (rank, beat["pid"]) == (0, 100) and 0.3 < silent < 1.0  # stepped, then silent
    _beat(tmp_path, 0, ticks=2)
    assert watcher.silent_rank() is None
    time.sleep(0.9)
    _beat(tmp_path, 0, ticks=3)
    rank, beat, silent = watcher.silent_rank()  # rank 1 still ticks; rank 3 never sent one of this run
    assert (rank, beat) == (3, None) and silent > 1.2


def _wait_for(condition, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_stopped_rank_fails_the_job_fast_naming_it_and_resume_goes_on(store: Path, digits_root: Path) -> None:
    submitted = _cli("hpcdl.submit", f"data.root={digits_root}", "training.max_epochs=1000",
                     "training.mini_batch_size=16", "training.verbose=false", "training.execution_environment=parallel",
                     "cluster.tasks_per_node=2", "cluster.heartbeat_timeout_s=5", "cluster.time=00:05:00")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[2]
    folder = store / job_id
    beat = folder / HEARTBEATS / "rank1.json"
    checkpoints = folder / "checkpoints"
    _wait_for(lambda: beat.is_file() and json.loads(beat.read_text())["stepped"] and checkpoints.is_dir()
              and any(checkpoints.glob("*.pt")), 120, "rank 1 trained and a checkpoint was written")
    pid = json.loads(beat.read_text())["pid"]
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert _cli("hpcdl.jobs", "wait", job_id, "--timeout", "90").stdout.strip() == "FAILED"
        assert time.monotonic() - stopped < 40  # 5 s of silence, then the launcher ends the ranks
        final = json.loads((folder / FINAL).read_text())
        assert final["rank"] == 1 and f"rank 1 (host {os.uname().nodename}, pid {pid}) sent no heartbeat" \
            in final["reason"], final
        assert "rank 1" in _cli("hpcdl.jobs", "show", job_id).stdout
        _wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, "the stopped rank was ended")
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
    trained = [json.loads(line)["iteration"] for line in (folder / METRICS).read_text().splitlines()
               if json.loads(line)["kind"] == "iteration"]
    resumed = _cli("hpcdl.jobs", "resume", job_id, "--time", "00:00:30")
    assert resumed.returncode == 0, resumed.stderr
    assert _cli("hpcdl.jobs", "wait", job_id, "--timeout", "120").stdout.strip() == "TIMEOUT"
    assert "Resumed from the checkpoint of iteration" in _cli("hpcdl.jobs", "logs", job_id).stdout
    after = [json.loads(line)["iteration"] for line in (folder / METRICS).read_text().splitlines()
             if json.loads(line)["kind"] == "iteration"]
    assert after == list(range(1, after[-1] + 1)) and after[-1] > trained[-1]


@pytest.mark.parametrize("option", ["cluster.heartbeat_timeout_s=3", "cluster.heartbeat_startup_s=10"])
def test_heartbeat_settings_are_checked_before_submission(store: Path, option: str) -> None:
    refused = _cli("hpcdl.submit", option)
    assert refused.returncode == 2 and "heartbeat" in refused.stderr and not store.exists(), refused.stderr


def test_the_hang_watcher_leaves_a_validation_or_checkpoint_out_of_a_ranks_time_without_a_step(
        tmp_path: Path) -> None:
    from hpcdl.distributed.hangs import HangWatcher

    watcher = HangWatcher(tmp_path, 2, 0, "this", timeout_s=0.4, startup_s=None, runs=backend_for("local"))
    _beat(tmp_path, 0, steps=3, stepping=True, pauses=0)
    _beat(tmp_path, 1, steps=3, stepping=True, pauses=0)
    assert watcher.stalled_rank() is None
    _beat(tmp_path, 1, steps=3, stepping=False, pauses=0)  # validating: told while it lasts
    time.sleep(0.5)
    rank, steps, stalled = watcher.stalled_rank()
    assert (rank, steps) == (0, 3) and stalled > 0.4  # rank 0 made no step and no pause: hung
    _beat(tmp_path, 0, steps=3, stepping=True, pauses=1)  # a checkpoint that ended between two looks
    _beat(tmp_path, 1, steps=3, stepping=True, pauses=1)  # back to steps after the validation
    assert watcher.stalled_rank() is None
    time.sleep(0.5)
    assert watcher.stalled_rank()[0] == 0  # no step since either: counted from the pause's end


def test_the_built_in_trainers_hang_limit_stays_under_its_collective_timeout() -> None:
    from hpcdl.config import ClusterConfig
    from hpcdl.plan import JobPlan

    def limit(kind: str, **cluster: int) -> int:
        return JobPlan(kind=kind, name="x", cluster=ClusterConfig(**cluster)).waited_for_limit_s

    assert limit("train") == 240  # defaults: hang 1800 s, collective 300 s
    assert limit("train", collective_timeout_s=60) == 40 and limit("train", collective_timeout_s=10) == 15
    assert limit("train", hang_timeout_s=30) == 30 and limit("train", hang_timeout_s=5) == 5
    assert limit("train", hang_timeout_s=0) is None
    assert limit("script") is None and limit("entry") is None  # your own code's collectives time out on their own


def test_before_hang_timeout_a_stall_is_a_hang_only_where_other_ranks_wait_in_a_collective_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank compiling (no rank in a collective) is counted afresh; a rank outside the all-reduce the others
    wait in is the hang."""
    from hpcdl.distributed import hangs

    watcher = hangs.HangWatcher(tmp_path, 2, 0, "this", timeout_s=60, startup_s=None, runs=backend_for("local"),
                                waited_for_s=0.3)
    compiling = [["loop.py", 1, "run_epochs", ""], ["eval_frame.py", 2, "_fn", ""]]
    waiting = [["loop.py", 1, "run_epochs", ""], ["distributed_c10d.py", 3, "all_reduce", ""]]
    asked = {"stacks": {0: compiling, 1: compiling}}
    monkeypatch.setattr(hangs.stacks, "request", lambda folder, flight: "asked")
    monkeypatch.setattr(hangs.stacks, "collect", lambda folder, token, world, wait: {
        rank: {"main": stack, "host": "n1", "pid": 100 + rank} for rank, stack in asked["stacks"].items()})
    ended = []
    monkeypatch.setattr(hangs.os, "_exit", lambda status: ended.append(status))
    for rank in (0, 1):
        _beat(tmp_path, rank, steps=3, stepping=True, pauses=0)
    watcher.stalled_rank()
    time.sleep(0.4)
    watcher.diagnose(*watcher.stalled_rank())
    assert ended == [] and watcher.stalled_rank() is None  # counted afresh: nobody waits for anybody
    asked["stacks"] = {0: waiting, 1: compiling}
    time.sleep(0.4)
    watcher.diagnose(*watcher.stalled_rank())
    assert ended == [1]
    record = json.loads((tmp_path / "failures" / "rank1.json").read_text())
    assert record["type"] == "Hang" and record["cause"] and "not in the collective" in record["message"]
