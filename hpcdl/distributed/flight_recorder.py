"""PyTorch's flight recorder: each rank's record of the collectives it entered, dumped into the job folder and read
into which ranks are behind the newest collective the others entered.

The recorder is on in multi-rank jobs (the worker sets ``TORCH_FR_BUFFER_SIZE``). NCCL dumps it itself on a
collective timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``, into ``TORCH_FR_DUMP_TEMP_FILE`` + rank); a rank also dumps it
when asked for its stacks (``hpcdl.distributed.stacks``), so that a hang diagnosed before any timeout has it too:
NCCL's recorder for an NCCL default group, the CPU one (gloo's) else. A dump is a pickle of plain data, read
without loading any class (another user's job may have written it).
"""

from __future__ import annotations

import io
import pickle
import sys
from pathlib import Path
from typing import Any

from hpcdl.store.atomic import atomic_save
from hpcdl.store.files import NCCL_TRACE
from hpcdl.store.safety import read_job_file


def dump(folder: Path, rank: int) -> bool:
    """Write this rank's flight-recorder dump of its default process group's backend into ``folder``; False
    where torch.distributed is not in use here or the recorder cannot dump."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    import torch._C._distributed_c10d as c10d

    dumper = getattr(c10d, "_dump_nccl_trace" if dist.get_backend() == "nccl" else "_dump_fr_trace", None)
    if dumper is None:
        return False
    try:
        data = dumper(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    except (RuntimeError, TypeError):
        return False
    atomic_save(folder / f"{NCCL_TRACE}{rank}", lambda f: f.write(data))
    return True


class _DataOnly(pickle.Unpickler):
    """Unpickles plain data only (the flight recorder's dicts, lists, strings, numbers): no class is loaded."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def newest_collectives(folder: Path, world_size: int) -> dict[int, tuple[int, str]]:
    """Each rank's newest collective (sequence number, name) of the default process group in the flight
    recorder's dumps (one per rank); empty when there are none."""
    newest: dict[int, tuple[int, str]] = {}
    for rank in range(world_size):
        data = read_job_file(folder, f"{NCCL_TRACE}{rank}")
        if not data:
            continue
        try:
            dump = _DataOnly(io.BytesIO(data)).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError):
            continue
        entries = [e for e in dump.get("entries", []) if isinstance(e, dict) and _in_default_group(e)] \
            if isinstance(dump, dict) else []
        seqs = [(int(e.get("collective_seq_id") or 0), str(e.get("profiling_name", "?"))) for e in entries]
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
