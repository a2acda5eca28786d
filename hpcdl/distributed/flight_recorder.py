"""PyTorch's flight recorder: each rank's record of the collectives it entered, dumped into the job folder and read
into which ranks are behind the newest collective the others entered.

The recorder is on in multi-rank jobs (the worker sets ``TORCH_FR_BUFFER_SIZE``). NCCL dumps it itself on a
collective timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``, into ``TORCH_FR_DUMP_TEMP_FILE`` + rank); a rank also dumps it
when asked for its stacks (``hpcdl.distributed.stacks``), so that a hang diagnosed before any timeout has it too:
NCCL's recorder for an NCCL default group, the CPU one (gloo's) else. A dump is a pickle of plain data, read
without loading any class (another user's job may have written it).
"""

from __future__ import annotations

import contextlib
import io
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from hpcdl.errors import HpcdlError
from hpcdl.store.atomic import atomic_save
from hpcdl.store.files import NCCL_TRACE
from hpcdl.store.safety import read_job_file


def _dumper() -> Optional[Callable[..., bytes]]:
    """The recorder's dump of this process's default group's backend; None where torch.distributed is not in use
    here or this torch has none."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        import torch._C._distributed_c10d as c10d

        return getattr(c10d, "_dump_nccl_trace" if dist.get_backend() == "nccl" else "_dump_fr_trace", None)
    except (ImportError, RuntimeError, ValueError):
        return None


def available() -> bool:
    """Whether this rank can dump a flight record."""
    return _dumper() is not None


def dump(folder: Path, rank: int) -> bool:
    """Write this rank's flight-recorder dump into ``folder``; False where it has none or the dump fails."""
    dumper = _dumper()
    if dumper is None:
        return False
    try:
        data = dumper(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    except Exception:  # noqa: BLE001 - a recorder that cannot dump leaves the verdict to the stacks
        return False
    atomic_save(dump_path(folder, rank), lambda f: f.write(data))
    return True


def dump_path(folder: Path, rank: int) -> Path:
    """Rank ``rank``'s dump in the job folder (where NCCL's own dump on a timeout lands too)."""
    return folder / f"{NCCL_TRACE}{rank}"


def remove_dumps(folder: Path, world_size: int) -> None:
    """Remove every rank's dump: what a later verdict reads is then the newest moment's."""
    for rank in range(world_size):
        with contextlib.suppress(OSError):
            dump_path(folder, rank).unlink()


def wait_for_dumps(folder: Path, ranks: Iterable[int], wait_s: float) -> None:
    """Wait up to ``wait_s`` until each of ``ranks`` has a dump in ``folder``."""
    deadline = time.monotonic() + wait_s
    while any(not dump_path(folder, rank).exists() for rank in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)


class _DataOnly(pickle.Unpickler):
    """Unpickles plain data only (the flight recorder's dicts, lists, strings, numbers): no class is loaded."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def newest_collectives(folder: Path, world_size: int) -> dict[int, tuple[int, str]]:
    """Each rank's newest collective (sequence number, name) of the default process group in the flight
    recorder's dumps (one per rank); empty when there are none."""
    newest: dict[int, tuple[int, str]] = {}
    for rank in range(world_size):
        try:
            data = read_job_file(folder, dump_path(folder, rank).name)
            if not data:
                continue
            record = _DataOnly(io.BytesIO(data)).load()
            entries = [e for e in record.get("entries", []) if isinstance(e, dict) and _in_default_group(e)] \
                if isinstance(record, dict) else []
            seqs = [(int(e.get("collective_seq_id") or 0), str(e.get("profiling_name", "?"))) for e in entries]
        except (OSError, HpcdlError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
                IndexError, KeyError):
            continue  # unreadable, unsafe or not a dump: that rank gave none
        newest[rank] = max(seqs) if seqs else (0, "none")
    return newest


def _in_default_group(entry: dict[str, Any]) -> bool:
    """Whether a flight-recorder entry is of the default process group (the trainer's, DDP's): sequence numbers
    count per group, so only one group's are compared."""
    group = entry.get("process_group")
    return entry.get("pg_id") == 0 or (isinstance(group, (list, tuple)) and bool(group) and str(group[0]) == "0")


def lagging_ranks(newest: dict[int, tuple[int, str]], world_size: int) -> list[int]:
    """The ranks behind the newest collective any dumped rank entered (those that dumped none included)."""
    if not newest:
        return []
    top = max(newest.values())[0]
    return sorted(rank for rank in range(world_size) if newest.get(rank, (-1, ""))[0] < top)


def missing_ranks(newest: dict[int, tuple[int, str]], world_size: int) -> str:
    """One line from each dumped rank's newest (collective sequence number, name)."""
    if not newest:
        return ""
    top, name = max(newest.values())
    missing = lagging_ranks(newest, world_size)
    if not missing:
        return f"flight recorder: every rank of {len(newest)} dumped reached collective #{top} ({name})"
    undumped = [rank for rank in missing if rank not in newest]
    return (f"flight recorder: rank(s) {','.join(map(str, missing))} missing from collective #{top} ({name})"
            + (f"; no dump from rank(s) {','.join(map(str, undumped))}" if undumped else ""))
