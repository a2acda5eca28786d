"""The job doctor's verdicts over injected faults: how often `jobs why` names the right rank and host as the root
cause, and how long after the fault the verdict was there.

Faults (tests/faults.py), each --repeats times on 4 ranks (local: one machine; slurm: 2 nodes x 2 tasks):
an exception on rank 1 while rank 0 waits for it in an all-reduce (timeout 10 s), kill -9 of rank 2, rank 2
sleeping before an all-reduce while alive (hang_timeout_s=5), rank 2 waiting for a message never sent while the
others wait in an all-reduce (only the flight recorder tells), a script raising on rank 1; locally also the
built-in trainer on 2 MPI ranks (mpirun here) with rank 1 raising in its forward pass and rank 1 napping before
the gradient exchange (collective_timeout_s=60: MPI has no timeout, the hang watch ends it). The fault's time
is what the faulty rank printed just before it (or the kill's); the verdict's is the root-cause record's time
(a rank killed under srun records none: then the job's final state's). Written to
benchmarks/results/doctor-verdicts-<cluster>.json.

    python benchmarks/doctor_verdicts.py [--cluster local|slurm --repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests/faults.py

from common import write_result  # noqa: E402 - benchmarks/common.py
from hpcdl.lifecycle.job import Job  # noqa: E402
from hpcdl.store.files import FAILURE, FAILURES, FINAL  # noqa: E402
from hpcdl.data.digits import digits_folder  # noqa: E402
from tests.faults import (MPI_TRAINER, MPIRUN_HERE, cli, heartbeat_of, mpirun_export, submit, wait_for,  # noqa: E402
                          write_faults)

MPI_FAULTS = [*MPI_TRAINER, "data.root={digits}", "cluster.collective_timeout_s=60",
              mpirun_export("FAULT_NAP_S", "FAULT_RANK")]
FAULTS = {  # name: (overrides, the rank at fault, how the fault comes, whether it runs on 4 ranks)
    "exception": (["entry=faults:raise_on_rank_1", "cluster.collective_timeout_s=10"], 1, "printed", True),
    "kill -9": (["entry=faults:steps_forever"], 2, "kill", True),
    "hang": (["entry=faults:steps_forever", "cluster.hang_timeout_s=5", "cluster.collective_timeout_s=120",
              "cluster.export=[FAULT_NAP_S]"], 2, "printed", True),
    "receive never sent": (["entry=faults:recv_on_rank_2", "cluster.hang_timeout_s=5",
                            "cluster.collective_timeout_s=120"], 2, "printed", True),
    "script": (["script=failing_script.py", "cluster.collective_timeout_s=10"], 1, "printed", True),
    "mpi exception": ([*MPI_FAULTS, "model._target_=faults.RaisingNet"], 1, "printed", False),
    "mpi hang": ([*MPI_FAULTS, "model._target_=faults.NappingNet"], 1, "printed", False),
}
LOCAL_ONLY = ("mpi exception", "mpi hang")
"""mpirun of the test cluster's nodes would need its own network settings (tests/test_slurm.py's)."""


def _fault_time(job: Job, rank: int, timeout: float = 240) -> float:
    """The time the faulty rank printed ('fault at T') just before its fault."""
    found: list[str] = []
    wait_for(lambda: bool(found.extend(re.findall(r"fault at ([\d.]+)", job.logs(rank))) or found), timeout,
             "the fault was printed")
    return float(found[0])


def one_run(user: Path, store: Path, fault: str, cluster: list[str], digits: Path) -> dict:
    """Inject ``fault`` once; whether jobs why named the right rank and host, and the verdict's delay."""
    overrides, rank, how, four_ranks = FAULTS[fault]
    overrides = [override.format(digits=digits) for override in overrides]
    job_id = submit(user, *overrides, *(cluster if four_ranks else []), "cluster.heartbeat_timeout_s=5",
                    "cluster.time=00:10:00")
    job, folder = Job.attach(job_id), store / job_id
    if how == "kill":
        wait_for(lambda: heartbeat_of(folder, rank).get("steps", 0) > 2, 240, "the rank made steps")
        fault_at = time.time()
        os.kill(heartbeat_of(folder, rank)["pid"], signal.SIGKILL)
    else:
        fault_at = _fault_time(job, rank)
    cli(user, "hpcdl.jobs", "wait", job_id, "--timeout", "300", timeout=360)
    host = heartbeat_of(folder, rank).get("host", "")
    why = cli(user, "hpcdl.jobs", "why", job_id).stdout
    root = next((line for line in why.splitlines() if line.startswith("root cause: ")), "")
    right = root.startswith(f"root cause: rank {rank} on {host} ")
    record = folder / FAILURES / FAILURE.format(rank=rank)
    told_at = json.loads(record.read_text())["time"] if record.is_file() else (folder / FINAL).stat().st_mtime
    return {"fault": fault, "job": job_id, "right": right, "root": root, "delay_s": round(told_at - fault_at, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", choices=["local", "slurm"], default="local")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cluster = ["cluster.tasks_per_node=4"] if args.cluster == "local" else \
        ["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=2", "cluster.mem=1000M"]
    faults = [fault for fault in FAULTS if args.cluster == "local" or fault not in LOCAL_ONLY]
    os.environ.update(MPIRUN_HERE, FAULT_NAP_S="600", FAULT_RANK="1")
    with tempfile.TemporaryDirectory() as scratch:
        store = Path(scratch, "store")
        os.environ["HPCDL_STORE"] = str(store)
        user = write_faults(Path(scratch, "user"))
        digits = digits_folder(Path(scratch, "digits"))
        runs = [one_run(user, store, fault, cluster, digits) for _ in range(args.repeats) for fault in faults]
    by_fault = {fault: {"right": sum(r["right"] for r in runs if r["fault"] == fault),
                        "runs": sum(r["fault"] == fault for r in runs),
                        "delay_s_median": statistics.median(r["delay_s"] for r in runs if r["fault"] == fault),
                        "delay_s_max": max(r["delay_s"] for r in runs if r["fault"] == fault)} for fault in faults}
    result = {"cluster": args.cluster, "repeats": args.repeats,
              "accuracy": sum(r["right"] for r in runs) / len(runs),
              "within_60_s": sum(r["right"] and r["delay_s"] <= 60 for r in runs) / len(runs),
              "by_fault": by_fault, "runs": runs}
    write_result(f"benchmarks/results/doctor-verdicts-{args.cluster}.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
