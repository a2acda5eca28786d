"""The rank side of your own code: a function (hpcdl.batch), an entry function or a script on every rank, each
with the variables torchrun sets, so that code written for torchrun runs unchanged on one node or several, and
each in the job's results folder, so that what it writes under relative paths comes back with ``jobs fetch``.
A failure is told by the user's own traceback (a script's from its stderr), not by hpcdl's frames around it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Optional

from hpcdl.distributed import heartbeat, script_steps, stacks
from hpcdl.distributed.env import discover, free_port
from hpcdl.errors import HpcdlError
from hpcdl.plan import JobPlan
from hpcdl.resumable import SCRIPT_RANK, stopped_script_step
from hpcdl.snapshot import in_snapshot
from hpcdl.store.atomic import atomic_write_text, make_folder
from hpcdl.store.files import FUNCTION, RESULTS_DIR, STOP_FLAG
from hpcdl.store.safety import load_pickle
from hpcdl.train.stopping import STOP_SIGNAL, StopRequested


STDERR_TAIL_BYTES = 65536
"""How much of a script's stderr its rank keeps to find the script's traceback in."""
TRACEBACK_START = "Traceback (most recent call last):"
RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
"""What PyTorch writes before each line of an uncaught exception once a process group is up."""
CHAINED = ("During handling of the above exception, another exception occurred:",
           "The above exception was the direct cause of the following exception:")


class ScriptFailed(HpcdlError):
    """The user's script exited with an error on this rank; ``user_traceback`` is the script's own (or the last
    lines of its stderr when it printed none)."""

    def __init__(self, message: str, user_traceback: str) -> None:
        super().__init__(message)
        self.user_traceback = user_traceback


def torchrun_variables(folder: Path) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT for this rank: from hpcdl's
    launcher, MPI or Slurm's tasks (rank 0 publishes its address in the job folder)."""
    env = discover(folder)
    port = env.master_port if env.world_size > 1 else free_port()
    return {"RANK": str(env.rank), "WORLD_SIZE": str(env.world_size), "LOCAL_RANK": str(env.local_rank),
            "LOCAL_WORLD_SIZE": str(env.local_world_size), "MASTER_ADDR": env.master_addr or "127.0.0.1",
            "MASTER_PORT": str(port), "GROUP_RANK": str(env.rank // env.local_world_size),
            "GROUP_WORLD_SIZE": str(env.world_size // env.local_world_size)}


def listen_for_script_stop(folder: Path) -> None:
    """A script's rank: the stop signal raises the flag the script reads (hpcdl.stop_requested)."""
    signal.signal(STOP_SIGNAL, lambda _signum, _frame: atomic_write_text(folder / STOP_FLAG, heartbeat.run_token()))


def run_user_code(folder: Path, plan: JobPlan, manifest: dict[str, Any]) -> Any:
    """Run the plan's function or entry (returns its value) or script (returns None; a failure raises
    ScriptFailed) with torchrun's variables, in the job's results folder."""
    os.environ.update(torchrun_variables(folder))
    results = make_folder(folder / RESULTS_DIR)
    os.environ["HPCDL_RESULTS_DIR"] = str(results)
    if plan.kind == "function":
        fn, args, kwargs = load_pickle(folder, FUNCTION)
        os.chdir(results)  # imports come from absolute paths: the code snapshot's, or the submitting folder's
        return fn(*args, **kwargs)
    if plan.kind == "entry":
        from hpcdl.config.targets import locate

        entry = locate(plan.command[0], "entry")
        os.chdir(results)
        return entry(plan.config)
    script, *arguments = plan.command
    steps, variables = script_steps.open_channel(heartbeat.stepped, heartbeat.steps_ended)  # its hpcdl.report
    flag = signal.signal(STOP_SIGNAL, signal.SIG_IGN)  # the script inherits this: the stop signal never kills it
    try:  # a signal in these few milliseconds is lost; before and after, listen_for_script_stop takes it
        # python puts the script's own folder (in the snapshot) first on its path: its sibling modules import
        process = subprocess.Popen([sys.executable, in_snapshot(script, folder, manifest), *arguments],
                                   env={**os.environ, SCRIPT_RANK: "1", **variables}, cwd=results,
                                   stderr=subprocess.PIPE, pass_fds=(steps,))
    finally:
        signal.signal(STOP_SIGNAL, flag)
        os.close(steps)
    stderr_tail = bytearray()
    passing_on = threading.Thread(target=_pass_on, args=(process.stderr, stderr_tail), daemon=True)
    passing_on.start()
    heartbeat.follow(process.pid)  # a stopped script stops this rank's heartbeat
    stacks.follow(process.pid)  # its stack is the script's
    code = process.wait()
    passing_on.join()
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise ScriptFailed(f"rank {os.environ['RANK']}: {Path(plan.command[0]).name} {how}",
                           last_traceback(stderr_tail.decode(errors="replace")))
    step = stopped_script_step(folder)
    if step is not None:
        raise StopRequested(step)
    return None


def _pass_on(stream: IO[bytes], tail: bytearray) -> None:
    """Copy a script's stderr to this rank's as it comes, keeping its last STDERR_TAIL_BYTES in ``tail``."""
    while chunk := os.read(stream.fileno(), 65536):
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()
        tail += chunk
        del tail[:-STDERR_TAIL_BYTES]


def last_traceback(stderr: str, lines_without: int = 20) -> str:
    """The last Python traceback in ``stderr`` (with the exceptions chained to it) up to the end, without the
    ``[rankN]: `` PyTorch puts before each line once a process group is up; the last ``lines_without`` lines
    when it holds none."""
    lines = [RANK_PREFIX.sub("", line) for line in stderr.rstrip("\n").splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK_START)]
    if not starts:
        return "\n".join(lines[-lines_without:])
    first = starts[-1]
    for start in reversed(starts[:-1]):  # "During handling of the above exception" joins two tracebacks
        if not any(line in CHAINED for line in lines[start:first]):
            break
        first = start
    return "\n".join(lines[first:])


def user_traceback(error: BaseException) -> str:
    """The traceback that explains a failure of the user's code: a script's own from its stderr, else ``error``'s
    without hpcdl's frames around the user's code (all of it when no frame is theirs)."""
    if isinstance(error, ScriptFailed):
        return error.user_traceback
    package = Path(__file__).parent
    frames: Optional[TracebackType] = error.__traceback__
    while frames is not None and Path(frames.tb_frame.f_code.co_filename).is_relative_to(package):
        frames = frames.tb_next
    if frames is None:
        frames = error.__traceback__
    return "".join(traceback.format_exception(type(error), error, frames)).rstrip("\n")
