"""Your own code stopped by the time-limit signal and resumed: checkpoints through hpcdl.save_checkpoint and
hpcdl.load_checkpoint, the ranks agreeing on the step to stop at, and jobs resume going on from there."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import hpcdl
from hpcdl.store.files import FINAL

SCRIPT = textwrap.dedent('''\
    import sys
    import time

    import torch
    import torch.distributed as dist

    import hpcdl

    dist.init_process_group("gloo")
    rank, steps = dist.get_rank(), int(sys.argv[1])
    state = hpcdl.load_checkpoint()
    start = state["step"] if state else 0
    total = state["total"] if state else torch.zeros(1)
    print(f"rank {rank} starts after step {start}", flush=True)
    for step in range(start + 1, steps + 1):
        x = torch.full((1,), float(step))
        dist.all_reduce(x)
        total += x
        time.sleep(0.02 * (1 + rank))  # the ranks reach each step at different times
        stop = hpcdl.stop_requested()
        if stop or step % 25 == 0:
            hpcdl.save_checkpoint({"step": step, "total": total}, step=step)
        if stop:
            print(f"rank {rank} stops after step {step}", flush=True)
            hpcdl.stop(step)
    if rank == 0:
        hpcdl.save_result({"total": total.item(), "steps": steps})
''')


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_script_stopped_on_the_signal_resumes_exactly_where_its_ranks_agreed(store: Path, tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "steps.py").write_text(SCRIPT)
    steps = 600  # about 24 s on rank 1: the first run stops after 10
    done = _cli(user, "hpcdl.submit", "script=steps.py", "cluster.tasks_per_node=2", "cluster.time=00:00:20",
                "cluster.signal_delay_s=10", "--", str(steps))
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[2]
    assert _cli(user, "hpcdl.jobs", "wait", job_id, "--timeout", "90").stdout.strip() == "TIMEOUT", \
        _cli(user, "hpcdl.jobs", "show", job_id).stdout
    final = json.loads((store / job_id / FINAL).read_text())
    stopped = final["iteration"]
    assert 0 < stopped < steps and f"after iteration {stopped}" in final["reason"], final
    for rank in (0, 1):  # both ranks stopped after the same step
        logs = _cli(user, "hpcdl.jobs", "logs", job_id, "--rank", str(rank)).stdout
        assert f"rank {rank} stops after step {stopped}" in logs, logs

    resumed = _cli(user, "hpcdl.jobs", "resume", job_id, "--time", "00:05:00")
    assert resumed.returncode == 0, resumed.stderr
    assert _cli(user, "hpcdl.jobs", "wait", job_id, "--timeout", "240").stdout.strip() == "COMPLETED", \
        _cli(user, "hpcdl.jobs", "show", job_id).stdout
    for rank in (0, 1):
        assert f"rank {rank} starts after step {stopped}" in _cli(user, "hpcdl.jobs", "logs", job_id, "--rank",
                                                                   str(rank)).stdout
    result = hpcdl.Job.attach(job_id).result()
    assert result == {"total": 2 * steps * (steps + 1) / 2, "steps": steps}  # every step once, on both ranks
    assert "resumed" in _cli(user, "hpcdl.jobs", "show", job_id).stdout


def count_steps(steps: int) -> list[int]:
    """A function job: one step every 20 ms, stopping on the signal; returns the steps of each run."""
    import time

    state = hpcdl.load_checkpoint()
    runs = state["runs"] if state else []
    start = runs[-1][1] if runs else 0
    runs.append([start, start])
    for step in range(start + 1, steps + 1):
        time.sleep(0.02)
        runs[-1][1] = step
        stop = hpcdl.stop_requested()
        if stop or step % 50 == 0:
            hpcdl.save_checkpoint({"runs": runs}, step=step)
        if stop:
            hpcdl.stop(step)
    return runs


def test_a_function_job_resumes_from_its_checkpoint(store: Path) -> None:
    job = hpcdl.batch(count_steps, 600, time="00:00:12", signal_delay_s=6)
    assert job.wait(timeout=60) == "TIMEOUT"
    resumed = _cli(Path.cwd(), "hpcdl.jobs", "resume", job.id, "--time", "00:02:00")
    assert resumed.returncode == 0, resumed.stderr
    assert job.wait(timeout=120) == "COMPLETED", job.error()
    (first_start, first_end), (second_start, second_end) = job.result()
    assert first_start == 0 and 0 < first_end < 600 and (second_start, second_end) == (first_end, 600)


def test_a_job_that_saved_no_checkpoint_is_not_resumed(store: Path) -> None:
    job = hpcdl.batch(hpcdl.stop, 3)  # stops at once, with nothing saved
    assert job.wait(timeout=60) == "TIMEOUT"
    refused = _cli(Path.cwd(), "hpcdl.jobs", "resume", job.id)
    assert refused.returncode == 1 and "saved no checkpoint (hpcdl.save_checkpoint)" in refused.stderr
