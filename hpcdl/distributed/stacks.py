"""Every rank's Python stacks on request, grouped by identical stack, and the group that is not where the others are.

Each rank runs a thread that looks for ``rank-stacks/request.json`` every second; on a request it has not answered it
writes ``rank-stacks/rankN.json``: its main thread's frames (``sys._current_frames``: a rank waiting in a collective,
sleeping or looping in Python still answers; one that does not has stopped heartbeating too) and its other
threads' text. A script's rank gives the script's own stack from ``py-spy dump`` where py-spy is installed. The
requests go through the job folder, so that one mechanism reaches every rank on every node, under any launcher
(hpcdl's, srun, mpirun); on a hang each rank writes its flight-recorder dump too. On a hang
(``hpcdl.distributed.hangs``) and with ``jobs stacks`` the ranks' stacks are grouped: the ranks waiting in the
same collective make one group, and a rank elsewhere (still computing, sleeping, stuck in I/O) is the outlier the
others wait for.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Optional

from hpcdl.distributed import flight_recorder
from hpcdl.distributed.env import node_name
from hpcdl.errors import FolderGoneError, HpcdlError
from hpcdl.store.atomic import atomic_write_text, make_folder
from hpcdl.store.files import STACK, STACKS, STACKS_REQUEST
from hpcdl.store.folders import read_json

POLL_S = 1.0
"""How often each rank looks for a request."""
PY_SPY_TIMEOUT_S = 20
COLLECTIVES = re.compile(r"^(all_reduce|allreduce|all_gather\w*|reduce_scatter\w*|broadcast|barrier|reduce|gather|"
                         r"scatter|all_to_all\w*|monitored_barrier|wait|send|recv|_wait_for_\w+|Allreduce|Bcast|"
                         r"Barrier|Reduce|Gather|Allgather|Wait|Waitall|allgather|bcast|barrier)$")
"""Frame names of a rank waiting in a collective (torch.distributed, mpi4py)."""
GRADIENT_EXCHANGES = {("torch/autograd/graph.py", "_engine_run_backward"): "backward (DDP's gradient all-reduce)",
                      ("hpcdl/distributed/allreduce.py", "finish"): "Waitall (the mpi4py gradient all-reduce)"}
"""The built-in trainer's gradient exchange, by (the end of its file's path, frame name), the innermost frame: it
waits in native code below these frames (DDP's reducer inside autograd's engine; mpi4py's Waitall, which leaves
no Python frame of its own)."""

_script: list[int] = []


def follow(pid: int) -> None:
    """This rank runs a script as process ``pid``: its stack is the one to give (with py-spy)."""
    _script.append(pid)


def serve(folder: Path, rank: int) -> None:
    """Start this rank's thread that answers requests for its stacks."""
    threading.Thread(target=_serve, args=(folder, rank), name="hpcdl-stacks", daemon=True).start()


def _serve(folder: Path, rank: int) -> None:
    answered = _request_id(folder)  # one made before this rank started is not for it
    while True:
        time.sleep(POLL_S)
        asked = _request_id(folder)
        if asked is not None and asked != answered:
            answered = asked
            with contextlib.suppress(OSError, FolderGoneError, HpcdlError):
                dump(folder, rank, asked)
                if _request(folder).get("flight"):  # after the stacks, which a dump that blocks cannot keep back
                    flight_recorder.dump(folder, rank)


def _request(folder: Path) -> dict[str, Any]:
    try:
        found = read_json(folder / STACKS / STACKS_REQUEST)
    except (OSError, ValueError, HpcdlError):
        return {}
    return found if isinstance(found, dict) else {}


def _request_id(folder: Path) -> Optional[str]:
    found = _request(folder).get("id")
    return None if found is None else str(found)


def request(folder: Path, flight: bool = False) -> str:
    """Ask every rank of the job in ``folder`` for its stacks (``flight``: and its flight-recorder dump, which
    a verdict reads: asked on a hang only, not of a healthy job); returns the request's id."""
    asked = uuid.uuid4().hex
    make_folder(folder / STACKS)
    atomic_write_text(folder / STACKS / STACKS_REQUEST, json.dumps({"id": asked, "time": time.time(),
                                                                   "flight": flight}))
    return asked


