"""One training process's distributed context: its rank, share of each batch, and how gradients meet.

Built once by train_network. A single process gets a context of one worker and
no communication, so the loop has one code path.
"""

from __future__ import annotations

import datetime
import gc
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from torch import nn

from hpcdl.distributed import pace
from hpcdl.distributed.env import DistEnv
from hpcdl.distributed.shares import shares
from hpcdl.errors import ConfigError

DEFAULT_TIMEOUT_S = 300


@dataclass
class DistContext:
    """Where this process stands among the workers of one training run."""

    env: DistEnv
    loads: list[float]
    comm: str
    group: Any = None
    """The torch process group of the computing workers (comm=torch, several workers)."""
    mpi_comm: Any = None
    """The MPI communicator of the computing workers (comm=mpi)."""
    control: Any = None
    """A gloo group of the computing workers for decisions made on the host (comm=torch, several workers)."""
    reducer: Any = field(default=None, repr=False)

    @property
    def distributed(self) -> bool:
        return self.env.world_size > 1

    @property
    def computing(self) -> list[int]:
        """Ranks with a load above 0."""
        return [r for r, load in enumerate(self.loads) if load > 0]

    @property
    def computes(self) -> bool:
        return self.loads[self.env.rank] > 0

    @property
    def lead(self) -> bool:
        """The first computing rank: it prints, writes the metrics, plot and checkpoints."""
        return self.env.rank == self.computing[0]

    def local_chunk(self, chunk: torch.Tensor) -> torch.Tensor:
        """This rank's part of one global batch of indices (empty when the batch is too small to split)."""
        counts = shares(len(chunk), self.loads)
        start = sum(counts[: self.env.rank])
        return chunk[start:start + counts[self.env.rank]]

    def loss_scale(self, local: int, total: int) -> float:
        """Factor on this rank's mean loss so that the reduced gradient is the mean over the global batch."""
        if not self.distributed:
            return 1.0
        scale = local / total
        return scale * len(self.computing) if self.comm == "torch" else scale  # DDP averages; MPI sums

    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP over the computing group (comm=torch), or hooks for the MPI reducer; the model itself alone."""
        if not self.distributed:
            return model
        if self.comm == "mpi":
            from hpcdl.distributed.allreduce import MpiGradientReducer

            _broadcast_parameters(model, self.mpi_comm)
            self.reducer = MpiGradientReducer(model, self.mpi_comm)
            return model
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [model_device(model).index] if model_device(model).type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, process_group=self.group)

    def finish_gradients(self) -> None:
        """After backward: wait for the MPI all-reduce (DDP has already reduced)."""
        if self.reducer is not None:
            self.reducer.finish()

    def all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum a small tensor over the computing workers (validation totals)."""
        if not self.distributed:
            return values
        began = time.perf_counter()  # on the host: the wait of a CPU run (and of MPI) for slower peers (pace)
        if self.comm == "mpi":
            host = values.detach().double().cpu().numpy()
            self.mpi_comm.Allreduce(self.mpi_module().IN_PLACE, host, op=self.mpi_module().SUM)
            values = torch.from_numpy(host).to(values.device, values.dtype)
        else:
            torch.distributed.all_reduce(values, group=self.group)
        pace.aside(time.perf_counter() - began)
        return values

    def agree(self, flag: bool) -> bool:
        """True on every computing worker if ``flag`` is true on any, decided on the host: no device sync."""
        if not self.distributed:
            return flag
        began = time.perf_counter()  # the wait for slower peers is theirs, not this rank's (pace)
        if self.comm == "mpi":
            agreed = bool(self.mpi_comm.allreduce(int(flag), op=self.mpi_module().MAX))
        else:
            value = torch.tensor([int(flag)])
            torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX, group=self.control)
            agreed = bool(value.item())
        pace.aside(time.perf_counter() - began)
        return agreed

    def any_true(self, flag: bool, device: torch.device) -> bool:
        """True on every computing worker if ``flag`` is true on any (a callback's stop)."""
        return bool(self.all_sum(torch.tensor([float(flag)], device=device)).item() > 0)

    @staticmethod
    def mpi_module() -> Any:
        from mpi4py import MPI

        return MPI

    def close(self, barrier: bool = True) -> None:
        """Leave the process group: after a barrier, so no rank tears down under another, unless this
        rank failed (``barrier=False``: its peers may be gone and would never reach it)."""
        if self.distributed and self.comm == "torch" and torch.distributed.is_initialized():
            gc.collect()  # DDP's reducer holds reference cycles; it must be gone before its process group
            if barrier:
                torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        elif self.distributed and self.comm == "mpi" and barrier:
            from hpcdl.distributed.mpi import world

            world().Barrier()


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _broadcast_parameters(model: nn.Module, comm: Any) -> None:
    """Give every worker the lead's initial weights (DDP does this itself)."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            host = tensor.detach().cpu().contiguous().numpy().copy()
            comm.Bcast(host, root=0)
            tensor.copy_(torch.from_numpy(host))


def init_context(env: DistEnv, comm: str, loads: Sequence[float], device: torch.device,
                 timeout_s: Optional[float] = None) -> DistContext:
    """Join the ranks ``env`` discovered (NCCL on GPUs, gloo on CPUs, or MPI) and log this rank once. ``loads``:
    each rank's share, as resolved; ``timeout_s``: the collectives' limit (None: $HPCDL_COLLECTIVE_TIMEOUT_S or
    300 s)."""
    loads = list(loads)
    if len(loads) != env.world_size:
        raise ConfigError(f"training.worker_load: resolved for {len(loads)} workers, but {env.world_size} run")
    context = DistContext(env, loads, comm)
    if env.world_size == 1:
        return context
    if timeout_s is None:
        timeout_s = float(os.environ.get("HPCDL_COLLECTIVE_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    timeout = datetime.timedelta(seconds=timeout_s)
    if comm == "mpi":
        from hpcdl.distributed.mpi import world

        context.mpi_comm = world().Split(1 if loads[env.rank] > 0 else context.mpi_module().UNDEFINED, env.rank)
    else:
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a lost peer ends the job, not hangs
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend, init_method=f"tcp://{env.master_addr}:{env.master_port}",
                                             rank=env.rank, world_size=env.world_size, timeout=timeout,
                                             device_id=device if device.type == "cuda" else None)
        computing = context.computing
        context.group = (torch.distributed.new_group(computing, timeout=timeout)
                         if len(computing) < env.world_size else torch.distributed.group.WORLD)
        context.control = (torch.distributed.new_group(computing, timeout=timeout, backend="gloo")
                           if backend == "nccl" else context.group)
    print(f"[hpcdl] rank {env.rank}/{env.world_size} (local {env.local_rank}) on {socket.gethostname()}, "
          f"device {device}, load {loads[env.rank]:g}, via {env.source}", flush=True)
    return context
