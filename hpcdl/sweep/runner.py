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
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from hpcdl.cluster import WORKER, Backend, backend_for
from hpcdl.distributed.restarts import JobRuns, is_earlier_runs_failure, record_failure
from hpcdl.distributed.env import free_port
from hpcdl.errors import HpcdlError
from hpcdl.store.files import FINAL, LOGS, MANIFEST, STATUS, stream_log
from hpcdl.store.folders import read_json
from hpcdl.store.states import CANCELLED, REQUEUED
from hpcdl.store.sweeps import handed_over

POLL_S = 0.2
KILL_AFTER_S = 10.0


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (or by index)."""
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:
        return [g for g in named.split(",") if g.strip()]
    from hpcdl.gpus import gpu_table

    return [str(row.index) for row in gpu_table()]


def slot_plan(cpus: int, gpus: list[str], cpus_per_point: int, limit: Optional[int]) -> tuple[int, int]:
    """(points at once, threads per point): one per GPU (a multi-rank point takes one per rank), else one per
    ``cpus_per_point`` CPUs; ``limit`` caps."""
    slots = len(gpus) if gpus else max(1, cpus // max(1, cpus_per_point))
    if limit is not None:
        slots = max(1, min(slots, limit))
    return slots, max(1, cpus // slots)


class Runner:
    """The points of one runner and the processes that run them."""

    def __init__(self, folders: list[Path], slots: int, threads: int, gpus: list[str], packed: bool,
                 backend: Backend) -> None:
        self.pending = list(folders)
        self.slots, self.threads, self.packed, self.backend = slots, threads, packed, backend
        self.free_gpus = list(gpus)
        self.running: dict[subprocess.Popen, tuple[Path, list[str]]] = {}
        self.stopping = False

    def forward(self, signum: int, _frame: object = None) -> None:
        """Pass a signal to every running point; TERM also ends the runner once they have gone."""
        if signum == signal.SIGTERM:
            self.stopping = True
            self.pending.clear()
        for process in self.running:
            _signal_group(process, signum)

    def _environment(self, plan: dict[str, Any], gpus: list[str]) -> dict[str, str]:
        env = dict(os.environ)
        env.update({k: str(v) for k, v in (plan.get("environment") or {}).items()})
        env.update(OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        if self.packed:  # one single-rank job per point inside the task's allocation
            env = self.backend.single_task_environment(env)
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        return env

    def _try_start(self, folder: Path) -> bool:
        """Start the point if the GPUs it needs (one per rank, when there are GPUs) are free; False if not."""
        plan = (read_json(folder / MANIFEST) or {}).get("plan", {})
        need = max(1, int(plan.get("world_size", 1))) if self.free_gpus or self._gpus_taken() else 0
        if need > len(self.free_gpus):
            return False
        gpus, self.free_gpus = self.free_gpus[:need], self.free_gpus[need:]
        logs = folder / LOGS
        logs.mkdir(mode=0o700, exist_ok=True)
        with open(logs / stream_log("stdout"), "ab") as out, open(logs / stream_log("stderr"), "ab") as err:
            process = subprocess.Popen([sys.executable, "-u", "-m", WORKER, str(folder)],
                                       env=self._environment(plan, gpus), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=err, preexec_fn=os.setpgrp)  # own group, same session
        self.running[process] = (folder, gpus)
        return True

    def _gpus_taken(self) -> bool:
        return any(gpus for _, gpus in self.running.values())

    def _end_cancelled(self) -> None:
        for process, (folder, _) in self.running.items():
            if process.poll() is None and _final_state(folder) == CANCELLED:
                _end_group(process)

    def _reap(self) -> None:
        """Free the GPUs of points that ended; one that ended without recording how is FAILED (unless the scheduler
        has queued the task again meanwhile: its next run goes on)."""
        for process in [p for p in self.running if p.poll() is not None]:
            folder, gpus = self.running.pop(process)
            self.free_gpus += gpus
            if self.stopping:  # ended by the scheduler (scancel, time limit): the listing asks it how
                continue
            if _final_state(folder) is None and (read_json(folder / STATUS) or {}).get("state") != REQUEUED:
                how = f"killed by signal {-process.returncode}" if process.returncode < 0 \
                    else f"exited with code {process.returncode}"
                with contextlib.suppress(OSError, HpcdlError):
                    record_failure(folder, self.backend, f"its process {how} without recording a result")

    def run(self) -> int:
        """Run every point; 0 when each ended (how each went is in its own record). Points still running
        when the runner itself fails are ended with it."""
        try:
            while self.pending or self.running:
                self._end_cancelled()
                self._reap()
                while self.pending and len(self.running) < self.slots and not self.stopping:
                    handed = handed_over(read_json(self.pending[0] / MANIFEST) or {}, self.pending[0].parent)
                    if not _to_run(self.pending[0], self.backend) or handed is False:  # cancelled before it started, ended
                        self.pending.pop(0)  # in an earlier run, or its submission was interrupted
                    elif handed is None:  # its submitter has not recorded the scheduler's id yet
                        break
                    elif self._try_start(self.pending[0]):
                        self.pending.pop(0)
                    else:
                        break
                time.sleep(POLL_S)
        finally:
            for process in self.running:
                if process.poll() is None:
                    _end_group(process)
        return 0


def _end_group(process: subprocess.Popen) -> None:
    """TERM a point's process group, KILL it after KILL_AFTER_S."""
    _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + KILL_AFTER_S
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
    _signal_group(process, signal.SIGKILL)


def _final(folder: Path) -> Optional[dict[str, Any]]:
    try:
        final = read_json(folder / FINAL)
    except (OSError, ValueError, HpcdlError):  # unreadable (or no longer safe to read): not final here
        return None
    return final if isinstance(final, dict) else None


def _final_state(folder: Path) -> Optional[str]:
    final = _final(folder)
    return final.get("state") if final is not None else None


def _to_run(folder: Path, runs: JobRuns) -> bool:
    """Whether a waiting point is to run: it has no final state, or only an earlier run's failure with no error
    of its own (its process ended without a result, as a run the scheduler ends leaves it), which its worker
    withdraws. A point that failed with an error stays FAILED."""
    final = _final(folder)
    return final is None or (is_earlier_runs_failure(final, runs) and not final.get("traceback"))


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
    backend = backend_for((read_json(sweep / MANIFEST) or {})["plan"]["cluster"]["backend"])
    cpus = (backend.task_cpus() if args.packed else None) or len(os.sched_getaffinity(0))
    gpus = visible_gpus()
    slots, threads = slot_plan(cpus, gpus, args.cpus_per_point, args.limit)
    runner = Runner([sweep.parent / p for p in args.points], slots, threads, gpus, args.packed, backend)
    for signum in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):
        signal.signal(signum, runner.forward)
    return runner.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
