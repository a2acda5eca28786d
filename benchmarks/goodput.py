"""Goodput under lost jobs: a training job killed (SIGKILL, as a lost node) several times and resumed with
`python -m hpcdl.jobs resume`, against the same job left alone, on the local profile, in one run.

Each interrupted run is killed --kills times, evenly spaced over the uninterrupted run's duration, each time
at least one checkpoint after the last; every kill is followed at once by `jobs resume`. Reported: the wall
time from submit to COMPLETED of both, goodput = uninterrupted / interrupted wall time, the seconds lost per
kill (process start, resume from the newest checkpoint, the work since it done again), and whether the final
weights are bit for bit the uninterrupted run's. Runs alternate; medians and spread are written to benchmarks/results/goodput.json.

    python benchmarks/goodput.py [--epochs 6 --kills 3 --every 10 --repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import write_result  # benchmarks/common.py
from hpcdl.data.digits import digits_folder
from hpcdl.host import signal_session
from hpcdl.lifecycle.job import Job


def _submit(args: argparse.Namespace, root: Path, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", f"data.root={root}", "training.verbose=false",
                           f"training.max_epochs={args.epochs}", "training.mini_batch_size=32",
                           f"training.checkpoint_frequency={args.every}", "training.checkpoint_frequency_unit=iteration",
                           "training.execution_environment=cpu"], env=env, capture_output=True, text=True, check=True)
    return done.stdout.split()[2]


def _iterations(folder: Path) -> list[int]:
    try:
        lines = (folder / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:  # not started training yet
        return []
    return [json.loads(line)["iteration"] for line in lines if '"kind": "iteration"' in line]


def _wait_state(job: Job, states: tuple[str, ...], timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while (state := job.state) not in states:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job.id} still {state}")
        time.sleep(0.1)
    return state


def straight(args: argparse.Namespace, root: Path, env: dict[str, str]) -> tuple[float, Path]:
    start = time.perf_counter()
    job = Job.attach(_submit(args, root, env))
    assert _wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED", job.error()
    return time.perf_counter() - start, job.folder


def interrupted(args: argparse.Namespace, root: Path, env: dict[str, str], span: float) -> tuple[float, int, Path]:
    """Wall time to COMPLETED with --kills SIGKILLs and resumes; how many kills it took."""
    start = time.perf_counter()
    job = Job.attach(_submit(args, root, env))
    kills, floor = 0, 0
    for kill in range(1, args.kills + 1):
        time.sleep(max(0.0, start + kill * span / (args.kills + 1) - time.perf_counter()))
        while job.state == "RUNNING" and max(_iterations(job.folder), default=0) < floor + args.every + 1:
            time.sleep(0.05)  # past a checkpoint newer than the last kill's
        if job.state != "RUNNING":
            break
        before = _iterations(job.folder)
        session = int(str(job.refresh().backend_id).split(":")[0])
        signal_session(session, signal.SIGKILL)  # a lost node: no checkpoint, no clean-up
        _wait_state(job, ("FAILED", "LOST", "COMPLETED"))
        if job.state == "COMPLETED":
            break
        subprocess.run([sys.executable, "-m", "hpcdl.jobs", "resume", job.id], env=env, check=True,
                       capture_output=True)
        kills, floor = kills + 1, before[-1] if before else 0
    assert _wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED", job.error()
    return time.perf_counter() - start, kills, job.folder


def same_weights(a: Path, b: Path) -> bool:
    x, y = (torch.load(p / "model.pt", weights_only=True) for p in (a, b))
    return all(torch.equal(x[k], y[k]) for k in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every this many iterations")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/goodput.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcdl-goodput-"))
    root = digits_folder(work / "digits")
    os.environ["HPCDL_STORE"] = str(work / "store")  # this process attaches to the jobs too
    env = dict(os.environ)
    walls: dict[str, list[float]] = {"straight_s": [], "interrupted_s": []}
    kills, exact = [], []
    for repeat in range(args.repeats):
        reference = None
        for kind in (("straight", "interrupted") if repeat % 2 == 0 else ("interrupted", "straight")):
            if kind == "straight":
                wall, reference_folder = straight(args, root, env)
                walls["straight_s"].append(wall)
                reference = reference_folder
            else:
                span = statistics.median(walls["straight_s"]) if walls["straight_s"] else 30.0
                wall, killed, folder = interrupted(args, root, env, span)
                walls["interrupted_s"].append(wall)
                kills.append(killed)
                interrupted_folder = folder
            print(kind, {k: round(v[-1], 2) for k, v in walls.items() if v}, flush=True)
        exact.append(same_weights(reference, interrupted_folder))
    result = {"benchmark": "goodput", "epochs": args.epochs, "kills": args.kills, "checkpoint_every": args.every,
              **{k: {"median": statistics.median(v), "best": min(v), "spread": max(v) - min(v), "runs": v}
                 for k, v in walls.items()},
              "kills_made": kills, "final_weights_bit_identical": exact}
    result["goodput"] = result["straight_s"]["median"] / result["interrupted_s"]["median"]
    result["lost_per_kill_s"] = (result["interrupted_s"]["median"] - result["straight_s"]["median"]) / args.kills
    write_result(args.out, result)
    print(f"straight {result['straight_s']['median']:.2f} s, interrupted {result['interrupted_s']['median']:.2f} s "
          f"with kills {kills}: goodput {result['goodput']:.3f}, {result['lost_per_kill_s']:.2f} s lost per kill; "
          f"final weights identical {exact}")


if __name__ == "__main__":
    main()
