"""The names of the files in a job folder, defined once for the submit side, the ranks and the readers."""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST = "manifest.json"
"""What was submitted: the job plan, overrides, time, host, git commit; written atomically at submission."""
STATUS = "status.json"
"""The running job's own view of its state, written by its lead rank."""
FINAL = "final.json"
"""The job's final state: created once, by whichever rank, launcher, cancel or listing ended it first."""
MODEL = "model.pt"
"""The trained network's state dict (loads with torch.load(weights_only=True))."""
INFO = "info.json"
"""Every iteration's and validation's record (TrainingInfo)."""
RESULT = "result.json"
"""The training summary."""
METRICS = "metrics.jsonl"
"""One JSON line per iteration and validation, appended as training goes."""
REPORT_FIELDS = ("kind", "epoch", "iteration", "loss", "accuracy", "total", "time_s")
"""The fields of an hpcdl.report record in METRICS; any other is a number of the user's own."""
METRICS_SUMMARY = "metrics-summary.json"
"""What listings show of metrics.jsonl (counts, last iteration, best validation), kept by the run as it writes."""
PLOT = "training-progress.png"
"""The training-progress plot."""
TENSORBOARD = "tensorboard"
"""The folder of the run's TensorBoard event files (hpcdl.view.tensorboard); a rank's own values in rankN/."""
EVENT_FILES = "events.out.tfevents.*"
"""In TENSORBOARD: the event files TensorBoard's writer names (a glob)."""
CONFUSION = "confusion.json"
"""The trained network's confusion matrix on the validation data (classes, counts), written by the trainer."""
WATCH_PLOT = "{id}-progress.png"
"""Not in the job folder: where jobs watch ID --plot keeps the progress plot by default, in the current folder."""
REPORT_PAGE = "report.html"
"""The experiment page of a job or sweep (python -m hpcdl.jobs report), one self-contained HTML file."""
CHECKPOINTS = "checkpoints"
"""The folder of checkpoints."""
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d{9})\.pt$")
"""A checkpoint's file in CHECKPOINTS: the iteration it was taken after, in 9 digits."""
RANKS_DONE = "ranks-done"
"""One empty file per rank that returned; the rank that completes the set writes COMPLETED."""
LOGS = "logs"
"""The folder of a local job's stdout.log and stderr.log (stream_log; each rank's: rank_log), a runner's runner.log."""
RANK_LOG = "rank{rank}.{stream}.log"
"""In LOGS: rank ``rank``'s stdout or stderr when the job's ranks were started on this machine (rank_log)."""
RUNNER_LOG = "runner.log"
"""In LOGS of a local sweep: the output of the runner that runs its points."""
HEARTBEATS = "heartbeats"
"""Each rank's rankN.json, rewritten every few seconds while it lives (hpcdl.distributed.heartbeat)."""
HEARTBEAT = "rank{rank}.json"
"""A rank's heartbeat file in HEARTBEATS."""
FAILURES = "failures"
"""Each failed rank's record as FAILURE: time, rank, host, pid, exception, message, traceback, cause or victim
(hpcdl.distributed.failures); ``jobs why`` reads them."""
FAILURE = "rank{rank}.json"
"""A rank's failure record in FAILURES."""
STACKS = "rank-stacks"
"""The Python stacks of every rank as STACK, written when asked for by STACKS_REQUEST (a hang, ``jobs stacks``)."""
STACK = "rank{rank}.json"
"""A rank's stacks in STACKS: its main thread's frames and the other threads' text, with the request answered."""
STACKS_REQUEST = "request.json"
"""In STACKS: the newest request for the ranks' stacks (its id); each rank answers it once."""
NCCL_TRACE = "nccl-trace-rank"
"""In the job folder, followed by the rank: NCCL's flight recorder dump on a GPU job's collective timeout
(TORCH_FR_DUMP_TEMP_FILE)."""
PACE = "pace"
"""Each rank's rankN.jsonl: its pace (steps, step time, its own share of it, data wait) every few seconds, with
the start and end of each run (hpcdl.distributed.pace; read by hpcdl.store.pace)."""
PACE_RANK = "rank{rank}.jsonl"
"""A rank's pace file in PACE."""
PREFLIGHT = "preflight-results"
"""Each node's preflight.json: the checks it ran on itself before the ranks met (hpcdl.distributed.preflight)."""
PREFLIGHT_NODE = "{node}.preflight.json"
"""A node's checks in PREFLIGHT (its Slurm node name, checked to be a plain name)."""
BAD_NODES = ".bad-nodes-{uid}.json"
"""In a store: the nodes that failed a preflight of this user's jobs, each until when it is left out
(hpcdl.store.badnodes)."""
RENDEZVOUS = "rendezvous-{key}.json"
"""Rank 0's address and port for the others of one run (hpcdl.distributed.env)."""
STOP_FLAG = "stop-requested"
"""In the job folder, holding the run token: the worker of a script's rank got the stop signal."""
STOPPED_AT = "stopped-at-rank{rank}.json"
"""In the job folder: the step a script's rank stopped after (``hpcdl.stop``), with the run token."""
HYDRA_TASK = "hydra-task-{num}.pkl"
"""In a sweep's folder: the Hydra context and task function its points from ``num`` on run (hpcdl.sweep.launch)."""
FUNCTION = "function.pkl"
"""hpcdl.batch: the pickled (fn, args, kwargs)."""
SLURM_FILES = "slurm"
"""In a Slurm job's or sweep's folder: its sbatch or array scripts, submitit's pickles and each task's logs
(%A_%a_%t_log.out); in a pool's folder, its holder's log."""
HYDRA_RECORD = ".hydra"
"""In a sweep point's folder: Hydra's record of the point (config.yaml, hydra.yaml, overrides.yaml), as Hydra's
own launchers write it."""
CODE = "code"
"""The snapshot of the submitting folder's code that the ranks run from."""
RESULTS_DIR = "results"
"""User code's results folder (HPCDL_RESULTS_DIR on every rank), fetched with the job."""
FUNCTION_RESULT = "result.pkl"
"""hpcdl.batch: the pickled return value."""
RANK_RESULTS = "rank-results"
"""hpcdl.batch(all_ranks=True): each rank's pickled return value, as N.pkl."""
SUMMARY_CSV = "sweep-summary.csv"
"""In a sweep's folder: one row per point (jobs sweep --csv)."""
SUMMARY_PLOT = "sweep-curves.png"
"""In a sweep's folder: the points' curves in one plot (jobs sweep --plot)."""
MULTIRUN = "multirun.yaml"
"""In a sweep's folder: Hydra's record of the sweep's definition."""
CANCELLED_MARK = "cancelled"
"""A file in a sweep's folder once it was cancelled: later batches of its sweeper are refused."""
INDEX_HEAD = "head.jsonl"
"""In a store's index folder: what the index knows of the store and the rows read at every listing
(hpcdl.store.segments)."""
INDEX_SEGMENT = "ended-{number}.jsonl"
"""In a store's index folder: one segment of ended jobs' rows (hpcdl.store.segments)."""
INDEX_CHANGES = "changed-{token}.list"
"""In a store's index folder: the ids of many jobs whose state changed together, one a line (a sweep's points
cancelled at once: hpcdl.store.changes)."""
INDEX_ROWS = "rows.jsonl"
"""In a store's index folder: the rows of the index's first version, removed when the index is written."""
REMOTE = ".remote-{uid}"
"""In a client's store: the jobs this user submitted to login nodes over SSH (REMOTE_JOB) and what they last saw
there; theirs alone (0700, checked at every use: a shared store's co-users cannot plant a login node's options)."""
REMOTE_JOB = "job-{id}.json"
"""In REMOTE: a remote job's profile name and how to reach its login node."""
REMOTE_LISTING = "listing-{profile}.json"
"""In REMOTE: the last jobs list seen on a remote profile's login node (shown, marked, while it is unreachable)."""
REMOTE_TREE = "sent-{profile}.json"
"""In REMOTE: the code files last sent to a remote profile's login node (names and digests), and the key of the
tree kept there."""
POOLS = ".pools-{uid}"
"""In a store: this user's held pools (python -m hpcdl.pool), one folder each; theirs alone (0700, checked at every
use), as the jobs' folders are."""
POOL_RECORD = "pool.json"
"""In a pool's folder: its name, profile, scheduler id, idle timeout and when it was started or stopped."""
POOL_SCRIPT = "holder.sh"
"""In a pool's folder: the script of the held job, which sleeps until the pool is idle for its idle timeout."""
POOL_LOG = "holder.log"
"""In a pool's folder: the held job's own output."""
POOL_USED = "last-used"
"""In a pool's folder: touched at every submission to the pool (the holder counts it as use)."""
POOL_RELEASED = "released.json"
"""In a pool's folder: written by the holder as it ends itself after its idle timeout."""
POOL_RELEASING = "releasing"
"""In a pool's folder: the holder's announcement that it is about to release the pool (hpcdl.store.pools.claim_use):
it releases only if the use mark did not change while this stood, then writes POOL_RELEASED and removes it."""
POOL_JOB = "job-{id}"
"""In a pool's folder: one empty file per job submitted to the pool."""
STEP_LOG = "step-{rank}.{suffix}"
"""In a job's slurm/ folder: rank ``rank``'s stdout (out) or stderr (err) when the job ran as a step of a pool."""
RESULTS = (MODEL, INFO, RESULT, METRICS, PLOT)
"""What jobs fetch copies of a training job."""


def stream_log(stream: str) -> str:
    """A job's stdout.log or stderr.log in LOGS (``stream``: 'stdout' or 'stderr')."""
    return f"{stream}.log"


def rank_result(rank: int) -> str:
    """Rank ``rank``'s pickled return value in the job folder (hpcdl.batch(all_ranks=True))."""
    return f"{RANK_RESULTS}/{rank}.pkl"


def checkpoint_file(folder: Path, iteration: int) -> Path:
    """The file of the checkpoint taken after ``iteration`` in ``folder``."""
    return folder / f"checkpoint-{iteration:09d}.pt"


def checkpoint_files(folder: Path) -> list[tuple[int, Path]]:
    """(iteration, file) of every checkpoint in ``folder``, oldest first; none when there is no such folder."""
    found = []
    for path in folder.iterdir() if folder.is_dir() else ():
        match = CHECKPOINT_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def rank_log(logs: Path, rank: int, stream: str) -> Path:
    """Where rank ``rank``'s stdout or stderr goes when the launcher is given a logs folder."""
    return logs / RANK_LOG.format(rank=rank, stream=stream)
