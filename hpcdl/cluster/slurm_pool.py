"""Held pools on Slurm: one allocation held by a batch job that sleeps, its jobs run as job steps in it.

The held job's script (``holder_script``) only waits: every few seconds it asks squeue for steps of its own job
and reads the pool's use mark (touched at every submission); once neither has shown use for the idle timeout it
writes POOL_RELEASED and exits, which ends the allocation. A job on the pool is one ``srun --jobid=HELD`` step,
named by the job's hpcdl id, started detached from the submitting shell: ``--exact`` gives it only what it asks
for, so small jobs run side by side and a job that does not fit yet waits in srun for a running one to end.
Its scheduler id is ``HELD/POOL/SRUN``: the held job, the pool's name and the srun process (while it waits for
room), so that a listing of ended jobs still shows the pool from the store's index alone.
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from hpcdl.cluster import WORKER
from hpcdl.cluster.slurm_commands import is_queued, run_command
from hpcdl.config import ClusterConfig
from hpcdl.config.cluster import time_limit_seconds
from hpcdl.errors import ConfigError, SubmissionError
from hpcdl.host import is_running, process_id
from hpcdl.plan import JobPlan
from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.files import (POOL_LOG, POOL_RELEASED, POOL_RELEASING, POOL_SCRIPT, POOL_USED, SLURM_FILES,
                               STEP_LOG)
from hpcdl.store.folders import JobRecord
from hpcdl.store.states import PENDING, RUNNING
from hpcdl.train.stopping import STOP_SIGNAL

POLL_S = 5
"""The longest the holder sleeps between two looks for use."""
STOP_WAIT_S = 60.0


def pool_job(record: JobRecord) -> bool:
    """Whether the job was submitted to a pool (a step of its held job)."""
    return "/" in (record.backend_id or "")


def step_of(backend_id: str) -> tuple[str, str, str]:
    """A pool job's held job id, pool name and srun process (``process_id``'s form, or a bare pid)."""
    held, _, rest = backend_id.partition("/")
    name, _, srun = rest.partition("/")
    return held, name, srun


def holder_script(folder: Path, idle_timeout_s: int) -> str:
    """The held job's script: it ends itself once no step ran and nothing was submitted for ``idle_timeout_s``.
    Its release is the holder's half of the handshake with submissions (hpcdl.store.pools.claim_use)."""
    quoted = {name: shlex.quote(str(folder / name)) for name in (POOL_USED, POOL_RELEASED, POOL_RELEASING)}
    poll = max(1, min(POLL_S, idle_timeout_s // 4))
    # ': <' opens the mark before stat reads it: on NFS an open fetches its attributes afresh (close-to-open)
    mark = f"$(: 2>/dev/null < {quoted[POOL_USED]}; stat -c '%Y %y' {quoted[POOL_USED]} 2>/dev/null || echo 0)"
    return "\n".join([
        "#!/bin/bash",
        "# hpcdl pool holder: holds the allocation until it is idle (python -m hpcdl.pool)",
        "umask 077  # its records are this user's alone, whatever umask Slurm passed on",
        f"idle={idle_timeout_s}",
        "last=$(date +%s)",
        "while :; do",
        f"    sleep {poll}",
        "    now=$(date +%s)",
        '    if ! steps=$(squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null); then',
        "        last=$now  # the controller did not answer: not taken for idleness",
        "    elif printf '%s\\n' \"$steps\" | grep -v -e '^$' -e '\\.batch$' -e '\\.extern$' >/dev/null; then",
        "        last=$now",
        "    fi",
        f"    mark={mark}",
        '    used=${mark%% *}',
        '    if [ "$used" -gt "$last" ]; then last=$used; fi',
        '    if [ $((now - last)) -ge "$idle" ]; then',
        f"        : > {quoted[POOL_RELEASING]}  # announced; a submission that touched the mark since goes on",
        f'        if [ "{mark}" != "$mark" ]; then',
        f"            rm -f {quoted[POOL_RELEASING]}",
        "            continue",
        "        fi",
        f"        printf '{{\"at\": %s, \"idle_s\": %s}}\\n' \"$now\" \"$idle\" > {quoted[POOL_RELEASED]}.tmp",
        f"        mv {quoted[POOL_RELEASED]}.tmp {quoted[POOL_RELEASED]}",
        f"        rm -f {quoted[POOL_RELEASING]}",
        "        exit 0",
        "    fi",
        "done",
        "",
    ])


def sbatch_command(profile: ClusterConfig, folder: Path, name: str) -> list[str]:
    """The sbatch command that holds the pool's allocation (every value an argument of its own: no quoting)."""
    options = {"job-name": f"hpcdl-pool-{name}", "nodes": profile.nodes, "ntasks-per-node": profile.tasks_per_node,
               "time": -(-time_limit_seconds(profile.time) // 60), "output": folder / POOL_LOG,
               "export": ",".join(n for n in profile.export if n in os.environ) or "NONE",
               "partition": profile.partition, "account": profile.account, "qos": profile.qos,
               "cpus-per-task": profile.cpus_per_task, "mem": profile.mem, "constraint": profile.constraint,
               "gpus-per-node": profile.gpus_per_node or None, **profile.sbatch_extra}
    return ["sbatch", "--parsable", *(f"--{k}={v}" if v != "" else f"--{k}" for k, v in options.items()
                                      if v is not None), str(folder / POOL_SCRIPT)]


def start(profile: ClusterConfig, folder: Path, name: str, idle_timeout_s: int) -> str:
    """sbatch the holder of a new pool in ``folder``; returns the held job's id."""
    atomic_write_text(folder / POOL_SCRIPT, holder_script(folder, idle_timeout_s))
    try:
        return run_command(sbatch_command(profile, folder, name)).strip().split(";")[0]
    except SubmissionError as e:
        raise SubmissionError(f"sbatch refused the pool: {e}") from e


def _seconds_left(text: str) -> Optional[int]:
    """squeue's time left (%L: 4:46, 1:02:03, 1-00:00:00) in seconds; None when unlimited."""
    if text in ("UNLIMITED", "NOT_SET", "INVALID"):
        return None
    try:
        return time_limit_seconds(text)
    except ConfigError:  # 0:00
        return 0


def states(ids: list[str]) -> dict[str, tuple[str, Optional[int]]]:
    """Slurm's state of each held job (with why a pending one waits) and its seconds left (None: unlimited or
    ended), from one squeue call and one sacct call for the ones squeue no longer shows; an id Slurm forgot
    is absent."""
    found: dict[str, tuple[str, Optional[int]]] = {}
    for line in run_command(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%T|%L|%r"]).splitlines():
        held, state, left, reason = line.strip().split("|", 3)
        if held in ids:
            found[held] = (f"{state} ({reason})" if state == PENDING and reason not in ("", "None") else state,
                           _seconds_left(left))
    gone = [held for held in ids if held not in found]
    if gone:
        try:
            history = run_command(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(gone)])
        except SubmissionError:
            history = ""
        for line in history.splitlines():
            held, state = line.strip().split("|")[:2]
            found.setdefault(held, (state.split()[0], None))
    return found


def stop(held: str) -> None:
    """scancel the held job (every step in it ends) and wait, at most STOP_WAIT_S, until Slurm has ended it."""
    run_command(["scancel", held])
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline and is_queued(held):
        time.sleep(0.5)


def step_command(plan: JobPlan, folder: Path) -> list[str]:
    """The srun command of a job run as a step of its pool's held job (``plan.cluster.pool``: the held id)."""
    profile = plan.cluster
    logs = folder / SLURM_FILES
    options = {"jobid": profile.pool, "job-name": folder.name, "nodes": profile.nodes,
               "ntasks": profile.nodes * profile.tasks_per_node, "ntasks-per-node": profile.tasks_per_node,
               "cpus-per-task": profile.cpus_per_task, "gpus-per-node": profile.gpus_per_node or None,
               "mem": profile.mem, "time": plan.time_limit_minutes,
               "signal": f"{STOP_SIGNAL.name.removeprefix('SIG')}@{profile.signal_delay_s}"
               if profile.signal_delay_s else None,
               "output": logs / STEP_LOG.format(rank="%t", suffix="out"),
               "error": logs / STEP_LOG.format(rank="%t", suffix="err")}
    python = os.path.expanduser(profile.python) if profile.python else sys.executable
    worker = [python, "-u", "-m", WORKER, str(folder)]
    if profile.setup:  # the profile's shell lines first, then the worker with its arguments as they are
        worker = ["bash", "-c", "\n".join([*profile.setup, 'exec "$0" "$@"']), *worker]
    return ["srun", "--exact", "--kill-on-bad-exit=1", "--unbuffered",
            *(f"--{k}={v}" for k, v in options.items() if v is not None), *worker]


def step_environment(plan: JobPlan) -> dict[str, str]:
    """What the step's ranks get: the allow-listed variables of this shell, the secrets by name, hpcdl's own."""
    names = [*plan.exported, *plan.cluster.secrets, "PATH", "SLURM_CONF"]
    return {**{n: os.environ[n] for n in names if n in os.environ}, **plan.environment}


def submit_step(plan: JobPlan, folder: Path, pool_name: str) -> str:
    """Start the job as a step of its pool, detached (it outlives this process); returns 'HELD/POOL/SRUN'."""
    logs = folder / SLURM_FILES
    logs.mkdir(mode=0o700, exist_ok=True)
    srun = shutil.which("srun")
    if srun is None:
        raise SubmissionError("srun is not on PATH: a pool's jobs start from a host with Slurm's commands")
    command = step_command(plan, folder)
    with open(logs / STEP_LOG.format(rank="srun", suffix="err"), "ab") as log:
        started = subprocess.Popen([srun, *command[1:]], env=step_environment(plan), stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=log, start_new_session=True, close_fds=True)
    return f"{plan.cluster.pool}/{pool_name}/{process_id(started.pid) or started.pid}"


def _steps() -> dict[str, str]:
    """This user's running steps by name (a pool job's hpcdl id) -> step id."""
    listed = run_command(["squeue", "-h", "-s", "-u", getpass.getuser(), "-o", "%i|%j"])
    return {name: step for step, _, name in (line.strip().partition("|") for line in listed.splitlines())}


def step_states(records: list[JobRecord]) -> dict[str, Optional[str]]:
    """The state of each pool job: RUNNING while its step runs; PENDING while its srun waits for room in the
    pool; once it has ended, its step's state in Slurm's accounting; absent when Slurm knows none."""
    running = _steps()
    live: dict[str, Optional[str]] = {}
    asked = []
    for record in records:
        held, _, srun = step_of(str(record.backend_id))
        waiting = is_running(srun) if "@" in srun else None
        if record.id in running:
            live[record.id] = RUNNING
        elif waiting:
            live[record.id] = f"{PENDING} Pool"
        elif waiting is None:  # its srun runs on another host: judged there
            live[record.id] = None
        else:
            asked.append(held)
    if asked:
        try:
            history = run_command(["sacct", "-n", "-P", "-o", "JobID,JobName,State", "-j", ",".join(set(asked))])
        except SubmissionError:
            history = ""
        ended = {name: state.split()[0] for _, name, state in
                 (line.strip().split("|")[:3] for line in history.splitlines() if line.count("|") >= 2)}
        live.update({r.id: ended[r.id] for r in records if r.id in ended and r.id not in live})
    return live


def cancel_step(record: JobRecord) -> None:
    """End a pool job: scancel its step, or end its srun while that waits for room; wait until it has ended."""
    srun = step_of(str(record.backend_id))[2]
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        step = _steps().get(record.id)
        if step is not None:
            run_command(["scancel", step])
        elif "@" in srun and is_running(srun):
            os.killpg(int(srun.split(":")[0]), signal.SIGTERM)
        else:
            return
        time.sleep(0.5)
