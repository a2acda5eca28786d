"""The job side: what runs on the node (or the local machine) for a job folder.

``run_job(folder)`` marks the job RUNNING, runs its payload (a built-in
training run, or a function given to ``hpcdl.batch``), writes the result, and
marks it COMPLETED once every rank has returned, or FAILED with the traceback
before re-raising, so that the scheduler sees the failure too. The lead rank
writes RUNNING (status.json); the first final state recorded (final.json) holds:
a failing rank's FAILED, the last rank's COMPLETED, a local time limit's TIMEOUT,
which also ends every rank of the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from hpcdl.cluster import WORKER, Backend, backend_for
from hpcdl.distributed.restarts import (is_earlier_runs_failure, record_failure, record_final, recorded_final,
                                        withdraw_earlier_failure)
from hpcdl.distributed import failures, hangs, heartbeat, pace, stacks
from hpcdl.distributed.env import LAUNCHER_RANK_VARIABLES, global_rank, node_name
from hpcdl.errors import FolderGoneError
from hpcdl.host import TASK_CPUS, become_subreaper, end_own_job
from hpcdl.plan import JobPlan
from hpcdl.reporting import close_metrics
from hpcdl.snapshot import run_from_snapshot
from hpcdl.store.atomic import atomic_save, make_folder, remove_stale_temporaries
from hpcdl.store.badnodes import remember
from hpcdl.store.caches import compile_cache
from hpcdl.store.files import (CHECKPOINTS, FUNCTION_RESULT, LOGS, MANIFEST, NCCL_TRACE,
                               RANK_RESULTS, RANKS_DONE, STATUS, checkpoint_files, rank_log, rank_result)
from hpcdl.store.folders import read_json
from hpcdl.store.safety import check_store
from hpcdl.store.states import COMPLETED, FAILED, REQUEUED, RUNNING, TIMEOUT, UNKNOWN
from hpcdl.store.sweeps import handed_over
from hpcdl.train.stopping import STOP_SIGNAL, StopRequested, ended_by, listen_for_stop
from hpcdl.store.status import write_final, write_status


RANK_LOGS = "HPCDL_RANK_LOGS"
"""Set for the ranks of a local mpirun: the folder of their own log files."""


def _write_hparams(folder: Path, manifest: dict[str, Any]) -> None:
    """The run's hyperparameters (its main options, its overrides, a sweep point's own) for TensorBoard."""
    from hpcdl.view import tensorboard

    if global_rank() == 0 and tensorboard.available():
        tensorboard.write_hparams(tensorboard.events_folder(folder), tensorboard.run_hparams(manifest), time.time())


def _run_payload(folder: Path, plan: JobPlan, manifest: dict[str, Any]) -> None:
    _write_hparams(folder, manifest)
    if plan.kind == "train":
        from hpcdl.train.job import run_training

        run_training(plan, folder)
        return
    from hpcdl.usercode import run_user_code

    try:
        result = run_user_code(folder, plan, manifest)
    except BaseException as error:
        with contextlib.suppress(Exception):  # a store gone meanwhile: the user's own error is the one to raise
            close_metrics(ended_by(error))  # hpcdl.report's records so far: the final plot and events
        raise
    import cloudpickle

    if plan.gather_results:
        make_folder(folder / RANK_RESULTS)
        atomic_save(folder / rank_result(global_rank()), lambda out: cloudpickle.dump(result, out))
    if global_rank() != 0:
        return

    close_metrics()  # hpcdl.report's records: the final plot and events, as the trainer's
    if result is not None or not (folder / FUNCTION_RESULT).exists():  # hpcdl.save_result's stays
        atomic_save(folder / FUNCTION_RESULT, lambda out: cloudpickle.dump(result, out))


def _enforce_local_time_limit(folder: Path, plan: JobPlan) -> None:
    """Local jobs have no scheduler to end them: at the profile's time limit, record TIMEOUT and end every
    process of the job (its ranks too: none may run on and write a result)."""

    def expire() -> None:
        with contextlib.suppress(OSError, FolderGoneError):
            write_final(folder, TIMEOUT, reason=f"time limit {plan.cluster.time} reached")
        end_own_job(124)  # like timeout(1)

    def warn() -> None:  # as Slurm's --signal: the ranks (the launcher forwards it) checkpoint and stop
        os.kill(os.getpid(), STOP_SIGNAL)

    timers = [threading.Timer(plan.time_limit_s, expire)]
    if 0 < plan.cluster.signal_delay_s < plan.time_limit_s:
        timers.append(threading.Timer(plan.time_limit_s - plan.cluster.signal_delay_s, warn))
    for timer in timers:
        timer.daemon = True
        timer.start()


def _after_stop(folder: Path, plan: JobPlan, backend: Backend, stop: StopRequested, job_id: str) -> None:
    """The ranks stopped on the signal with a checkpoint: under a scheduler the lead requeues the job while
    requeues are left (it goes on from the checkpoint); otherwise the job ends in its backend's stop state (TIMEOUT
    for a local job, STOPPED)."""
    if global_rank() != plan.lead_rank:
        return
    restarts = backend.this_run()
    slurm_job = backend.this_job()
    event = {"at": time.time(), "iteration": stop.iteration, "restarts": restarts, "slurm_job": slurm_job}
    status = read_json(folder / STATUS) or {}
    if slurm_job and restarts < plan.cluster.max_requeues:
        refused = backend.requeue(slurm_job)
        # refused where the scheduler has requeued the job itself (Slurm: a preemption with PreemptMode=REQUEUE
        # and no grace)
        by = "" if refused is None else f" by {backend.scheduler}" if backend.requeued_since_start() else None
        if by is not None:
            write_status(folder, REQUEUED, events=[*status.get("events", []), {**event, "event": "requeued"}])
            print(f"[hpcdl] {stop}; requeued{by} (restart {restarts + 1} of at most {plan.cluster.max_requeues})",
                  flush=True)
            return
        print(f"[hpcdl] {refused}", file=sys.stderr, flush=True)
    state = backend.stop_state
    write_status(folder, status.get("state", RUNNING), events=[*status.get("events", []),
                                                                 {**event, "event": "stopped"}])
    record_final(folder, backend, state, iteration=stop.iteration,
                reason=f"{stop}; go on with python -m hpcdl.jobs resume {job_id}")


def _events_with_restart(folder: Path, backend: Backend, earlier_failure: dict[str, Any] | None
                         ) -> list[dict[str, Any]]:
    """The job's events, with this start noted when the scheduler requeued the job without hpcdl asking (a
    preemption without grace, a node failure, an operator's requeue): how the last run ended, from which
    checkpoint it goes on, and what a rank that outlived that run recorded."""
    events = (read_json(folder / STATUS) or {}).get("events", [])
    restarts, job = backend.this_run(), backend.this_job()
    if restarts == 0 or any(e.get("restarts") == restarts - 1 and e.get("slurm_job") == job for e in events):
        return events  # hpcdl requeued it itself
    checkpoints = checkpoint_files(folder / CHECKPOINTS)
    event = {"event": "restarted", "at": time.time(), "iteration": checkpoints[-1][0] if checkpoints else 0,
             "restarts": restarts - 1, "slurm_job": job, "slurm": backend.how_run_ended(restarts - 1) or UNKNOWN}
    if earlier_failure is not None:
        event["failure"] = earlier_failure.get("reason", "")
    return [*events, event]


def _launch_ranks(path: Path, plan: JobPlan) -> None:
    """Local multi-worker jobs: this process starts one rank per worker and names the one that fails."""
    from hpcdl.distributed.launch import launch_local

    world = plan.world_size
    rank_command = [sys.executable, "-u", "-m", WORKER, str(path)]
    if plan.mpi:  # each rank sends its output to its own files (_log_to_own_files)
        env = {**os.environ, RANK_LOGS: str(make_folder(path / LOGS))}
        code = subprocess.call([*plan.cluster.mpirun, "-n", str(world), *rank_command], env=env)
        failure = f"mpirun -n {world} exited with code {code}"
    else:
        code, failure = launch_local(rank_command, world, logs=make_folder(path / LOGS),
                                     on_failure=lambda rank, pid, code: _record_signalled(path, rank, pid, code))
    if code != 0:  # a rank that failed with a traceback has recorded FAILED first, and that holds
        write_final(path, FAILED, reason=failure)
        sys.exit(1)


def _record_signalled(folder: Path, rank: int, pid: int, code: int) -> None:
    """The first rank to fail was ended by a signal (kill -9, the OOM killer): it wrote nothing, so say it."""
    if code < 0:
        name = signal.Signals(-code).name
        failures.record(folder, rank, "Signal", f"killed by signal {name}", "", run=heartbeat.run_token(),
                        how="signal", pid=pid, cause=True)


def _log_to_own_files(logs: Path) -> None:
    """A rank started by a local mpirun: its stdout and stderr go to its own files, as the launcher's do."""
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        target = os.open(rank_log(logs, global_rank(), stream), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)


