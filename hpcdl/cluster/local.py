"""The local backend: a job is a detached process on this machine that outlives the submitting shell.

Its state comes from the job's own status file and from whether its process
still runs. The job's id names the process, its start time (so a reused pid is
not mistaken for it) and the host key (so that only the host, boot and PID
namespace that run it judge it): 'PID:START_TICKS@HOST_KEY'. Cancelling ends
the job's whole session: its launcher, every rank and their children.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

from hpcdl.errors import ConfigError, HpcdlError, SubmissionError
from hpcdl.host import end_job_tree, host_key, is_running, process_id
from hpcdl.cluster import WORKER
from hpcdl.config import ClusterConfig
from hpcdl.plan import JobPlan
from hpcdl.store.files import LOGS, RUNNER_LOG, rank_log, stream_log
from hpcdl.store.folders import JobRecord
from hpcdl.store.states import RUNNING, TIMEOUT
from hpcdl.store.sweeps import runs_under_runner

KILL_AFTER_S = 10.0


def _process(record: JobRecord) -> str:
    """The job's process as ``process_id`` names it; ids of older versions lack the host key, and are
    taken as this host's only when the job was submitted from a host of this name."""
    backend_id = record.backend_id or ""
    if "@" in backend_id:
        return backend_id
    same_host = record.manifest.get("submitted_from", {}).get("host") == socket.gethostname()
    return f"{backend_id}@{host_key() if same_host else '?'}"