def dump(folder: Path, rank: int, asked: str) -> None:
    """Write this rank's stacks as the answer to request ``asked``."""
    frames = sys._current_frames()
    main = threading.main_thread()
    stack = [[f.filename, f.lineno, f.name, f.line or ""] for f in traceback.extract_stack(frames[main.ident])] \
        if main.ident in frames else []
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    others = {f"{names.get(ident, ident)}": "".join(traceback.format_stack(frame))
              for ident, frame in frames.items() if ident not in (main.ident, threading.get_ident())}
    entry: dict[str, Any] = {"request": asked, "time": time.time(), "rank": rank, "host": node_name(),
                             "pid": os.getpid(), "main": stack, "threads": others,
                             "flight": flight_recorder.available()}  # a flight-recorder dump will follow
    if _script:
        entry["script_pid"] = _script[-1]
        entry["main"], entry["script"] = script_stack(_script[-1])
    make_folder(folder / STACKS)
    atomic_write_text(folder / STACKS / STACK.format(rank=rank), json.dumps(entry))


def script_stack(pid: int) -> tuple[list[list[Any]], str]:
    """A script's main thread frames (oldest first) and py-spy's whole text; none and a note without py-spy."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return [], "(the script's stack needs py-spy: pip install py-spy)"
    try:
        done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=PY_SPY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"(py-spy dump failed: {e})"
    text = done.stdout if done.returncode == 0 else f"(py-spy dump failed: {done.stderr.strip()})"
    return _py_spy_main(text), text


def _py_spy_main(text: str) -> list[list[Any]]:
    """The first thread's frames in py-spy's dump (``    name (file:line)``, innermost first), oldest first."""
    frames: list[list[Any]] = []
    for line in text.splitlines():
        if line.startswith("Thread ") and frames:
            break
        found = re.match(r"^\s+(\S.*?) \((.+):(\d+)\)$", line)
        if found:
            frames.append([found.group(2), int(found.group(3)), found.group(1), ""])
    return frames[::-1]


def collect(folder: Path, asked: str, world_size: int, wait_s: float) -> dict[int, dict[str, Any]]:
    """The ranks' answers to request ``asked``, waiting up to ``wait_s`` for all ``world_size`` of them."""
    deadline = time.monotonic() + wait_s
    while True:
        found = answers(folder, world_size, asked)
        if len(found) == world_size or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def answers(folder: Path, world_size: int, asked: Optional[str] = None) -> dict[int, dict[str, Any]]:
    """Rank -> its stacks file (to request ``asked`` alone when given; else the newest request's answers)."""
    if asked is None:
        asked = _request_id(folder)
    found = {}
    for rank in range(world_size):
        with contextlib.suppress(OSError, ValueError, HpcdlError):
            entry = read_json(folder / STACKS / STACK.format(rank=rank))
            if isinstance(entry, dict) and entry.get("request") == asked and isinstance(entry.get("main"), list):
                found[rank] = entry
    return found


def groups(stacks: dict[int, dict[str, Any]]) -> list[tuple[list[int], list[list[Any]]]]:
    """(ranks, main stack) of each group of identical stacks: the biggest group first."""
    by_stack: dict[str, tuple[list[int], list[list[Any]]]] = {}
    for rank, entry in sorted(stacks.items()):
        key = json.dumps([frame[:3] for frame in entry["main"]])
        by_stack.setdefault(key, ([], entry["main"]))[0].append(rank)
    return sorted(by_stack.values(), key=lambda group: (-len(group[0]), group[0]))


def in_collective(stack: list[list[Any]]) -> Optional[str]:
    """The collective a stack waits in (its innermost frame so named, or the trainer's gradient exchange), None
    when it waits in none."""
    if stack:
        file, name = str(stack[-1][0]).replace(os.sep, "/"), str(stack[-1][2])
        for (ending, frame), exchange in GRADIENT_EXCHANGES.items():
            if name == frame and file.endswith("/" + ending):
                return exchange
    for frame in reversed(stack[-4:]):
        if COLLECTIVES.match(str(frame[2])):
            return str(frame[2])
    return None


def outliers(found: list[tuple[list[int], list[list[Any]]]]) -> list[tuple[list[int], list[list[Any]]]]:
    """The groups the others wait for: those not in a collective while another group is; with no collective
    told, every group but the biggest (none when all ranks are in one group)."""
    if len(found) < 2:
        return []
    waiting = [group for group in found if in_collective(group[1])]
    if waiting:
        return [group for group in found if not in_collective(group[1])]
    return found[1:]


def format_stack(stack: list[list[Any]]) -> str:
    """A stack in Python's traceback layout, oldest frame first."""
    return "".join(f'  File "{file}", line {line}, in {name}\n' + (f"    {code}\n" if code else "")
                   for file, line, name, code in stack).rstrip("\n")
