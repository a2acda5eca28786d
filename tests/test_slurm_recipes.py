"""The README's recipes for code written for other launchers, on the real test cluster: a torchvision-reference-style
script (torchrun's variables, gloo on CPU; NCCL where a GPU is) and a PyTorch Lightning script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpcdl.lifecycle.job import Job
from tests.reference_script import LIGHTNING_SCRIPT, SCRIPT
from tests.test_slurm import slurm_cluster  # noqa: F401  (the cluster must answer)

pytestmark = pytest.mark.slurm


def _submit(user: Path, *args: str) -> Job:
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "cluster=slurm", "cluster.time=00:10:00", *args],
                          capture_output=True, text=True, timeout=300, cwd=user)
    assert done.returncode == 0, done.stderr
    return Job.attach(done.stdout.split()[2])


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="NCCL needs a GPU on each rank"))])
def test_a_torchvision_reference_style_script_trains_on_two_nodes(store: Path, tmp_path: Path, backend: str) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "train.py").write_text(SCRIPT)
    gpus = ["cluster.gpus_per_node=1"] if backend == "nccl" else []
    job = _submit(user, "cluster.nodes=2", "script=train.py", *gpus, "--", "--dist-backend", backend,
                  "--output-dir", "out")
    assert job.wait(timeout=300) == "COMPLETED", job.error()
    for rank in (0, 1):
        assert f"rank {rank}/2 epoch 1 loss" in job.logs(rank)
    assert torch.load(job.folder / "results" / "out" / "checkpoint.pth", weights_only=True)["epoch"] == 1


def test_a_lightning_script_trains_with_devices_and_num_nodes_matching_the_profile(store: Path,
                                                                                   tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    user = tmp_path / "user"
    user.mkdir()
    (user / "fit.py").write_text(LIGHTNING_SCRIPT)
    job = _submit(user, "cluster.nodes=2", "cluster.tasks_per_node=1", "script=fit.py", "--",
                  "--devices", "1", "--num-nodes", "2")
    assert job.wait(timeout=300) == "COMPLETED", job.error()
    for rank in (0, 1):
        assert f"lightning rank {rank} of 2 via SLURMEnvironment" in job.logs(rank)
    assert (job.folder / "results" / "out" / "final.ckpt").is_file()
