"""Run under mpirun: sum CUDA gradients of every rank through MpiGradientReducer; rank 0 checks the sum.

    mpirun -n 2 python -m tests.gpu_mpi_reduce
"""

from __future__ import annotations

import torch

from hpcdl.distributed.allreduce import MpiGradientReducer
from hpcdl.distributed.mpi import world


def main() -> None:
    comm = world()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    reducer = MpiGradientReducer(model, comm, bucket_bytes=16 * 1024)  # several buckets
    x = torch.full((4, 64), float(comm.rank + 1), device="cuda")
    model(x).square().sum().backward()
    reducer.finish()
    expected = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    expected.load_state_dict(model.state_dict())
    for rank in range(comm.size):
        expected(torch.full((4, 64), float(rank + 1), device="cuda")).square().sum().backward()
    for got, want in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-4)
    assert all(p.grad.is_cuda for p in model.parameters())
    if comm.rank == 0:
        print(f"reduced CUDA gradients of {comm.size} ranks in {len(reducer.buckets)} buckets: ok")


if __name__ == "__main__":
    main()
