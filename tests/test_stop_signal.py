"""The time-limit signal on the local profile: USR2 signal_delay_s before the limit, every rank stops after
the same iteration with a checkpoint, the job ends TIMEOUT, and `jobs resume` goes on from there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hpcdl.store.files import CHECKPOINTS, FINAL, MANIFEST, METRICS


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300)


def _iterations(folder: Path) -> list[int]:
    lines = (folder / METRICS).read_text().splitlines()
    return [r["iteration"] for r in map(json.loads, lines) if r["kind"] == "iteration"]


def _stopped_at(folder: Path) -> int:
    final = json.loads((folder / FINAL).read_text())
    assert final["state"] == "TIMEOUT" and "stopped on SIGUSR2 after iteration" in final["reason"], final
    assert (folder / CHECKPOINTS / f"checkpoint-{final['iteration']:09d}.pt").is_file()
    return final["iteration"]


def test_time_limit_checkpoints_every_rank_and_resume_goes_on(store: Path, digits_root: Path) -> None:
    submitted = _cli("hpcdl.submit", f"data.root={digits_root}", "training.max_epochs=1000",
                     "training.mini_batch_size=16", "training.verbose=false", "cluster.time=00:00:40",
                     "cluster.signal_delay_s=25", "training.execution_environment=parallel",
                     "cluster.tasks_per_node=2")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[2]
    assert _cli("hpcdl.jobs", "wait", job_id, "--timeout", "120").stdout.strip() == "TIMEOUT"
    folder = store / job_id
    first = _stopped_at(folder)
    assert first > 0 and _iterations(folder) == list(range(1, first + 1))

    resumed = _cli("hpcdl.jobs", "resume", job_id, "--time", "00:00:40")
    assert resumed.returncode == 0 and f"resumed {job_id}" in resumed.stdout, resumed.stderr
    assert _cli("hpcdl.jobs", "wait", job_id, "--timeout", "120").stdout.strip() == "TIMEOUT"
    second = _stopped_at(folder)
    assert second > first and _iterations(folder) == list(range(1, second + 1))  # no gap, no repeat
    assert f"Resumed from the checkpoint of iteration {first}" in _cli("hpcdl.jobs", "logs", job_id).stdout  # rank 0
    manifest = json.loads((folder / MANIFEST).read_text())
    assert [r["after"] for r in manifest["resumes"]] == ["TIMEOUT"]
    shown = _cli("hpcdl.jobs", "show", job_id).stdout
    assert "resumed" in shown and "stopped" in shown


def test_a_completed_job_is_not_resumed(store: Path, digits_root: Path) -> None:
    submitted = _cli("hpcdl.submit", f"data.root={digits_root}", "training.max_epochs=1", "training.verbose=false")
    job_id = submitted.stdout.split()[2]
    assert _cli("hpcdl.jobs", "wait", job_id, "--timeout", "120").stdout.strip() == "COMPLETED"
    refused = _cli("hpcdl.jobs", "resume", job_id)
    assert refused.returncode == 1 and f"job {job_id} is COMPLETED: only a job that ended" in refused.stderr
