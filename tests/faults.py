"""Injected faults for the job doctor's tests: user code that fails, dies or hangs on one rank of several, and
the helpers to submit it and read what ``jobs why`` prints (local and Slurm tests share them)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from hpcdl.config.cluster import DEFAULT_EXPORT
from hpcdl.store.files import FINAL, HEARTBEAT, HEARTBEATS

MPIRUN_HERE = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "OMPI_MCA_rmaps_base_oversubscribe": "1", "CUDA_VISIBLE_DEVICES": ""}
"""Open MPI's settings to start two ranks on this machine (as root, more ranks than cores, no GPU)."""
MPI_TRAINER = ("training.execution_environment=parallel", "training.comm=mpi", "cluster.tasks_per_node=2",
               "training.max_epochs=1000", "training.mini_batch_size=16", "training.verbose=false")
"""The built-in trainer on 2 MPI ranks here, training long enough for a fault to come (with data.root)."""

FAULTS = '''
import datetime, os, threading, time
import torch
import torch.distributed as dist
import hpcdl


def _join():
    timeout = datetime.timedelta(seconds=float(os.environ["HPCDL_COLLECTIVE_TIMEOUT_S"]))
    dist.init_process_group("gloo", timeout=timeout)
    return dist.get_rank()


def raise_on_rank_1(config):
    rank = _join()
    value = torch.ones(1)
    dist.all_reduce(value)
    if rank == 1:  # a thread that is no daemon keeps the process alive after its error: its peers time out
        threading.Thread(target=time.sleep, args=(300,)).start()
        print(f"fault at {time.time()}", flush=True)
        raise ValueError("rank 1 fails on purpose")
    dist.all_reduce(value)


def steps_forever(config):
    rank, step = _join(), 0
    while True:
        step += 1
        value = torch.ones(1)
        dist.all_reduce(value)
        hpcdl.report(step, float(value))
        if rank == 2 and step == 5:
            nap_before_all_reduce()
        time.sleep(0.1)


def recv_on_rank_2(config):
    """Steps as steps_forever, but rank 2 then waits for a message rank 0 never sends: every rank waits in a
    collective or a receive, so only the flight recorder tells which is behind."""
    rank, step = _join(), 0
    while True:
        step += 1
        dist.all_reduce(torch.ones(1))
        hpcdl.report(step, 1.0 / step)
        if rank == 2 and step == 5:
            wait_for_a_message_never_sent()
        time.sleep(0.1)


def wait_for_a_message_never_sent():
    print(f"fault at {time.time()}", flush=True)
    dist.recv(torch.zeros(1), src=0)


def nap_before_all_reduce():
    print(f"fault at {time.time()}", flush=True)
    time.sleep(float(os.environ.get("FAULT_NAP_S", "0")))


def _launched_rank():
    """This rank's number as its launcher gives it (hpcdl's and torchrun's RANK, mpirun's own variable)."""
    return os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))


class NappingNet(torch.nn.Module):
    """A network for the built-in trainer whose rank $FAULT_RANK (2) naps in its 5th training forward pass,
    before the gradient exchange its peers wait in."""

    def __init__(self, in_channels, num_classes, image_size):
        super().__init__()
        inputs = in_channels * image_size[0] * image_size[1]
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(inputs, num_classes))
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if _launched_rank() == os.environ.get("FAULT_RANK", "2") and self.calls == 5:
                self.fault()
        return self.body(x)

    def fault(self):
        nap_before_all_reduce()


class RaisingNet(NappingNet):
    """NappingNet whose rank $FAULT_RANK raises instead of napping, its peers waiting in the gradient exchange."""

    def fault(self):
        print(f"fault at {time.time()}", flush=True)
        raise ValueError("the forward pass fails on purpose")
'''

SCRIPT = '''
import datetime, os
import torch
import torch.distributed as dist


def check(value):
    raise ValueError(f"bad value {value} on purpose")


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ["HPCDL_COLLECTIVE_TIMEOUT_S"])))
if dist.get_rank() == 1:
    print(f"fault at {__import__('time').time()}", flush=True)
    check(7)
dist.all_reduce(torch.ones(1))
'''


