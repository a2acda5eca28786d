"""The local launcher: one process per worker on this machine, torchrun-style, failing fast.

Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. When one rank exits with an error or a signal, the others are
terminated at once and the launcher names that rank.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from hpcdl.distributed.env import free_port
from hpcdl.store.files import rank_log

POLL_S = 0.1
TERMINATE_WAIT_S = 10.0


def launch_local(command: Sequence[str], nprocs: int, env: Optional[dict[str, str]] = None,
                 logs: Optional[Path] = None,
                 on_failure: Optional[Callable[[int, int, int], None]] = None) -> tuple[int, str]:
    """Run ``command`` as ``nprocs`` ranks; returns (0, "") or (1, which rank failed and how).

    With ``logs``, each rank writes its stdout and stderr to files of its own there (``rank_log``).
    ``on_failure(rank, pid, exit code)`` is told of the first rank that failed (a signal's code is negative),
    before the others are ended.
    """
    port = str(free_port())
    processes = []
    with contextlib.ExitStack() as files:
        for rank in range(nprocs):
            rank_env = {**os.environ, **(env or {}), "RANK": str(rank), "WORLD_SIZE": str(nprocs),
                        "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": port}
            out, err = ((files.enter_context(open(rank_log(logs, rank, stream), "ab"))
                         for stream in ("stdout", "stderr")) if logs is not None else (None, None))
            processes.append(subprocess.Popen(list(command), env=rank_env, stdout=out, stderr=err))
    forward = lambda signum, _frame: [p.send_signal(signum) for p in processes if p.poll() is None]  # noqa: E731
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        while True:
            codes = [p.poll() for p in processes]
            failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                break
            if all(code == 0 for code in codes):
                return 0, ""
            time.sleep(POLL_S)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    rank, code = failed[0]
    if on_failure is not None:
        on_failure(rank, processes[rank].pid, code)
    for process in processes:  # fail fast: the survivors would wait on a lost peer
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + TERMINATE_WAIT_S
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
    how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return 1, f"rank {rank} of {nprocs} (pid {processes[rank].pid}) {how}"