def run_job(folder: str) -> None:
    """Run the job stored in ``folder``; its status file says how it went."""
    path = Path(folder)
    launched_as_rank = any(name in os.environ for name in LAUNCHER_RANK_VARIABLES)
    if launched_as_rank and RANK_LOGS in os.environ:
        _log_to_own_files(Path(os.environ.pop(RANK_LOGS)))  # first: any error of this rank lands there
    check_store(path.parent)
    manifest = read_json(path / MANIFEST)
    if manifest is None:
        raise FileNotFoundError(f"{path / MANIFEST}: no manifest; not a job folder")
    manifest = _handed_over(path, manifest)
    if manifest is None:  # a sweep's point whose submission was interrupted: it never runs
        return
    plan = JobPlan.from_dict(manifest["plan"])  # checked at submission: nothing is validated again here
    backend = backend_for(plan.cluster.backend)
    cpus = backend.task_cpus()
    if cpus:  # the data loader's default workers: the task's CPUs, fewer than the affinity mask where not bound
        os.environ[TASK_CPUS] = str(cpus)
    final = recorded_final(path)  # read once: the lead may withdraw an earlier run's failure meanwhile
    if final is not None and not is_earlier_runs_failure(final, backend):  # cancelled while being submitted
        return
    run_from_snapshot(path, manifest)
    os.environ["HPCDL_JOB_FOLDER"] = str(path)
    os.environ.setdefault("HPCDL_COLLECTIVE_TIMEOUT_S", str(plan.cluster.collective_timeout_s))
    os.environ["HPCDL_SIGNAL_DELAY_S"] = str(plan.cluster.signal_delay_s)
    if plan.world_size > 1:  # NCCL's flight recorder (PyTorch >= 2.7 names; TORCH_NCCL_TRACE_BUFFER_SIZE before):
        # its dump on a collective timeout lands in the job folder
        for name, value in (("TORCH_FR_BUFFER_SIZE", "2000"), ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
                            ("TORCH_FR_DUMP_TEMP_FILE", str(path / NCCL_TRACE))):
            os.environ.setdefault(name, value)
    cache = compile_cache(path.parent)
    if cache is not None:  # torch.compile's kernels, reused by this user's other tasks and the job's resumes
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache))
    first_process = backend.starts_ranks and not launched_as_rank
    # tells this run's heartbeats and stop flags from an earlier run's: the ranks a scheduler starts share its
    # job id and restart count; those this process starts inherit its own
    os.environ[heartbeat.RUN_TOKEN] = (uuid.uuid4().hex if first_process else os.environ.get(heartbeat.RUN_TOKEN)
                                       or f"{backend.this_job() or ''}.{backend.this_run()}")
    if first_process:
        become_subreaper()  # a detached child ends with the job (cancel, time limit), as under Slurm's cgroups
    if plan.world_size > 1 and first_process:
        _enforce_local_time_limit(path, plan)
        _launch_ranks(path, plan)
        return
    lead = global_rank() == plan.lead_rank
    if first_process:
        _enforce_local_time_limit(path, plan)
    if lead:
        remove_stale_temporaries(path)
        for dump in path.glob(f"{NCCL_TRACE}*"):  # an earlier run's (a requeued job's): a verdict reads this run's
            with contextlib.suppress(FileNotFoundError):
                dump.unlink()
        earlier_failure = withdraw_earlier_failure(path, backend)  # a rank that outlived the last run: this goes on
        write_status(path, RUNNING, started_at=time.time(), host=socket.gethostname(), pid=os.getpid(),
                     slurm_job_id=backend.this_job(), restarts=backend.this_run(),
                     events=_events_with_restart(path, backend, earlier_failure))
    if plan.kind == "script":
        from hpcdl.usercode import listen_for_script_stop

        listen_for_script_stop(path)
    else:
        listen_for_stop()
    _preflight(path, plan, backend)
    if plan.world_size > 1 and plan.cluster.heartbeat_timeout_s:
        heartbeat.start(path, global_rank(), plan.world_size, plan.lead_rank, plan.cluster.heartbeat_timeout_s,
                        plan.cluster.heartbeat_startup_s, backend)
        if lead and plan.cluster.hang_timeout_s:
            waited_for = plan.waited_for_limit_s
            hangs.start(path, plan.world_size, global_rank(), heartbeat.run_token(), plan.cluster.hang_timeout_s,
                        plan.cluster.hang_startup_s if plan.kind == "train" else None,
                        heartbeat.interval_for(waited_for or plan.cluster.hang_timeout_s), backend, waited_for)
    stacks.serve(path, global_rank())
    pace.start(path, global_rank(), heartbeat.run_token(), plan.cluster.straggler_window_s)
    try:
        _run_payload(path, plan, manifest)
    except StopRequested as stop:
        heartbeat.finish()
        pace.finish()
        _after_stop(path, plan, backend, stop, manifest["id"])
        return
    except BaseException as e:
        own = _own_traceback(plan, e)
        kind, message = failures.exception_line(own) if plan.kind == "script" else ("", "")  # the script's own
        kind, message = (kind, message) if kind else (type(e).__name__, str(e))
        failures.record(path, global_rank(), kind, message, own, run=heartbeat.run_token())
        with contextlib.suppress(FolderGoneError):  # a deleted job folder is not written again
            record_failure(path, backend, f"rank {global_rank()}: {kind}: {message}",  # whichever rank fails first
                           rank=global_rank(), rank_host=node_name(), traceback=own)
        raise
    heartbeat.finish()
    pace.finish()
    if _all_ranks_done(path, plan, backend):
        record_final(path, backend, COMPLETED)


