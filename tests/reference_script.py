"""A training script written the way torchvision's classification reference is (argparse, init_process_group from
torchrun's variables, DistributedSampler, DDP, checkpoints in --output-dir), without importing torchvision: the
README's recipe, run by tests/test_slurm_recipes.py."""

SCRIPT = '''
import argparse, os
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def init_distributed_mode(args):
    """As torchvision's references/classification/utils.py: torchrun's variables (hpcdl sets them too)."""
    args.rank, args.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    if args.dist_backend == "nccl":
        torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend=args.dist_backend, init_method="env://", world_size=args.world_size,
                            rank=args.rank)
    dist.barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--dist-backend", default="gloo")
    parser.add_argument("--output-dir", default="out")
    args = parser.parse_args()
    init_distributed_mode(args)
    device = torch.device(f"cuda:{args.gpu}" if args.dist_backend == "nccl" else "cpu")
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(256) % 4
    data = TensorDataset(torch.randn(256, 8, generator=generator) + labels[:, None].float(), labels)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Linear(8, 4).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if args.rank == 0:
            os.makedirs(args.output_dir, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "epoch": epoch},
                       os.path.join(args.output_dir, "checkpoint.pth"))
        print(f"rank {args.rank}/{args.world_size} epoch {epoch} loss {loss.item():.4f} on {device}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

LIGHTNING_SCRIPT = '''
import argparse
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import hpcdl


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 4)

    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        hpcdl.report(step=self.global_step + 1, total=self.trainer.estimated_stepping_batches, loss=loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


parser = argparse.ArgumentParser()
parser.add_argument("--devices", type=int, default=1)   # = cluster.tasks_per_node
parser.add_argument("--num-nodes", type=int, default=1)  # = cluster.nodes
args = parser.parse_args()
labels = torch.arange(256) % 4
data = TensorDataset(torch.randn(256, 8, generator=torch.Generator().manual_seed(0)) + labels[:, None].float(), labels)
trainer = L.Trainer(accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy="ddp", max_epochs=2,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False)
trainer.fit(Classifier(), DataLoader(data, batch_size=32))
print(f"lightning rank {trainer.global_rank} of {trainer.world_size} via {type(trainer.strategy.cluster_environment).__name__}",
      flush=True)
trainer.save_checkpoint("out/final.ckpt")  # relative: into the job's results
'''
