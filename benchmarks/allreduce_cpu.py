"""Step time of training with the mpi4py all-reduce (comm=mpi) against DDP over gloo (comm=torch).

Same model, data, ranks and trainer in one run; the two alternate. Started as

    python benchmarks/allreduce_cpu.py [--ranks 2]

which relaunches itself under mpirun; each rank then runs train_network with each comm.
The step time is the median time between iterations after the first epoch; the all-reduce
share is (step time with N ranks - step time of one rank on its share) / step time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from common import write_result  # benchmarks/common.py

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def step_times(comm: str, args: argparse.Namespace) -> list[float]:
    import torch

    from hpcdl import TrainingOptions, train_network

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, args.width, generator=generator)
    y = torch.randint(10, (args.samples,), generator=generator)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()] * args.depth
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10))
    environment = "parallel" if args.ranks > 1 else "cpu"
    options = TrainingOptions(execution_environment=environment, comm=comm, max_epochs=args.epochs,
                              mini_batch_size=args.batch, verbose=False, solver="sgdm", shuffle="never")
    _, info = train_network((x, y), model, options, callbacks=[lambda record: False])  # a record per step
    times = [r["time_s"] for r in info.history]
    per_epoch = len(times) // args.epochs
    return [b - a for a, b in zip(times[per_epoch:], times[per_epoch + 1:])]


def rank_main(args: argparse.Namespace) -> None:
    results: dict[str, list[float]] = {"torch": [], "mpi": []}
    for repeat in range(args.repeats):
        for comm in (("torch", "mpi") if repeat % 2 == 0 else ("mpi", "torch")):
            results[comm] += step_times(comm, args)
    if int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == 0:
        Path(args.out).write_text(json.dumps({k: statistics.median(v) for k, v in results.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/allreduce_cpu.json")
    parser.add_argument("--rank-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_out:
        args.out = args.rank_out
        rank_main(args)
        return
    if shutil.which("mpirun") is None:
        sys.exit("needs Open MPI's mpirun and mpi4py (pip install 'hpcdl[mpi]')")
    figures = {}
    for ranks in (1, args.ranks):
        scratch = Path(args.out).with_suffix(f".rank-{ranks}.tmp")
        command = ["mpirun", "-n", str(ranks), sys.executable, __file__, "--rank-out", str(scratch),
                   *[f"--{k}={v}" for k, v in vars(args).items() if k not in ("out", "rank_out", "ranks")],
                   f"--ranks={ranks}"]
        subprocess.run(command, env={**os.environ, **MPI_ENV}, check=True)
        figures[ranks] = json.loads(scratch.read_text())
        scratch.unlink()
    single = figures[1]["torch"]
    result = {"benchmark": "allreduce_cpu", **{k: v for k, v in vars(args).items() if k != "rank_out"},
              "parameters": args.depth * (args.width * args.width + args.width) + args.width * 10 + 10,
              "step_s_one_rank": single, "step_s_ddp_gloo": figures[args.ranks]["torch"],
              "step_s_mpi4py": figures[args.ranks]["mpi"],
              "ratio_mpi_to_gloo": figures[args.ranks]["mpi"] / figures[args.ranks]["torch"]}
    for comm in ("torch", "mpi"):
        step = figures[args.ranks][comm]
        result[f"communication_share_{comm}"] = max(0.0, (step - single / args.ranks) / step)
    print(f"one rank: {1000 * single:.1f} ms/step; {args.ranks} ranks: DDP/gloo "
          f"{1000 * result['step_s_ddp_gloo']:.1f} ms/step, mpi4py {1000 * result['step_s_mpi4py']:.1f} ms/step; "
          f"ratio mpi4py/gloo {result['ratio_mpi_to_gloo']:.3f}")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
