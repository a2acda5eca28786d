"""The Slurm client commands the backend runs: from the login node (errors raised) and from inside a job
(answers empty on failure), always as from a login shell."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
from typing import Iterator

from hpcdl.errors import SubmissionError

QUERY_TIMEOUT_S = 30


def run_command(command: list[str], timeout_s: float = QUERY_TIMEOUT_S) -> str:
    """Run a Slurm client command; SubmissionError with its stderr when it fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env=submission_environment())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SubmissionError(f"{command[0]} failed: {e}") from e
    if done.returncode != 0:
        raise SubmissionError(f"{shlex.join(command)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def ask(command: list[str]) -> str:
    """A Slurm client command's output, asked from inside a job; empty when it cannot be run or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def is_queued(slurm_id: str) -> bool:
    """True while squeue still lists the job (running, completing, pending)."""
    try:
        return bool(run_command(["squeue", "-h", "-j", slurm_id, "-o", "%T"]).strip())
    except SubmissionError:  # no longer known to squeue
        return False


def submission_environment() -> dict[str, str]:
    """This environment without the SLURM_* variables of a job we may be running in (keeps SLURM_CONF)."""
    return {k: v for k, v in os.environ.items()
            if not (k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SUBMITIT_")) and k != "SLURM_CONF")}


@contextlib.contextmanager
def outside_any_job() -> Iterator[None]:
    """Submit as from a login shell even inside a job (submitit#1782): hide inherited SLURM_*."""
    saved, cleaned = dict(os.environ), submission_environment()
    os.environ.clear()
    os.environ.update(cleaned)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
