"""The Slurm backend: sbatch through submitit; states from one squeue and one sacct call per listing.

The sbatch script is a pure function of the profile (``sbatch_script``), the
text that dry_run prints and that submitit submits. Only allow-listed
variables travel with the job (``--export``), never the whole environment.
"""

from __future__ import annotations

import contextlib
import datetime
import getpass
import importlib
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hpcdl.cluster import WORKER, slurm_pool
from hpcdl.cluster.slurm_commands import QUERY_TIMEOUT_S, ask, is_queued, outside_any_job, run_command
from hpcdl.cluster.slurm_pool import cancel_step, pool_job, step_command, step_of, step_states, submit_step
from hpcdl.config import ClusterConfig
from hpcdl.distributed.env import local_env
from hpcdl.config.cluster import time_limit_minutes
from hpcdl.errors import ConfigError, SubmissionError
from hpcdl.plan import JobPlan
from hpcdl.store.badnodes import remembered
from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.files import LOGS, MANIFEST, SLURM_FILES, STEP_LOG, stream_log
from hpcdl.store.folders import JobRecord, read_json
from hpcdl.store.states import NODE_FAIL, PENDING, STOPPED
from hpcdl.store.sweeps import runs_under_runner
from hpcdl.train.stopping import STOP_SIGNAL

QUERY_TIMEOUT_DRY_RUN_S = 5
CANCEL_WAIT_S = 60.0
TASK_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
                  "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
                  "SLURM_STEPID", "SLURM_STEP_ID")
"""srun's variables of one task of a step."""


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


