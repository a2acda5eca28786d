"""A user's own code, written as files outside the repository: a torchrun-style training script and an
entry function (the tests' user code)."""

from __future__ import annotations

from pathlib import Path

SCRIPT = '''
import argparse, os
import torch
import torch.distributed as dist
from torch import nn
import hpcdl

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()
dist.init_process_group("gloo")  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as under torchrun
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(rank))
y = x.sum(1, keepdim=True)
for step in range(1, args.steps + 1):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    hpcdl.report(step, loss.item(), total=args.steps)
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"script rank {rank} of {world} local {os.environ['LOCAL_RANK']}: sum {total.item():g} lr {args.lr}", flush=True)
with open(os.path.join(hpcdl.results_dir(), f"rank{rank}.txt"), "w") as f:
    f.write(f"{total.item():g}")
hpcdl.save_result({"world": world, "final_loss": loss.item()})
dist.barrier()  # no rank tears the group down while another still uses it
dist.destroy_process_group()
'''

ENTRY = '''
import os


def main(config):
    """Gets the composed config; its return value on rank 0 is the job's result."""
    return {"name": config.name, "rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"])}


def takes_nothing():
    return 1
'''


def write_user_code(folder: Path) -> Path:
    """``folder`` with train_ddp.py (a torchrun-style script) and myentry.py (entry functions) in it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train_ddp.py").write_text(SCRIPT)
    (folder / "myentry.py").write_text(ENTRY)
    return folder
