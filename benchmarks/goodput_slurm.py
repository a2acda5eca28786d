"""Goodput on the Slurm test cluster: a training job stopped by the scheduler's signal and requeued (--requeues
times), then killed outright (SIGKILL, a lost node) and resumed with `jobs resume` (--kills times), against the
same job left alone, in one run.

Reported: wall time of both from submit to COMPLETED; the scheduler's hold of each requeued job (Slurm 22.05
keeps a requeued job ineligible for ~120 s), apart; iterations redone per fault (the iteration a fault came
after, less the checkpoint the job went on from); effective training time = the uninterrupted run's wall time /
(the interrupted run's wall time less the scheduler's holds); and whether the final weights are bit for bit the
uninterrupted run's. Needs `slurm/cluster.sh up`; writes benchmarks/results/goodput_slurm.json.

    python benchmarks/goodput_slurm.py [--epochs 8 --requeues 2 --kills 1 --every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_result  # benchmarks/common.py
from goodput import _iterations, same_weights
from hpcdl.data.digits import digits_folder
from hpcdl.lifecycle.job import Job


def _submit(args: argparse.Namespace, root: Path) -> Job:
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "cluster=slurm", f"data.root={root}",
                           "training.verbose=false", f"training.max_epochs={args.epochs}", "training.mini_batch_size=32",
                           f"training.checkpoint_frequency={args.every}", "training.checkpoint_frequency_unit=iteration",
                           f"cluster.max_requeues={args.requeues}", "cluster.time=00:30:00"],
                          capture_output=True, text=True, check=True)
    return Job.attach(done.stdout.split()[2])


def _until(condition, timeout: float = 900) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not get there in time")
        time.sleep(0.2)


def _training_past(job: Job, iteration: int) -> bool:
    return job.refresh().status.get("state") == "RUNNING" and max(_iterations(job.folder), default=0) > iteration


def _resumed_from(job: Job) -> list[int]:
    logs = job.logs(0)
    return [int(n) for n in re.findall(r"Resumed from the checkpoint of iteration (\d+)", logs)]


def interrupted(args: argparse.Namespace, root: Path, span: float) -> dict:
    start = time.perf_counter()
    job = _submit(args, root)
    holds, faults = [], []
    for fault in range(args.requeues + args.kills):
        time.sleep(max(0.0, start + sum(holds) + (fault + 1) * span / (args.requeues + args.kills + 1)
                       - time.perf_counter()))
        floor = faults[-1] if faults else 0
        _until(lambda: _training_past(job, floor + args.every))  # a checkpoint newer than the last fault's
        restarts = job.refresh().status.get("restarts", 0)
        if fault < args.requeues:  # the scheduler's warning: stop, checkpoint, requeue
            subprocess.run(["scancel", "--signal=USR2", job.backend_id], check=True)
            _until(lambda: job.refresh().status.get("state") == "REQUEUED")
            faults.append(job.refresh().status["events"][-1]["iteration"])
            held = time.perf_counter()
            _until(lambda: (job.refresh().status.get("state"), job.refresh().status.get("restarts"))
                   == ("RUNNING", restarts + 1))
            holds.append(time.perf_counter() - held)
        else:  # a lost node: no warning, no checkpoint
            faults.append(max(_iterations(job.folder), default=0))
            os.kill(job.refresh().status["pid"], signal.SIGKILL)
            _until(lambda: job.done(), 300)
            subprocess.run([sys.executable, "-m", "hpcdl.jobs", "resume", job.id], check=True, capture_output=True)
            job = Job.attach(job.id)
    _until(lambda: job.done(), 900)
    assert job.state == "COMPLETED", job.error()
    wall = time.perf_counter() - start
    resumed = _resumed_from(job)
    return {"wall_s": wall, "holds_s": holds, "fault_iterations": faults, "folder": job.folder,
            "resumed_from": resumed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--requeues", type=int, default=2)
    parser.add_argument("--kills", type=int, default=1)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every this many iterations")
    parser.add_argument("--out", default="benchmarks/results/goodput_slurm.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcdl-goodput-slurm-"))
    root = digits_folder(work / "digits")
    os.environ["HPCDL_STORE"] = str(work / "store")
    start = time.perf_counter()
    reference = _submit(args, root)
    _until(lambda: reference.done(), 900)
    straight_s = time.perf_counter() - start
    run = interrupted(args, root, straight_s)
    useful_s = run["wall_s"] - sum(run["holds_s"])
    lost = run["wall_s"] - sum(run["holds_s"]) - straight_s
    result = {"benchmark": "goodput_slurm", "epochs": args.epochs, "requeues": args.requeues, "kills": args.kills,
              "checkpoint_every": args.every, "straight_s": straight_s, "interrupted_s": run["wall_s"],
              "scheduler_holds_s": run["holds_s"], "fault_iterations": run["fault_iterations"],
              "resumed_from_log": run["resumed_from"],
              "effective_training_time": straight_s / useful_s, "lost_per_fault_s": lost / (args.requeues + args.kills),
              "final_weights_bit_identical": same_weights(reference.folder, run["folder"])}
    write_result(args.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
