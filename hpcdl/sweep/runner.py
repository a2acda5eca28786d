"""python -m hpcdl.sweep.runner SWEEP_FOLDER POINT... [--packed]: run points several at once (MATLAB's parfeval).

It runs the points of a local sweep in the background, and the points packed into one Slurm array task
(``points_per_task``) inside that task's allocation. At most ``slots`` points run at once: one per GPU when
there are GPUs (each point sees only its own: ``CUDA_VISIBLE_DEVICES``), else one per CPU slot, with the
CPUs shared out (``OMP_NUM_THREADS``). Each point runs as its own job (``python -m hpcdl.worker``) in a
process group of its own, with its logs in its folder; a point cancelled with ``jobs cancel`` (CANCELLED in
its final.json) is ended here, and the stop signal and TERM reach every running point.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from hpcdl.distributed.env import free_port
from hpcdl.store.files import FINAL, LOGS, MANIFEST
from hpcdl.store.folders import read_json

POLL_S = 0.2
KILL_AFTER_S = 10.0
SLURM_TASK_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
                        "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS",
                        "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEPID", "SLURM_STEP_ID")


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (or by index)."""
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:
        return [g for g in named.split(",") if g.strip()]
    from hpcdl.gpus import gpu_table

    return [str(row.index) for row in gpu_table()]


def slot_plan(cpus: int, gpus: list[str], cpus_per_point: int, limit: Optional[int]) -> tuple[int, int]:
    """(points at once, threads per point): one per GPU, else one per ``cpus_per_point`` CPUs; ``limit`` caps."""
    slots = len(gpus) if gpus else max(1, cpus // max(1, cpus_per_point))
    if limit is not None:
        slots = max(1, min(slots, limit))
    return slots, max(1, cpus // slots)


class Runner:
    """The points of one runner and the processes that run them."""

    def __init__(self, folders: list[Path], slots: int, threads: int, gpus: list[str], packed: bool) -> None:
        self.pending = list(folders)
        self.slots, self.threads, self.packed = slots, threads, packed
        self.free_gpus = list(gpus[:slots]) if gpus else []
        self.running: dict[subprocess.Popen, tuple[Path, Optional[str]]] = {}
        self.stopping = False

    def forward(self, signum: int, _frame: object = None) -> None:
        """Pass a signal to every running point; TERM also ends the runner once they have gone."""
        if signum == signal.SIGTERM:
            self.stopping = True
            self.pending.clear()
        for process in self.running:
            _signal_group(process, signum)

    def _environment(self, folder: Path, gpu: Optional[str]) -> dict[str, str]:
        env = dict(os.environ)
        plan = (read_json(folder / MANIFEST) or {}).get("plan", {})
        env.update({k: str(v) for k, v in (plan.get("environment") or {}).items()})
        env.update(OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        if self.packed:  # one single-rank job per point inside the task's allocation
            for name in SLURM_TASK_VARIABLES:
                env.pop(name, None)
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        return env

    def _start(self, folder: Path) -> None:
        gpu = self.free_gpus.pop(0) if self.free_gpus else None
        logs = folder / LOGS
        logs.mkdir(mode=0o700, exist_ok=True)
        with open(logs / "stdout.log", "ab") as out, open(logs / "stderr.log", "ab") as err:
            process = subprocess.Popen([sys.executable, "-u", "-m", "hpcdl.worker", str(folder)],
                                       env=self._environment(folder, gpu), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=err, process_group=0)
        self.running[process] = (folder, gpu)

    def _end_cancelled(self) -> None:
        for process, (folder, _) in self.running.items():
            final = _final_state(folder)
            if final == "CANCELLED" and process.poll() is None:
                _signal_group(process, signal.SIGTERM)
                deadline = time.monotonic() + KILL_AFTER_S
                while process.poll() is None and time.monotonic() < deadline:
                    time.sleep(POLL_S)
                _signal_group(process, signal.SIGKILL)

    def run(self) -> int:
        """Run every point; 0 when each ended (how each went is in its own record)."""
        while self.pending or self.running:
            self._end_cancelled()
            for process in [p for p in self.running if p.poll() is not None]:
                _, gpu = self.running.pop(process)
                if gpu is not None:
                    self.free_gpus.append(gpu)
            while self.pending and len(self.running) < self.slots and not self.stopping:
                folder = self.pending.pop(0)
                if _final_state(folder) is None:  # a point cancelled before it started never starts
                    self._start(folder)
            time.sleep(POLL_S)
        return 0


def _final_state(folder: Path) -> Optional[str]:
    try:
        final = read_json(folder / FINAL)
    except (OSError, ValueError):
        return None
    return final.get("state") if isinstance(final, dict) else None


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcdl.sweep.runner", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="the sweep's folder in the store")
    parser.add_argument("points", nargs="+", help="the points' ids (folders beside the sweep's)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many points at once")
    parser.add_argument("--cpus-per-point", type=int, default=1)
    parser.add_argument("--packed", action="store_true",
                        help="the points of one Slurm array task, run inside its allocation")
    args = parser.parse_args(argv)
    sweep = args.sweep.resolve()
    cpus = int(os.environ["SLURM_CPUS_ON_NODE"]) if args.packed else len(os.sched_getaffinity(0))
    gpus = visible_gpus()
    slots, threads = slot_plan(cpus, gpus, args.cpus_per_point, args.limit)
    runner = Runner([sweep.parent / p for p in args.points], slots, threads, gpus, packed=args.packed)
    for signum in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):
        signal.signal(signum, runner.forward)
    return runner.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
