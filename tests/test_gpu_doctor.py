"""The job doctor's GPU parts on a GPU machine (skipped without CUDA): NCCL's flight recorder, as a rank dumps it
on a hang, read back into the verdict's words.

    python -m pytest -q tests/test_gpu_doctor.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpcdl.distributed.env import free_port
from hpcdl.distributed.flight_recorder import missing_ranks, newest_collectives

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NCCL_RANK = """
import sys, torch, torch.distributed as dist
from pathlib import Path
from hpcdl.distributed import flight_recorder
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1,
                        device_id=torch.device("cuda:0"))
for _ in range(3):
    dist.all_reduce(torch.ones(1024, device="cuda"))
torch.cuda.synchronize()
print("dumped" if flight_recorder.dump(Path(sys.argv[2]), 0) else "no dump")
dist.destroy_process_group()
"""


def test_an_nccl_ranks_flight_recorder_dump_is_written_and_read_into_the_verdicts_words(tmp_path: Path) -> None:
    """One NCCL rank (one GPU lent: NCCL refuses two ranks on one GPU) with the recorder on as the worker sets it
    makes three all-reduces and dumps its recorder as on a hang: the plain-data reader finds collective #3 of the
    default group, named as NCCL names it; a second rank that dumped none is the one missing."""
    script = tmp_path / "nccl_rank.py"
    script.write_text(NCCL_RANK)
    done = subprocess.run([sys.executable, str(script), str(free_port()), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TORCH_FR_BUFFER_SIZE": "2000",
                                                       "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0 and done.stdout.strip() == "dumped", (done.stdout, done.stderr[-3000:])
    newest = newest_collectives(tmp_path, 1)
    assert newest == {0: (3, "nccl:all_reduce")}, newest
    assert missing_ranks(newest, 2) == \
        "flight recorder: rank(s) 1 missing from collective #3 (nccl:all_reduce); no dump from rank(s) 1"
