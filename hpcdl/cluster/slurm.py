"""The Slurm backend: sbatch through submitit; states from one squeue and one sacct call per listing.

The sbatch script is a pure function of the profile (``sbatch_script``), the
text that dry_run prints and that submitit submits. Only allow-listed
variables travel with the job (``--export``), never the whole environment.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from hpcdl.cluster.environment import exported_environment, job_environment
from hpcdl.config.cluster import ClusterConfig, time_limit_minutes
from hpcdl.errors import ConfigError, SubmissionError
from hpcdl.store.folders import JobRecord

ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD")
QUERY_TIMEOUT_S = 30


def _run(command: list[str]) -> str:
    """Run a Slurm client command; SubmissionError with its stderr when it fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S,
                              env=_submission_environment())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SubmissionError(f"{command[0]} failed: {e}") from e
    if done.returncode != 0:
        raise SubmissionError(f"{shlex.join(command)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _submission_environment() -> dict[str, str]:
    """This environment without the SLURM_* variables of a job we may be running in (keeps SLURM_CONF)."""
    return {k: v for k, v in os.environ.items()
            if not (k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SUBMITIT_")) and k != "SLURM_CONF")}


@contextlib.contextmanager
def _outside_any_job() -> Iterator[None]:
    """Submit as from a login shell even inside a job (submitit#1782): hide inherited SLURM_*."""
    saved, cleaned = dict(os.environ), _submission_environment()
    os.environ.clear()
    os.environ.update(cleaned)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass(frozen=True)
class Partition:
    """What sinfo says of one partition."""

    name: str
    default: bool
    nodes: int
    cpus_per_node: int
    gpus_per_node: int
    time_limit_minutes: Optional[int]


def _gpus(gres: str) -> int:
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def partitions() -> dict[str, Partition]:
    """The cluster's partitions from one sinfo call (the largest node of each)."""
    found: dict[str, Partition] = {}
    for line in _run(["sinfo", "-h", "-N", "-o", "%P|%c|%G|%l"]).splitlines():
        name, cpus, gres, limit = line.strip().split("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        minutes = None if limit in ("infinite", "UNLIMITED") else time_limit_minutes(limit)
        old = found.get(name)
        found[name] = Partition(name, default, (old.nodes if old else 0) + 1,
                                max(int(cpus.rstrip("+")), old.cpus_per_node if old else 0),
                                max(_gpus(gres), old.gpus_per_node if old else 0), minutes)
    return found


def sbatch_parameters(profile: ClusterConfig, name: str, mpi: bool = False) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for ``profile``: the whole schema of the script.

    With ``mpi`` the ranks are started by the profile's mpirun inside the allocation instead of srun.
    """
    exported = sorted(exported_environment(profile))
    setup = list(profile.setup)
    setup += [f"export {key}={shlex.quote(value)}" for key, value in sorted(job_environment(profile).items())]
    setup.append("export SLURM_EXPORT_ENV=ALL  # srun passes this script's environment to every rank")
    parameters: dict[str, Any] = {
        "job_name": name, "time": profile.time_minutes, "nodes": profile.nodes,
        "ntasks_per_node": profile.tasks_per_node, "signal_delay_s": profile.signal_delay_s,
        "setup": setup, "srun_args": ["--kill-on-bad-exit=1"], "use_srun": not mpi,
        "additional_parameters": {"export": ",".join(exported) or "NONE", **profile.sbatch_extra},
    }
    optional = {"partition": profile.partition, "account": profile.account, "qos": profile.qos,
                "cpus_per_task": profile.cpus_per_task, "mem": profile.mem, "constraint": profile.constraint,
                "gpus_per_node": profile.gpus_per_node or None}
    parameters.update({k: v for k, v in optional.items() if v is not None})
    return parameters


def _python(profile: ClusterConfig, mpi: bool = False) -> str:
    """The job's python, behind the profile's mpirun when MPI starts the ranks."""
    python = shlex.quote(os.path.expanduser(profile.python)) if profile.python else shlex.quote(sys.executable)
    return f"{shlex.join(profile.mpirun)} {python}" if mpi else python


def sbatch_script(profile: ClusterConfig, folder: Path, name: str, mpi: bool = False) -> str:
    """The exact sbatch script submitit writes for a job in ``folder``."""
    from submitit.slurm.slurm import _make_sbatch_string

    logs = folder / "slurm"
    command = " ".join([_python(profile, mpi), "-u -m submitit.core._submit", shlex.quote(str(logs))])
    return _make_sbatch_string(command=command, folder=logs, **sbatch_parameters(profile, name, mpi))


class SlurmBackend:
    """sbatch through submitit's SlurmExecutor."""

    name = "slurm"

    def check(self, profile: ClusterConfig) -> None:
        """Compare the request with what the cluster has; ConfigError naming the option if it cannot run."""
        found = partitions()
        if not found:
            raise SubmissionError("sinfo lists no partition: is this a Slurm cluster?")
        if profile.partition is None:
            default = [p for p in found.values() if p.default]
            if not default:
                raise ConfigError(f"cluster.partition: this cluster has no default partition; choose one of "
                                  f"{', '.join(sorted(found))}")
            partition = default[0]
        elif profile.partition not in found:
            raise ConfigError(f"cluster.partition: {profile.partition!r} is not a partition of this cluster; "
                              f"choose one of {', '.join(sorted(found))}")
        else:
            partition = found[profile.partition]
        where = f"partition {partition.name}"
        if profile.nodes > partition.nodes:
            raise ConfigError(f"cluster.nodes={profile.nodes}: {where} has {partition.nodes} node(s)")
        if profile.gpus_per_node > partition.gpus_per_node:
            raise ConfigError(f"cluster.gpus_per_node={profile.gpus_per_node}: the nodes of {where} offer at "
                              f"most {partition.gpus_per_node} GPU(s)")
        cpus = profile.tasks_per_node * (profile.cpus_per_task or 1)
        if cpus > partition.cpus_per_node:
            raise ConfigError(f"cluster.tasks_per_node x cpus_per_task = {cpus}: the nodes of {where} have "
                              f"{partition.cpus_per_node} CPUs")
        limit = partition.time_limit_minutes
        if limit is not None and profile.time_minutes > limit:
            raise ConfigError(f"cluster.time={profile.time}: {where} allows at most {limit} minutes")

    def preview(self, profile: ClusterConfig, folder: Path, name: str, mpi: bool = False) -> str:
        """The sbatch script and the variables that travel with the job."""
        env = exported_environment(profile)
        lines = [sbatch_script(profile, folder, name, mpi).rstrip("\n"), "",
                 "# variables copied from the submitting shell (--export allow-list):"]
        lines += [f"#   {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        return "\n".join(lines) + "\n"

    def submit(self, profile: ClusterConfig, folder: Path, name: str, mpi: bool = False) -> str:
        """sbatch the job through submitit; returns Slurm's job id."""
        import submitit

        from hpcdl.worker import run_job

        executor = submitit.SlurmExecutor(folder=folder / "slurm", python=_python(profile, mpi), max_num_timeout=0)
        executor.update_parameters(**sbatch_parameters(profile, name, mpi))
        try:
            with _outside_any_job():
                job = executor.submit(run_job, str(folder))
        except Exception as e:  # submitit raises plain exceptions carrying sbatch's message
            raise SubmissionError(f"sbatch refused the job: {str(e).strip()}") from e
        return str(job.job_id)

    def live_states(self, records: list[JobRecord]) -> Optional[dict[str, str]]:
        """Scheduler states from one squeue call (and one sacct call for jobs squeue no longer shows).

        Returns None when Slurm cannot be asked at all; jobs missing from the answer have ended
        without the scheduler remembering how.
        """
        ids = {r.backend_id: r.id for r in records if r.backend_id}
        try:
            queue = _run(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%T"])
        except SubmissionError:
            return None
        live: dict[str, str] = {}
        for line in queue.splitlines():
            slurm_id, state = line.strip().split("|")
            if slurm_id in ids:
                live[ids[slurm_id]] = state
        gone = [slurm_id for slurm_id, job in ids.items() if job not in live]
        if gone:
            try:
                history = _run(["sacct", "-n", "-P", "-X", "-o", "JobIDRaw,State", "-j", ",".join(gone)])
            except SubmissionError:  # no accounting here: the status files decide
                history = ""
            for line in history.splitlines():
                slurm_id, state = line.strip().split("|")[:2]
                if slurm_id in ids:
                    live[ids[slurm_id]] = state.split()[0]
        return live

    def cancel(self, record: JobRecord) -> None:
        """scancel the job."""
        _run(["scancel", str(record.backend_id)])

    def log_path(self, record: JobRecord, rank: int, stream: str) -> Path:
        """submitit's per-task log file of ``rank``."""
        suffix = "out" if stream == "stdout" else "err"
        return record.folder / "slurm" / f"{record.backend_id}_{rank}_log.{suffix}"
