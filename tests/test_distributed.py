"""Distributed training on CPU: gloo and mpi4py ranks give the weights of one process on the same batches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpcdl import ConfigError, TrainingOptions, train_network
from hpcdl.config.compose import compose_config
from hpcdl.distributed.context import DistContext
from hpcdl.distributed.env import DistEnv
from hpcdl.distributed.launch import launch_local
from hpcdl.config.environment import network_environment
from hpcdl.config import NetworkConfig
from hpcdl.plan import resolve
from hpcdl.distributed.shares import shares
from hpcdl.train.loop import epoch_chunks
from hpcdl.distributed.shares import scaled_learn_rate
from tests.distributed_training import STEPS_OPTIONS, problem

ROOT = Path(__file__).resolve().parent.parent
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}  # CPU workers (gloo) even on a GPU machine
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
           **CPU_ONLY}


def single_process_weights() -> dict[str, torch.Tensor]:
    data, model = problem()
    model, _ = train_network(data, model, TrainingOptions(execution_environment="cpu", **STEPS_OPTIONS))
    return model.state_dict()


def assert_same_weights(path: Path) -> None:
    expected = single_process_weights()
    got = torch.load(path, weights_only=True)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6)


def _command(out: Path, load: str, comm: str) -> list[str]:
    return [sys.executable, "-m", "tests.distributed_training", str(out), "--load", load, "--comm", comm]


@pytest.mark.parametrize(("ranks", "load"), [(2, "1,1"), (3, "1,0,2")])
def test_gloo_ranks_match_one_process(tmp_path: Path, ranks: int, load: str) -> None:
    out = tmp_path / "weights.pt"
    code, failure = launch_local(_command(out, load, "torch"), ranks, CPU_ONLY)
    assert code == 0, failure
    assert_same_weights(out)


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
@pytest.mark.parametrize(("ranks", "load"), [(2, "1,1"), (3, "2,0,1")])
def test_mpi4py_ranks_match_one_process(tmp_path: Path, ranks: int, load: str) -> None:
    pytest.importorskip("mpi4py")
    out = tmp_path / "weights.pt"
    done = subprocess.run(["mpirun", "-n", str(ranks), *_command(out, load, "mpi")], cwd=ROOT,
                          env={**os.environ, **MPI_ENV}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_weights(out)


def test_a_killed_rank_ends_every_rank_fast_and_is_named(tmp_path: Path) -> None:
    command = _command(tmp_path / "never.pt", "1,1", "torch") + ["--die-rank", "1", "--die-at", "3"]
    start = time.monotonic()
    code, failure = launch_local(command, 2, CPU_ONLY)
    assert code == 1 and "rank 1 of 2" in failure and "SIGKILL" in failure
    assert time.monotonic() - start < 60


def test_each_epoch_gives_every_sample_to_exactly_one_rank() -> None:
    order = torch.randperm(103, generator=torch.Generator().manual_seed(0))
    seen = []
    loads = [1.0, 0.0, 2.0, 1.0]
    for rank in range(4):
        context = DistContext(DistEnv(rank, 4, rank, 4, "", 0, "test"), loads, "torch")
        chunks, totals = epoch_chunks(order, 10, context)
        assert len(totals) == 11 and totals[-1] == 3  # 103 = 10 x 10 + 3: 3 samples still give 3 workers one
        seen += torch.cat(chunks).tolist() if chunks else []
    assert sorted(seen) == list(range(103))


def test_shares_follow_the_worker_load() -> None:
    assert shares(64, [1, 1, 1, 0, 1]) == [16, 16, 16, 0, 16]
    assert shares(10, [3, 1]) == [8, 2] or shares(10, [3, 1]) == [7, 3]
    assert shares(2, [1, 1, 1]) == [0, 0, 0]
    assert sum(shares(97, [0.5, 1.5, 1])) == 97


def test_learning_rate_scales_with_the_global_batch() -> None:
    options = TrainingOptions(initial_learn_rate=0.1, mini_batch_size=64, lr_scaling="linear")
    assert scaled_learn_rate(options, 256) == pytest.approx(0.4)
    options = TrainingOptions(initial_learn_rate=0.1, mini_batch_size=64, lr_scaling="sqrt", lr_reference_batch=32)
    assert scaled_learn_rate(options, 128) == pytest.approx(0.2)


def test_network_block_sets_nccl_for_every_rank_and_never_nvls() -> None:
    env = network_environment(NetworkConfig(fast_multinode_gpu=False, socket_ifname="ib0", debug="INFO",
                                            extra={"NCCL_ALGO": "Ring"}))
    assert env == {"NCCL_NVLS_ENABLE": "0", "NCCL_IB_DISABLE": "1", "NCCL_NET_GDR_LEVEL": "LOC",
                   "NCCL_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "INFO", "NCCL_ALGO": "Ring"}
    with pytest.raises(ConfigError, match="NCCL_NVLS_ENABLE must stay 0"):
        NetworkConfig(extra={"NCCL_NVLS_ENABLE": "1"})


@pytest.mark.parametrize(("overrides", "message"), [
    (["training.execution_environment=parallel", "cluster.tasks_per_node=2", "training.worker_load=[1,1,1]"],
     "training.worker_load: 3 entries for 2 workers"),
    (["training.worker_load=[0,0]"], "training.worker_load: must be a list with at least one share above 0"),
    (["training.execution_environment=multi-gpu"], "multi-gpu: no GPU"),
    (["training.execution_environment=parallel", "cluster.tasks_per_node=4", "training.mini_batch_size=3"],
     "training.mini_batch_size=3: smaller than the 4 computing workers"),
    (["cluster=slurm", "training.execution_environment=multi-gpu", "cluster.gpus_per_node=2",
      "training.gpus=[0,3]"], "training.gpus=[0, 3]: only 2 GPU(s)"),
    (["cluster=slurm", "cluster.tasks_per_node=2"], "use parallel (or multi-gpu)"),
])
def test_bad_distributed_settings_fail_before_submission(overrides: list[str], message: str) -> None:
    if "multi-gpu" in " ".join(overrides) and "slurm" not in " ".join(overrides) and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError) as error:
        resolve(compose_config(overrides))
    assert message in str(error.value)


def test_multi_gpu_on_slurm_asks_one_task_per_gpu() -> None:
    plan = resolve(compose_config(["cluster=slurm", "training.execution_environment=multi-gpu",
                                        "cluster.gpus_per_node=4", "training.gpus=[0,2]"]))
    assert plan.world_size == 2 and plan.cluster.tasks_per_node == 2 and plan.cluster.gpus_per_node == 4


def test_local_parallel_job_with_a_zero_load_worker_completes(store: Path, digits_root: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "training.execution_environment=parallel",
                           "cluster.tasks_per_node=3", "training.worker_load=[2,0,1]", f"data.root={digits_root}",
                           "training.max_epochs=2", "wait=true"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "stop_reason:         max-epochs" in done.stdout and "validation_accuracy: 0." in done.stdout


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_local_mpi_job_starts_its_ranks_with_mpirun(store: Path, digits_root: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in MPI_ENV.items():
        monkeypatch.setenv(name, value)
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "training.execution_environment=parallel",
                           "cluster.tasks_per_node=2", "training.comm=mpi", f"data.root={digits_root}",
                           "training.max_epochs=2", "wait=true"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "stop_reason:         max-epochs" in done.stdout
    for rank in (0, 1):  # each rank's output in its own file, as with hpcdl's launcher
        logs = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "logs", "last", "--rank", str(rank)],
                              capture_output=True, text=True, timeout=60).stdout
        assert f"rank {rank}/2" in logs and f"rank {1 - rank}/2" not in logs and "via mpi" in logs, logs
    for rank in (0, 1):  # each rank's output in its own file, as with hpcdl's launcher
        logs = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "logs", "last", "--rank", str(rank)],
                              capture_output=True, text=True, timeout=60).stdout
        assert f"rank {rank}/2" in logs and f"rank {1 - rank}/2" not in logs and "via mpi" in logs, logs