def partitions(timeout_s: float = QUERY_TIMEOUT_S) -> dict[str, Partition]:
    """The cluster's partitions from one sinfo call (the largest node of each)."""
    found: dict[str, Partition] = {}
    for line in run_command(["sinfo", "-h", "-N", "-o", "%P|%c|%G|%l"], timeout_s).splitlines():
        name, cpus, gres, limit = line.strip().split("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        minutes = None if limit in ("infinite", "UNLIMITED") else time_limit_minutes(limit)
        old = found.get(name)
        found[name] = Partition(name, default, (old.nodes if old else 0) + 1,
                                max(int(cpus.rstrip("+")), old.cpus_per_node if old else 0),
                                max(_gpus(gres), old.gpus_per_node if old else 0), minutes)
    return found


def sbatch_parameters(plan: JobPlan, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for ``plan``: the whole schema of the script; ``exclude``: nodes left
    out (--exclude: they failed a preflight of this user's jobs lately).

    MPI jobs start their ranks with the profile's mpirun inside the allocation instead of srun.
    """
    profile = plan.cluster
    setup = list(profile.setup)
    setup += [f"export {key}={shlex.quote(value)}" for key, value in sorted(plan.environment.items())]
    setup.append("export SLURM_EXPORT_ENV=ALL  # srun passes this script's environment to every rank")
    parameters: dict[str, Any] = {
        "job_name": plan.name, "time": plan.time_limit_minutes, "nodes": profile.nodes,
        "ntasks_per_node": profile.tasks_per_node, "signal_delay_s": profile.signal_delay_s,
        "setup": setup, "srun_args": ["--kill-on-bad-exit=1"], "use_srun": not plan.mpi,
        "additional_parameters": {"export": ",".join([*plan.exported, *profile.secrets]) or "NONE",
                                  **profile.sbatch_extra, **({"exclude": ",".join(exclude)} if exclude else {})},
    }
    optional = {"partition": profile.partition, "account": profile.account, "qos": profile.qos,
                "cpus_per_task": profile.cpus_per_task, "mem": profile.mem, "constraint": profile.constraint,
                "gpus_per_node": profile.gpus_per_node or None}
    parameters.update({k: v for k, v in optional.items() if v is not None})
    return parameters


def _python(plan: JobPlan) -> str:
    """The job's python, behind the profile's mpirun when MPI starts the ranks."""
    profile = plan.cluster
    python = shlex.quote(os.path.expanduser(profile.python)) if profile.python else shlex.quote(sys.executable)
    return f"{shlex.join(profile.mpirun)} {python}" if plan.mpi else python


def _stop_signal_forwarded(script: str) -> str:
    """``script`` with its last line, the one that starts the ranks, run in the background of a batch shell
    that hands the stop signal on to it (srun and mpirun pass it to every rank) and waits until it ends.

    ``scancel --signal=USR2 --batch`` and ``sbatch --signal=B:USR2@N`` signal the batch shell alone: bash would
    die of it, ending the job with no checkpoint, and a trap on a command in the foreground runs only once
    the command has ended.
    """
    head, _, start = script.rstrip("\n").rpartition("\n")
    name = STOP_SIGNAL.name.removeprefix("SIG")
    return "\n".join([
        head,
        "hpcdl_ranks=",
        f"trap 'if [ -n \"$hpcdl_ranks\" ]; then kill -s {name} \"$hpcdl_ranks\" 2>/dev/null; "
        f"else hpcdl_early=1; fi' {name}  # the stop signal, sent to this shell alone, goes on to the ranks",
        f"{start} &",
        "hpcdl_ranks=$!",
        f'if [ -n "${{hpcdl_early:-}}" ]; then kill -s {name} "$hpcdl_ranks"; fi',
        "while kill -0 \"$hpcdl_ranks\" 2>/dev/null; do  # wait returns early each time the trap runs",
        '    wait "$hpcdl_ranks"',
        "done",
        'wait "$hpcdl_ranks"  # its exit status, kept by bash after it was reaped',
        "",
    ])


def sbatch_script(plan: JobPlan, folder: Path, exclude: Sequence[str] = ()) -> str:
    """The exact sbatch script of a job in ``folder``: what dry_run prints and what submit hands to sbatch;
    ``exclude``: nodes left out."""
    from submitit.slurm.slurm import _make_sbatch_string

    logs = folder / SLURM_FILES
    command = " ".join([_python(plan), "-u -m submitit.core._submit", shlex.quote(str(logs))])
    return _stop_signal_forwarded(_make_sbatch_string(command=command, folder=logs, **sbatch_parameters(plan, exclude)))


def max_array_size() -> int:
    """The cluster's MaxArraySize (scontrol show config): an array's indices must stay below it."""
    for line in run_command(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return max(1, int(value.strip()))
    return 1001  # Slurm's default


def array_script(tasks: list[list[tuple[JobPlan, Path]]], sweep: Path, parallelism: Optional[int],
                 points_per_task: int, exclude: Sequence[str] = ()) -> str:
    """The sbatch script of one job array: task i runs the points of ``tasks[i]`` (all with the same request);
    ``exclude``: nodes left out.

    One point a task: its ranks start as a job's do (srun, or the profile's mpirun), each logging into the
    point's folder. Several: hpcdl's sweep runner runs them in the task's allocation, several at once.
    """
    from submitit.slurm.slurm import _make_sbatch_string

    plan = tasks[0][0][0]
    root = tasks[0][0][1].parent
    names = " ".join(shlex.quote(folder.name) for task in tasks for _, folder in task)
    lines = [f"points=({names})"]
    if points_per_task > 1:
        lines += [f"first=$((SLURM_ARRAY_TASK_ID * {points_per_task}))",
                  " ".join(["srun --ntasks=1 --cpus-per-task=${SLURM_CPUS_PER_TASK:-1} --unbuffered", _python(plan),
                            "-u -m hpcdl.sweep.runner --packed",
                            shlex.quote(str(sweep)), f'"${{points[@]:$first:{points_per_task}}}"'])]
    else:
        lines.append(f'folder={shlex.quote(str(root))}/"${{points[$SLURM_ARRAY_TASK_ID]}}"')
        log = f'"$folder/{SLURM_FILES}/${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}'
        worker = f'{_python(plan)} -u -m {WORKER} "$folder"'
        if plan.mpi:
            lines.append(f'{worker} >> {log}_0_log.out" 2>> {log}_0_log.err"')
        else:
            lines.append(f'srun --unbuffered --open-mode=append --output "$folder/{SLURM_FILES}/%A_%a_%t_log.out" '
                         f'--error "$folder/{SLURM_FILES}/%A_%a_%t_log.err" --kill-on-bad-exit=1 {worker}')
    parameters = {**sbatch_parameters(plan, exclude), "use_srun": False, "srun_args": None,
                  "job_name": f"{plan.name}-sweep"}
    return _stop_signal_forwarded(_make_sbatch_string(command="\n".join(lines), folder=sweep / SLURM_FILES,
                                                      map_count=len(tasks),
                                                      array_parallelism=parallelism or len(tasks), **parameters))


def array_tasks(slurm_id: str) -> list[str]:
    """The task ids a Slurm job id names: itself, or each task of a range such as 12_[3-5,8%2]."""
    base, _, tasks = slurm_id.partition("_[")
    if not tasks:
        return [slurm_id]
    named = []
    for part in tasks.rstrip("]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            named += [f"{base}_{task}" for task in range(int(low), int(high or low) + 1)]
    return named


def _run_worker(folder: str) -> None:
    """What submitit runs in the job: the worker's run_job, found by its module's name as every start names it."""
    importlib.import_module(WORKER).run_job(folder)


def _executor_class() -> type:
    """submitit's SlurmExecutor, made to submit the script hpcdl rendered (the one dry_run shows)."""
    import submitit

    class ScriptExecutor(submitit.SlurmExecutor):
        def __init__(self, script: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.script = script

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            if command not in self.script:  # the same command, or the preview was not what is submitted
                raise SubmissionError(f"internal: submitit's command {command!r} is not in the rendered script")
            return self.script

    return ScriptExecutor


def _check_against(plan: JobPlan, found: dict[str, Partition]) -> None:
    """ConfigError naming the option when the request exceeds what sinfo says the partition has."""
    profile = plan.cluster
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
    if limit is not None and plan.time_limit_minutes > limit:
        raise ConfigError(f"cluster.time={profile.time}: {where} allows at most {limit} minutes")


class SlurmBackend:
    """sbatch through submitit's SlurmExecutor."""

    name = "slurm"
    scheduler = "Slurm"
    starts_ranks = False
    stop_state = STOPPED
    sweep_runner = False
    runs_here = False

    def check_profile(self, profile: ClusterConfig) -> None:
        """Every setting of a profile is Slurm's: its own checks are enough."""

    def check(self, plan: JobPlan, dry_run: bool = False) -> Optional[str]:
        """Compare the request with what the cluster has; ConfigError naming the option if it cannot run.

        A dry run needs no controller: when sinfo does not answer, the note says what was not checked. A job on a
        pool is checked against the pool (hpcdl.lifecycle.pools), not the partition.
        """
        if plan.cluster.pool is not None:
            if plan.mpi:
                raise ConfigError("cluster.pool: a job whose ranks mpirun starts (training.comm=mpi) does not run "
                                  "on a pool; submit it without cluster.pool")
            return None
        try:
            found = partitions(QUERY_TIMEOUT_DRY_RUN_S if dry_run else QUERY_TIMEOUT_S)
        except SubmissionError as e:
            if not dry_run:
                raise
            return (f"the controller did not answer ({e}); partition, nodes, GPUs, CPUs and time limit "
                    "were not checked against the cluster")
        _check_against(plan, found)
        return None

    def preview(self, plan: JobPlan, folder: Path) -> str:
        """The sbatch script and the variables that travel with the job (a pool's job: its srun command)."""
        if plan.cluster.pool is not None:
            return (f"{shlex.join(step_command(plan, folder))}\n# variables it passes (the profile's allow-list "
                    f"and hpcdl's own): {' '.join(sorted({*plan.exported, *plan.environment}))}\n")
        lines = [sbatch_script(plan, folder, sorted(self.left_out(folder.parent))).rstrip("\n"), "",
                 "# variables copied from the submitting shell (--export allow-list):"]
        lines += [f"#   {name}" for name in plan.exported]
        lines += [f"#   {name} (secret: passed by name, its value never written)" for name in plan.cluster.secrets]
        return "\n".join(lines) + "\n"

    def submit(self, plan: JobPlan, folder: Path) -> str:
        """sbatch the job's script (the one preview shows) through submitit; returns Slurm's job id (a pool's
        job: a step of the held job, 'HELD/SRUN')."""
        if plan.cluster.pool is not None:
            return submit_step(plan, folder, read_json(folder / MANIFEST)["pool"]["name"])
        left_out = sorted(self.left_out(folder.parent))
        executor = _executor_class()(sbatch_script(plan, folder, left_out), folder=folder / SLURM_FILES,
                                   python=_python(plan), max_num_timeout=0)
        executor.update_parameters(**sbatch_parameters(plan, left_out))
        try:
            with outside_any_job():
                job = executor.submit(_run_worker, str(folder))
        except Exception as e:  # submitit raises plain exceptions carrying sbatch's message
            left = (f" (left out: {', '.join(left_out)}, which failed a preflight of your jobs lately; "
                    "cluster.preflight_hold_s)") if left_out else ""
            raise SubmissionError(f"sbatch refused the job: {str(e).strip()}{left}") from e
        return str(job.job_id)

    def submit_sweep(self, sweep: Path, points: list[tuple[JobPlan, Path]], parallelism: Optional[int],
                     points_per_task: int) -> tuple[list[str], str]:
        """One job array per group of points with the same request, split at the cluster's MaxArraySize;
        ``parallelism`` is each array's ``%k``. Returns 'ARRAY_TASK' per point and the array ids. On a pool each
        point is a step of its own ('HELD/POOL/SRUN'), the sweep's 'HELD/POOL/' (it names no step)."""
        if points[0][0].cluster.pool is not None:
            name = read_json(points[0][1] / MANIFEST)["pool"]["name"]
            return ([submit_step(plan, folder, name) for plan, folder in points],
                    f"{points[0][0].cluster.pool}/{name}/")
        groups: dict[str, list[tuple[JobPlan, Path]]] = {}
        scripts: dict[int, str] = {}  # the points of a sweep mostly share one plan: its script rendered once
        for plan, folder in points:
            script = scripts.get(id(plan)) or scripts.setdefault(id(plan), sbatch_script(plan, Path("/")))
            groups.setdefault(script, []).append((plan, folder))
        limit = max_array_size()
        left_out = sorted(self.left_out(sweep.parent))
        point_ids: dict[Path, str] = {}
        arrays: list[str] = []
        try:
            for members in groups.values():
                tasks = [members[i:i + points_per_task] for i in range(0, len(members), points_per_task)]
                if points_per_task == 1:  # the ranks log into the point's folder
                    for _, folder in members:
                        (folder / SLURM_FILES).mkdir(mode=0o700, exist_ok=True)
                for first in range(0, len(tasks), limit):
                    chunk = tasks[first:first + limit]
                    script = sweep / SLURM_FILES / f"array-{len(list((sweep / SLURM_FILES).glob('array-*.sh')))}.sh"
                    script.parent.mkdir(mode=0o700, exist_ok=True)
                    atomic_write_text(script, array_script(chunk, sweep, parallelism, points_per_task, left_out))
                    array_id = run_command(["sbatch", "--parsable", str(script)]).strip().split(";")[0]
                    arrays.append(array_id)
                    for task, task_points in enumerate(chunk):
                        for _, folder in task_points:
                            point_ids[folder] = f"{array_id}_{task}"
        except BaseException:  # a later sbatch refused (a QOS limit, say): none of the sweep stays queued
            if arrays:
                with contextlib.suppress(SubmissionError):
                    run_command(["scancel", *arrays])
            raise
        return [point_ids[folder] for _, folder in points], ",".join(arrays)

    def live_states(self, records: list[JobRecord]) -> Optional[dict[str, str]]:
        """Scheduler states from one squeue call (and one sacct call for jobs squeue no longer shows); a pending
        job's with Slurm's reason after it ('PENDING Resources'), as sacct's 'CANCELLED by 0' has its detail.

        Returns None when Slurm cannot be asked at all; jobs missing from the answer have ended
        without the scheduler remembering how.
        """
        pooled = [record for record in records if pool_job(record)]
        records = [record for record in records if not pool_job(record)]
        ids: dict[str, list[str]] = {}  # points packed into one array task share its id
        for record in records:
            if record.backend_id:
                ids.setdefault(record.backend_id, []).append(record.id)
        try:  # -r: one line per array task, pending ones too; %r: why a pending job waits
            queue = run_command(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T|%r"]) if ids else ""
            live: dict[str, Optional[str]] = step_states(pooled) if pooled else {}
        except SubmissionError:
            return None
        for line in queue.splitlines():
            slurm_id, state, reason = line.strip().split("|", 2)
            if state == PENDING and reason not in ("", "None"):
                state = f"{state} {reason}"
            live.update({job: state for job in ids.get(slurm_id, [])})
        gone = [slurm_id for slurm_id, jobs in ids.items() if jobs[0] not in live]
        arrays = {slurm_id.split("_")[0] for slurm_id in gone if "_" in slurm_id}  # their never-started tasks
        if gone:
            try:
                history = run_command(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join([*gone, *arrays])])
            except SubmissionError:  # no accounting here: the status files decide
                history = ""
            for line in history.splitlines():
                slurm_id, state = line.strip().split("|")[:2]
                for task in array_tasks(slurm_id):  # tasks that never started are one line: 12_[3-9]
                    live.update({job: state.split()[0] for job in ids.get(task, []) if job not in live})
        return live

    def cancel(self, record: JobRecord) -> None:
        """scancel the job and wait (at most CANCEL_WAIT_S) until Slurm has ended every task of it (a pool's job:
        its step)."""
        if pool_job(record):
            cancel_step(record)
            return
        if runs_under_runner(record):  # packed with others: its task's runner ends it on seeing CANCELLED
            return
        run_command(["scancel", *str(record.backend_id).split(",")])  # a sweep's: each of its arrays
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline and is_queued(str(record.backend_id)):
            time.sleep(0.5)

    def log_path(self, record: JobRecord, rank: int, stream: str) -> Path:
        """submitit's per-task log file of ``rank``."""
        if runs_under_runner(record):
            return record.folder / LOGS / stream_log(stream)
        suffix = "out" if stream == "stdout" else "err"
        if pool_job(record):
            return record.folder / SLURM_FILES / STEP_LOG.format(rank=rank, suffix=suffix)
        return record.folder / SLURM_FILES / f"{record.backend_id}_{rank}_log.{suffix}"

    def display_id(self, record: JobRecord) -> str:
        """Slurm's job id (a sweep's: its array ids; a pool's job: the held job's, and the pool's name)."""
        if pool_job(record):
            held, name, _ = step_of(str(record.backend_id))
            return f"{held} (pool {name})"
        return record.backend_id or ""

    def describe(self, backend_id: str) -> str:
        """'Slurm job ID' ('a step of Slurm job HELD' for a pool's job)."""
        if "/" in backend_id:
            held, name, _ = step_of(backend_id)
            return f"a step of Slurm job {held}, pool {name}"
        return f"Slurm job {backend_id}"

    def describe_sweep(self, backend_id: str) -> str:
        """The job arrays (a pool's steps)."""
        if "/" in backend_id:
            held, name, _ = step_of(backend_id)
            return f"steps of Slurm job {held}, pool {name}"
        return f"Slurm array(s) {backend_id}"

    def start_pool(self, profile: ClusterConfig, folder: Path, name: str, idle_timeout_s: int) -> str:
        """sbatch a held job that keeps the allocation until idle (hpcdl.cluster.slurm_pool); returns its id."""
        return slurm_pool.start(profile, folder, name, idle_timeout_s)

    def pool_states(self, ids: list[str]) -> dict[str, tuple[str, Optional[int]]]:
        """Each held job's Slurm state and seconds left (from squeue, else sacct)."""
        return slurm_pool.states(ids)

    def stop_pool(self, backend_id: str) -> None:
        """scancel the held job: it and every step in it end."""
        slurm_pool.stop(backend_id)

    def survey(self) -> list[str]:
        """One line per partition (from sinfo): its nodes, CPUs and GPUs per node, time limit; * the default."""
        lines = ["PARTITION  NODES  CPUS/NODE  GPUS/NODE  TIME LIMIT"]
        for p in partitions().values():
            limit = "none" if p.time_limit_minutes is None else f"{p.time_limit_minutes} min"
            lines.append(f"{p.name + '*' * p.default:<10} {p.nodes:>5}  {p.cpus_per_node:>9}  {p.gpus_per_node:>9}  "
                         f"{limit}")
        return lines

    def requeue(self, job: str) -> Optional[str]:
        """scontrol requeue: the job goes on from its checkpoint (Slurm runs it again with its restart count
        raised); None once queued, else what scontrol said."""
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        return None if done.returncode == 0 else f"scontrol requeue failed: {done.stderr.strip()}"

    def task_cpus(self) -> Optional[int]:
        """The CPUs of this task (SLURM_CPUS_PER_TASK), else its share of this node's allocation; None outside
        a job."""
        given = os.environ.get("SLURM_CPUS_PER_TASK")
        if given:
            return int(given)
        on_node = os.environ.get("SLURM_CPUS_ON_NODE")  # shared by the tasks on the node
        return max(1, int(on_node) // local_env().local_world_size) if on_node else None

    def single_task_environment(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` without srun's task variables: the process sees itself as one task, not as this step's."""
        return {name: value for name, value in env.items() if name not in TASK_VARIABLES}

    def left_out(self, root: Path) -> dict[str, str]:
        """The nodes that failed a preflight of this user's jobs lately (--exclude), each with its reason."""
        return {node: str(entry.get("reason") or "failed a preflight") for node, entry in remembered(root).items()}

    def requeue_excluding(self, job: str, node: str) -> Optional[str]:
        """scontrol requeue, then the job's excluded nodes raised by ``node`` while Slurm holds the requeued job
        (about 120 s on 22.05) before it may start again; None once both are done, else the refusal."""
        refused = self.requeue(job)
        if refused is not None:
            return refused
        for _ in range(10):  # the update is taken once the job is pending again
            shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
            found = re.search(r"\bExcNodeList=(\S+)", shown)
            excluded = ",".join(filter(None, [found.group(1) if found and found.group(1) != "(null)" else "", node]))
            done = subprocess.run(["scontrol", "update", f"JobId={job}", f"ExcNodeList={excluded}"],
                                  capture_output=True, text=True)
            if done.returncode == 0:
                return None
            time.sleep(1)
        return f"scontrol update ExcNodeList failed: {done.stderr.strip()}"

    def this_run(self) -> int:
        """SLURM_RESTART_COUNT: raised each time Slurm queues the job again (0 for a first run)."""
        return int(os.environ.get("SLURM_RESTART_COUNT", "0"))

    def this_job(self) -> Optional[str]:
        """SLURM_JOB_ID (an array task's own id); None outside a Slurm job."""
        return os.environ.get("SLURM_JOB_ID")

    def requeued_since_start(self) -> bool:
        """Whether scontrol shows the job's restart count past this run's."""
        job = self.this_job()
        if not job:
            return False
        found = re.search(r"\bRestarts=(\d+)", ask(["scontrol", "show", "job", job]))
        return found is not None and int(found.group(1)) > self.this_run()

    def how_run_ended(self, run: int) -> Optional[str]:
        """The run's state in sacct's accounting; a node failure with the nodes sacctmgr's events mark down
        meanwhile."""
        job = self.this_job()
        if not job:
            return None
        runs = ask(["sacct", "-D", "-X", "-n", "-P", "-o", "State,Start,End,NodeList", "-j", job]).splitlines()
        if run >= len(runs) or runs[run].count("|") != 3:
            return None
        state, start, end, nodes = runs[run].split("|")
        state = state.split()[0]
        if state != NODE_FAIL:
            return state
        with contextlib.suppress(ValueError):  # the node is marked down as the run ends: a minute's margin
            end = (datetime.datetime.fromisoformat(end) + datetime.timedelta(minutes=1)).isoformat(timespec="seconds")
        events = ask(["sacctmgr", "-n", "-P", "show", "event", f"start={start}", f"end={end}", f"nodes={nodes}",
                       "format=NodeName,Reason"])
        down = sorted({line.replace("|", ": ", 1) for line in events.splitlines() if line.split("|")[0]})
        return f"{state} ({', '.join(down)})" if down else state


BACKEND = SlurmBackend