PREFLIGHT_REQUEUE_WAIT_S = 300.0
"""How long a node that failed its preflight waits for Slurm to end the run it queued again."""


def _preflight(folder: Path, plan: JobPlan, backend: Backend) -> None:
    """One rank per node checks the node, then times an all-reduce with the other nodes' (cluster.preflight),
    before the ranks meet; a failing node is excluded and the job queued again on its first run, else the job
    fails naming the node and its failed checks (its failure record the root cause jobs why gives)."""
    from hpcdl.distributed.env import local_env
    from hpcdl.distributed import busbw, preflight

    cluster = plan.cluster
    if local_env().local_rank != 0 or not preflight.wanted(cluster.preflight, cluster.nodes, cluster.gpus_per_node,
                                                            plan.device):
        return
    started, node, job = time.monotonic(), node_name(), backend.this_job()
    data_root = plan.config.data.root if plan.config is not None else None
    checks = preflight.run_checks(folder, data_root, cluster.gpus_per_node)
    fields: dict[str, Any] = {"restarts": backend.this_run(), "slurm_job": job}
    if not any(check.failed for check in checks):
        preflight.write_result(folder, node, checks, time.monotonic() - started, **fields)  # the others wait for it
        check, timing = busbw.check_allreduce(folder, node, cluster.nodes, cluster.preflight_allreduce_mb,
                                              cluster.preflight_busbw_gbps, cluster.gpus_per_node > 0, backend)
        checks.append(check)
        if timing is not None:
            fields["busbw_gbps"] = round(timing.busbw_gbps, 3)
        if not check.failed:
            preflight.write_result(folder, node, checks, time.monotonic() - started, **fields)
            return
    reason = preflight.failure_words(node, checks)
    with contextlib.suppress(OSError, ValueError):
        remember(folder.parent, node, reason, cluster.preflight_hold_s)
    refused = backend.requeue_excluding(job, node) if job and backend.this_run() == 0 else "not queued again"
    preflight.write_result(folder, node, checks, time.monotonic() - started, excluded=refused is None, **fields)
    if refused is None:
        print(f"[hpcdl] {reason}; the job is queued again without {node}", file=sys.stderr, flush=True)
        time.sleep(PREFLIGHT_REQUEUE_WAIT_S)  # Slurm ends this run meanwhile
    failures.record(folder, global_rank(), "PreflightFailed", reason, "", run=heartbeat.run_token(), how="preflight",
                    host=node, cause=True)
    with contextlib.suppress(FolderGoneError):
        record_failure(folder, backend, reason, rank=global_rank(), rank_host=node)
    print(f"[hpcdl] {reason}", file=sys.stderr, flush=True)
    sys.exit(1)


