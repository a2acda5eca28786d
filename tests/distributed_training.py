"""One worker of a small distributed training run, started by the tests (launch_local, mpirun, srun).

    python -m tests.distributed_training OUT.pt --load 1,0,2 --comm torch [--die-rank 1 --die-at 5]
"""

from __future__ import annotations

import argparse
import os
import signal

import torch

from hpcdl import TrainingOptions, train_network
from hpcdl.distributed.env import global_rank

STEPS_OPTIONS = dict(solver="sgdm", initial_learn_rate=0.2, momentum=0.9, max_epochs=3, mini_batch_size=24,
                     shuffle="every-epoch", seed=5, verbose=False, l2_regularization=1e-3)


def problem() -> tuple[tuple[torch.Tensor, torch.Tensor], torch.nn.Module]:
    """The same data and initial weights in every process."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(120, 6, generator=generator)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    return (x, y), model


def train(out: str, load: list[float] | None, comm: str, die_rank: int = -1, die_at: int = 0,
          environment: str = "parallel") -> None:
    data, model = problem()
    rank = global_rank()

    def maybe_die(record: dict) -> bool:
        if rank == die_rank and record["iteration"] == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return False

    options = TrainingOptions(execution_environment=environment, worker_load=load, comm=comm, **STEPS_OPTIONS)
    model, info = train_network(data, model, options, callbacks=[maybe_die] if die_rank >= 0 else [])
    if info.writer:
        torch.save(model.state_dict(), out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--load", default="")
    parser.add_argument("--comm", default="torch")
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--die-at", type=int, default=0)
    args = parser.parse_args()
    load = [float(x) for x in args.load.split(",")] if args.load else None
    train(args.out, load, args.comm, args.die_rank, args.die_at)


if __name__ == "__main__":
    main()