class LocalBackend:
    """Detached background processes, one per job."""

    name = "local"
    scheduler = "this machine"
    starts_ranks = True
    stop_state = TIMEOUT  # a local job's stop signal is the warning before its own time limit
    sweep_runner = True
    runs_here = True

    def check_profile(self, profile: ClusterConfig) -> None:
        """ConfigError for a scheduler's settings, which nothing here would honour, and for several nodes."""
        for name in ("partition", "account", "qos", "constraint"):
            if getattr(profile, name) is not None:
                raise ConfigError(f"cluster.{name}: a Slurm setting, but cluster.backend={self.name}")
        if profile.nodes != 1:
            raise ConfigError(f"cluster.nodes: must be 1 with backend={self.name}, got {profile.nodes}")
        if profile.pool is not None:
            raise ConfigError(f"cluster.pool: backend={self.name} holds no pools (a job here starts at once)")

    def check(self, plan: JobPlan, dry_run: bool = False) -> Optional[str]:
        """Nothing to ask a scheduler: the profile's checks are enough."""
        self.check_profile(plan.cluster)
        return None

    def _command(self, plan: JobPlan, folder: Path) -> list[str]:
        python = plan.cluster.python
        return [os.path.expanduser(python or sys.executable), "-u", "-m", WORKER, str(folder)]

    def _environment(self, plan: JobPlan) -> dict[str, str]:
        # the GPUs this shell may use are the local job's too (on Slurm, the allocation decides)
        copied = [*plan.exported, *plan.cluster.secrets, "CUDA_VISIBLE_DEVICES"]
        return {**{k: os.environ[k] for k in copied if k in os.environ}, **plan.environment,
                "PYTHONUNBUFFERED": "1"}

    def preview(self, plan: JobPlan, folder: Path) -> str:
        """The command and environment the job would start with."""
        env = self._environment(plan)
        lines = [f"# local job {plan.name!r}: a detached process on this machine", "# environment"]
        lines += [f"{k}=<secret: this shell's value, never written>" if k in plan.cluster.secrets
                  else f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        lines += ["# command", shlex.join(self._command(plan, folder))]
        return "\n".join(lines) + "\n"

    def submit(self, plan: JobPlan, folder: Path) -> str:
        """Start the job in a session of its own; returns 'PID:START_TICKS@HOST_KEY'."""
        logs = folder / LOGS
        logs.mkdir(mode=0o700, exist_ok=True)
        # cwd: functions pickled by reference import from the submitting folder, as sbatch jobs do
        with open(logs / stream_log("stdout"), "ab") as out, open(logs / stream_log("stderr"), "ab") as err:
            process = subprocess.Popen(self._command(plan, folder), cwd=os.getcwd(),
                                       env=self._environment(plan), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=err, start_new_session=True)
        started = process_id(process.pid)
        if started is None:  # not even its start time could be read: it failed at once
            raise SubmissionError(f"the job's process exited at once with code {process.wait()}; "
                                  f"see {logs / stream_log('stderr')}")
        return started

    def submit_sweep(self, sweep: Path, points: list[tuple[JobPlan, Path]], parallelism: Optional[int],
                     points_per_task: int) -> tuple[list[str], str]:
        """Start one detached runner for the points (hpcdl.sweep.runner): several at once, in the background."""
        first = points[0][0]
        cpus = max(plan.cluster.cpus_per_task or 1 for plan, _ in points) * max(p.world_size for p, _ in points)
        command = [os.path.expanduser(first.cluster.python or sys.executable), "-u", "-m", "hpcdl.sweep.runner",
                   str(sweep), *(folder.name for _, folder in points), "--cpus-per-point", str(cpus)]
        if parallelism is not None:
            command += ["--limit", str(parallelism)]
        logs = sweep / LOGS
        logs.mkdir(mode=0o700, exist_ok=True)
        with open(logs / RUNNER_LOG, "ab") as out:
            process = subprocess.Popen(command, cwd=os.getcwd(), env=self._environment(first),
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        started = process_id(process.pid)
        if started is None:
            raise SubmissionError(f"the sweep's runner exited at once with code {process.wait()}; "
                                  f"see {logs / RUNNER_LOG}")
        return [started] * len(points), started

    def live_states(self, records: list[JobRecord]) -> Optional[dict[str, Optional[str]]]:
        """RUNNING for each job whose process still runs, None for another host's; absent ones have ended."""
        live: dict[str, Optional[str]] = {}
        asked: dict[str, Optional[bool]] = {}  # a sweep's points share its runner: asked once
        for record in records:
            process = _process(record)
            running = asked[process] if process in asked else asked.setdefault(process, is_running(process))
            if running is not False:
                live[record.id] = RUNNING if running else None
        return live

    def cancel(self, record: JobRecord) -> None:
        """TERM every process of the job (its session and every descendant, detached ones too), KILL those still
        there after KILL_AFTER_S."""
        if runs_under_runner(record):  # its runner ends it on seeing CANCELLED; its sweep's other points go on
            return
        process = _process(record)
        running = is_running(process)
        if running is None:
            raise HpcdlError(f"job {record.id} runs on host {process.partition('@')[2].split('/')[0]!r} "
                             "(or in another PID namespace): cancel it there")
        if not running:
            return
        end_job_tree(int(process.split(":")[0]), KILL_AFTER_S)  # it leads its own session (start_new_session)

    def log_path(self, record: JobRecord, rank: int, stream: str) -> Path:
        """Rank ``rank``'s stdout or stderr: its own file when the job has several ranks (hpcdl's launcher
        or mpirun started them), else the job's stdout.log or stderr.log."""
        plan = record.plan
        if plan.get("world_size", 1) > 1:
            return rank_log(record.folder / LOGS, rank, stream)
        return record.folder / LOGS / stream_log(stream)

    def display_id(self, record: JobRecord) -> str:
        """'PID@HOSTNAME' of the job's process: its start time and the host's boot and namespace left out."""
        number, _, where = (record.backend_id or "").partition("@")
        return f"{number.split(':')[0]}@{where.split('/')[0]}" if where else number.split(":")[0]

    def describe(self, backend_id: str) -> str:
        """'process PID'."""
        return f"process {backend_id.split(':')[0]}"

    def describe_sweep(self, backend_id: str) -> str:
        """The runner on this machine."""
        return f"a background runner on {os.uname().nodename}"

    def start_pool(self, profile: ClusterConfig, folder: Path, name: str, idle_timeout_s: int) -> str:
        """None here: a local job starts at once."""
        raise ConfigError(f"cluster={profile.name}: backend={self.name} holds no pools (a job here starts at once)")

    def pool_states(self, ids: list[str]) -> dict[str, tuple[str, Optional[int]]]:
        """No pools: none known."""
        return {}

    def stop_pool(self, backend_id: str) -> None:
        """No pools: nothing to stop."""

    def survey(self) -> list[str]:
        """This machine: its CPUs and GPUs."""
        from hpcdl.gpus import cpu_count, gpu_count

        return [f"this machine ({os.uname().nodename}): {cpu_count()} CPUs, {gpu_count()} GPU(s)"]

    def requeue(self, job: str) -> Optional[str]:
        """Never: a local job has no scheduler to queue it again (its worker is given no job id)."""
        return "a local job is not queued again"

    def requeue_excluding(self, job: str, node: str) -> Optional[str]:
        """Never: a local job has this machine alone."""
        return f"a local job cannot move off {node}"

    def this_run(self) -> int:
        """Always the first: a local job is never queued again (``jobs resume`` starts a new job)."""
        return 0

    def this_job(self) -> Optional[str]:
        """None: the worker is given no scheduler's id."""
        return None

    def requeued_since_start(self) -> bool:
        """Never."""
        return False

    def how_run_ended(self, run: int) -> Optional[str]:
        """None: there is no scheduler's account of an earlier run."""
        return None

    def left_out(self, root: Path) -> dict[str, str]:
        """None: a local job has this machine alone."""
        return {}

    def task_cpus(self) -> Optional[int]:
        """None: the affinity mask tells a local job's CPUs."""
        return None

    def single_task_environment(self, env: dict[str, str]) -> dict[str, str]:
        """``env``: no launcher variables of a task to take out."""
        return dict(env)

BACKEND = LocalBackend