NAPPING_SCRIPT = '''
import time


def nap():
    time.sleep(600)


nap()
'''


STEPPING_SCRIPT = '''
import datetime, os, time
import torch
import torch.distributed as dist
import hpcdl


def nap_before_all_reduce():
    print(f"fault at {time.time()}", flush=True)
    time.sleep(600)


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ["HPCDL_COLLECTIVE_TIMEOUT_S"])))
for step in range(1, 100000):
    dist.all_reduce(torch.ones(1))
    hpcdl.report(step, 1.0 / step)
    if dist.get_rank() == 1 and step == 5:
        nap_before_all_reduce()
    time.sleep(0.1)
'''


def write_faults(folder: Path) -> Path:
    """``folder`` with faults.py (entry functions), failing_script.py, napping_script.py (which never reports a
    step) and stepping_script.py (which reports steps, rank 1 napping before its sixth all-reduce) in it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "faults.py").write_text(FAULTS)
    (folder / "failing_script.py").write_text(SCRIPT)
    (folder / "napping_script.py").write_text(NAPPING_SCRIPT)
    (folder / "stepping_script.py").write_text(STEPPING_SCRIPT)
    return folder


def mpirun_export(*exported: str) -> str:
    """The cluster.export override that passes MPIRUN_HERE and ``exported`` to a job, with the default list
    (``cluster.export`` replaces it; mpirun looks for ssh in PATH)."""
    return f"cluster.export=[{','.join(dict.fromkeys((*DEFAULT_EXPORT, *exported, *MPIRUN_HERE)))}]"


def cli(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def submit(cwd: Path, *args: str) -> str:
    done = cli(cwd, "hpcdl.submit", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[2]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def heartbeat_of(folder: Path, rank: int) -> dict:
    """Rank ``rank``'s newest heartbeat ({} before its first)."""
    try:
        return json.loads((folder / HEARTBEATS / HEARTBEAT.format(rank=rank)).read_text())
    except (OSError, ValueError):
        return {}


def verdict_after(cwd: Path, folder: Path, job_id: str, fault_at: float, timeout: float = 240) -> tuple[str, float]:
    """What ``jobs why`` prints once the job has ended, and the seconds from ``fault_at`` (time.time) to the
    verdict: when the job's final state was recorded (final.json's time)."""
    waited = cli(cwd, "hpcdl.jobs", "wait", job_id, "--timeout", str(timeout), timeout=timeout + 60)
    assert waited.stdout.strip() == "FAILED", (waited.stdout, waited.stderr)
    why = cli(cwd, "hpcdl.jobs", "why", job_id)
    assert why.returncode == 0, why.stderr
    return why.stdout, (folder / FINAL).stat().st_mtime - fault_at


def hang_verdict(cwd: Path, folder: Path, job_id: str, rank: int, steps: int, host: str,
                 wait_s: float) -> tuple[str, float]:
    """``jobs why`` of a job whose rank ``rank`` naps after its ``steps``-th step (waited for up to ``wait_s``),
    and the seconds from its nap to the verdict; its root cause must be that rank's Hang, with its stack."""
    wait_for(lambda: heartbeat_of(folder, rank).get("steps", 0) >= steps, wait_s, f"rank {rank} reached its nap")
    why, ended_s = verdict_after(cwd, folder, job_id, time.time())
    root = root_line(why)
    assert root.startswith(f"root cause: rank {rank} on {host} (pid ") and "Hang: not in the collective" in root, why
    assert "in nap_before_all_reduce" in why and f"OUTLIER rank {rank}" in why, why
    return why, ended_s


def root_line(why: str) -> str:
    """The 'root cause: ...' line of jobs why."""
    found = re.search(r"^root cause: .*$", why, re.MULTILINE)
    assert found is not None, why
    return found.group(0)