def _own_traceback(plan: JobPlan, error: BaseException) -> str:
    """The traceback of a rank's failure: the built-in trainer's whole, the user's code's own (hpcdl.usercode)."""
    if plan.kind == "train":
        return traceback.format_exc()
    from hpcdl.usercode import user_traceback

    return user_traceback(error)


HANDOVER_WAIT_S = 600.0
"""The longest a sweep's point waits for its submitter to finish handing its batch over: a submitter on another
host (a login node) cannot be seen to have died from a compute node, and the point must not hold its GPUs until
its time limit."""


def _handed_over(folder: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The job's manifest once its submitter has handed its batch over (a sweep's points are written before
    the scheduler has them); None when the submitter ended first or did not finish within HANDOVER_WAIT_S."""
    deadline = time.monotonic() + HANDOVER_WAIT_S
    while (ready := handed_over(manifest, folder.parent)) is None:
        if time.monotonic() > deadline:
            print(f"[hpcdl] the submission of this point's sweep did not finish within {HANDOVER_WAIT_S:.0f} s; "
                  "it does not run", file=sys.stderr, flush=True)
            return None
        time.sleep(0.5)
        manifest = read_json(folder / MANIFEST) or manifest
    return manifest if ready else None


def _all_ranks_done(folder: Path, plan: JobPlan, backend: Backend) -> bool:
    """Note that this rank returned; True for the rank that completes the set (the job is done only then).

    The marks carry the run (the scheduler's restart count): a rank of a run the scheduler ended does not count
    for the next.
    """
    if plan.world_size == 1:
        return True
    done = folder / RANKS_DONE
    done.mkdir(mode=0o700, exist_ok=True)
    run = backend.this_run()
    (done / f"{run}.{global_rank()}").touch()
    return len([mark for mark in done.iterdir() if mark.name.startswith(f"{run}.")]) >= plan.world_size


if __name__ == "__main__":
    run_job(sys.argv[1])
