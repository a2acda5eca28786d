"""The rank side of your own code: an entry function or a script on every rank, each with the variables
torchrun sets, so that code written for torchrun runs unchanged on one node or several."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpcdl.distributed import heartbeat
from hpcdl.distributed.env import discover, free_port
from hpcdl.errors import HpcdlError
from hpcdl.plan import JobPlan
from hpcdl.resumable import SCRIPT_RANK, STOP_FLAG, stopped_script_step
from hpcdl.snapshot import in_snapshot
from hpcdl.store.atomic import atomic_write_text, make_folder
from hpcdl.store.files import RESULTS_DIR
from hpcdl.train.stopping import STOP_SIGNAL, StopRequested


class ScriptFailed(HpcdlError):
    """The user's script exited with an error on this rank."""


def torchrun_variables(folder: Path) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT for this rank: from hpcdl's
    launcher, MPI or Slurm's tasks (rank 0 publishes its address in the job folder)."""
    env = discover(folder)
    port = env.master_port if env.world_size > 1 else free_port()
    return {"RANK": str(env.rank), "WORLD_SIZE": str(env.world_size), "LOCAL_RANK": str(env.local_rank),
            "LOCAL_WORLD_SIZE": str(env.local_world_size), "MASTER_ADDR": env.master_addr or "127.0.0.1",
            "MASTER_PORT": str(port)}


def listen_for_script_stop(folder: Path) -> None:
    """A script's rank: the stop signal raises the flag the script reads (hpcdl.stop_requested)."""
    signal.signal(STOP_SIGNAL, lambda _signum, _frame: atomic_write_text(folder / STOP_FLAG, heartbeat.run_token()))


def run_user_code(folder: Path, plan: JobPlan, manifest: dict[str, Any]) -> Any:
    """Run the plan's entry (returns its value) or script (returns None; a failure raises ScriptFailed)."""
    os.environ.update(torchrun_variables(folder))
    os.environ["HPCDL_RESULTS_DIR"] = str(make_folder(folder / RESULTS_DIR))
    if plan.kind == "entry":
        from hpcdl.config.targets import locate

        return locate(plan.command[0], "entry")(plan.config)
    script, *arguments = plan.command
    flag = signal.signal(STOP_SIGNAL, signal.SIG_IGN)  # the script inherits this: the stop signal never kills it
    try:  # a signal in these few milliseconds is lost; before and after, listen_for_script_stop takes it
        process = subprocess.Popen([sys.executable, in_snapshot(script, folder, manifest), *arguments],
                                   env={**os.environ, SCRIPT_RANK: "1"})
    finally:
        signal.signal(STOP_SIGNAL, flag)
    heartbeat.follow(process.pid)  # a stopped script stops this rank's heartbeat
    code = process.wait()
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise ScriptFailed(f"rank {os.environ['RANK']}: {Path(plan.command[0]).name} {how}")
    step = stopped_script_step(folder)
    if step is not None:
        raise StopRequested(step)
    return None
