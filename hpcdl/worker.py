"""The job side: what runs on the node (or the local machine) for a job folder.

``run_job(folder)`` marks the job RUNNING, runs its payload (a built-in
training run, or a function given to ``hpcdl.batch``), writes the result, and
marks it COMPLETED, or FAILED with the traceback before re-raising, so that the
scheduler sees the failure too. Rank 0 alone writes the status.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from hpcdl.store.atomic import atomic_save
from hpcdl.distributed.env import LAUNCHER_RANK_VARIABLES, global_rank
from hpcdl.store.files import FUNCTION, FUNCTION_RESULT, MANIFEST, STATUS
from hpcdl.store.folders import check_owned, read_json, write_status



def _lead_rank(manifest: dict[str, Any]) -> int:
    """The rank that reports the job's state: the first with a WorkerLoad above 0."""
    load = ((manifest.get("config") or {}).get("training") or {}).get("worker_load")
    return next(rank for rank, share in enumerate(load) if share > 0) if load else 0


def _run_payload(folder: Path, manifest: dict[str, Any]) -> None:
    if manifest["kind"] == "train":
        from omegaconf import OmegaConf

        from hpcdl.config.compose import register_configs
        from hpcdl.config import Config
        from hpcdl.train.job import run_training

        register_configs()
        config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), manifest["config"]))
        run_training(config, folder)
        return
    import cloudpickle

    check_owned(folder / FUNCTION)
    with open(folder / FUNCTION, "rb") as f:
        fn, args, kwargs = cloudpickle.load(f)
    result = fn(*args, **kwargs)
    if global_rank() == 0:
        atomic_save(folder / FUNCTION_RESULT, lambda out: cloudpickle.dump(result, out))


def _enforce_local_time_limit(folder: Path, manifest: dict[str, Any]) -> None:
    """Local jobs have no scheduler to end them: at the profile's time limit, record TIMEOUT and exit."""
    from hpcdl.config.cluster import time_limit_seconds

    def expire() -> None:
        write_status(folder, "TIMEOUT", ended_at=time.time(), reason=f"time limit {cluster['time']} reached")
        os._exit(124)  # like timeout(1); nothing of the job's may run on

    cluster = manifest["cluster"]
    timer = threading.Timer(time_limit_seconds(cluster["time"]), expire)
    timer.daemon = True
    timer.start()


def _launch_ranks(path: Path, manifest: dict[str, Any]) -> None:
    """Local multi-worker jobs: this process starts one rank per worker and names the one that fails."""
    from hpcdl.distributed.launch import launch_local

    world = manifest["world_size"]
    rank_command = [sys.executable, "-u", "-m", "hpcdl.worker", str(path)]
    if manifest.get("mpi"):
        code = subprocess.call([*manifest["cluster"]["mpirun"], "-n", str(world), *rank_command])
        failure = f"mpirun -n {world} exited with code {code}"
    else:
        code, failure = launch_local(rank_command, world)
    if code != 0:
        own = read_json(path / STATUS) or {}
        write_status(path, "FAILED", ended_at=time.time(),
                     reason=failure + (f"; {own['reason']}" if own.get("reason") else ""))
        sys.exit(1)


def run_job(folder: str) -> None:
    """Run the job stored in ``folder``; its status file says how it went."""
    path = Path(folder)
    check_owned(path)
    manifest = read_json(path / MANIFEST)
    if manifest is None:
        raise FileNotFoundError(f"{path / MANIFEST}: no manifest; not a job folder")
    os.environ["HPCDL_JOB_FOLDER"] = str(path)
    os.environ.setdefault("HPCDL_COLLECTIVE_TIMEOUT_S", str(manifest["cluster"].get("collective_timeout_s", 300)))
    launched_as_rank = any(name in os.environ for name in LAUNCHER_RANK_VARIABLES)
    first_process = manifest["cluster"]["backend"] == "local" and not launched_as_rank
    if manifest.get("world_size", 1) > 1 and first_process:
        _enforce_local_time_limit(path, manifest)
        _launch_ranks(path, manifest)
        return
    lead = global_rank() == _lead_rank(manifest)
    if first_process:
        _enforce_local_time_limit(path, manifest)
    if lead:
        write_status(path, "RUNNING", started_at=time.time(), host=socket.gethostname(), pid=os.getpid(),
                     slurm_job_id=os.environ.get("SLURM_JOB_ID"),
                     restarts=int(os.environ.get("SLURM_RESTART_COUNT", "0")))
    try:
        _run_payload(path, manifest)
    except BaseException as e:
        write_status(path, "FAILED", ended_at=time.time(), rank=global_rank(),  # whichever rank fails says why
                     reason=f"rank {global_rank()}: {type(e).__name__}: {e}", traceback=traceback.format_exc())
        raise
    if lead:
        write_status(path, "COMPLETED", ended_at=time.time())


if __name__ == "__main__":
    run_job(sys.argv[1])
