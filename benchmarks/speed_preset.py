"""training.speed=fast against plain PyTorch loops: float32 (a plain loop's default), bf16 + channels-last
eager, and the same compiled, on the same network, data, optimizer and GPU.

Each contestant trains a fresh model; its steady speed is timed over ``--timed`` iterations after ``--warmup``
(which, for hpcdl, includes timing the eager step and compiling once it decides the run is long enough: the
run is planned as a real one is, ``--long-run`` iterations (it compiles) or ``--short-run`` (it stays eager:
the compile would not pay), and stopped by a callback). Repetitions
alternate the order; median and spread are printed and written to a JSON file.

    python benchmarks/speed_preset.py                        # ResNet-50 (torchvision's width), batch 256
    python benchmarks/speed_preset.py --model small_cnn --image-size 32 --batch 512
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from hpcdl import TrainingOptions, build_model, train_network
from common import write_result  # benchmarks/common.py


def sync() -> None:
    torch.cuda.synchronize()


def make_data(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    count = args.batch * args.batches
    x = torch.rand(count, 3, args.image_size, args.image_size, generator=generator)
    return x.cuda(), torch.randint(args.classes, (count,), generator=generator).cuda()


def new_model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(args.model, in_channels=3, num_classes=args.classes,
                       image_size=(args.image_size, args.image_size))


def plain(precision: str, channels_last: bool, compiled: bool) -> Callable[[argparse.Namespace, tuple], float]:
    """A plain loop as a careful user writes it; returns images/s over the timed iterations."""

    def run(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor]) -> float:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        model = new_model(args).cuda().to(memory_format=fmt)
        forward = torch.compile(model) if compiled else model
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        cast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
        x_all, y_all = data
        generator = torch.Generator().manual_seed(0)
        model.train()
        done, start = 0, 0.0
        while True:
            for index in torch.randperm(len(x_all), generator=generator).split(args.batch):
                x, y = x_all[index].contiguous(memory_format=fmt), y_all[index]
                with cast():
                    loss = F.cross_entropy(forward(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                done += 1
                if done == args.warmup:
                    sync()
                    start = time.perf_counter()
                if done == args.warmup + args.timed:
                    sync()
                    return args.timed * args.batch / (time.perf_counter() - start)

    return run


def hpcdl_fast(planned_iterations: int) -> Callable[[argparse.Namespace, tuple], float]:
    """train_network with the default training.speed=fast, planned for ``planned_iterations`` (stopped once
    timed); returns images/s over the timed iterations."""

    def run(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor]) -> float:
        return _hpcdl_fast(args, data, max(1, -(-planned_iterations // args.batches)))

    return run


def _hpcdl_fast(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor], epochs: int) -> float:
    marks: dict[str, float] = {}

    def timer(record: dict) -> bool:
        if record["iteration"] in (args.warmup, args.warmup + args.timed):
            sync()
            marks[str(record["iteration"])] = time.perf_counter()
        return record["iteration"] >= args.warmup + args.timed

    options = TrainingOptions(solver="sgdm", initial_learn_rate=0.01, max_epochs=epochs,
                              mini_batch_size=args.batch, shuffle="every-epoch", verbose=False,
                              execution_environment="gpu")
    _, info = train_network(data, new_model(args), options, callbacks=[timer])
    SPEED_CHOSEN[epochs] = info.speed
    return args.timed * args.batch / (marks[str(args.warmup + args.timed)] - marks[str(args.warmup)])


SPEED_CHOSEN: dict[int, dict] = {}
"""What hpcdl chose (info.speed), by the planned epochs of its run."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=40, help="batches of synthetic data held on the GPU")
    parser.add_argument("--warmup", type=int, default=60, help="iterations before the timing (compile included)")
    parser.add_argument("--timed", type=int, default=100)
    parser.add_argument("--long-run", type=int, default=450_000,
                        help="iterations of hpcdl's long run, as planned (ImageNet-1k, 90 epochs at batch 256)")
    parser.add_argument("--short-run", type=int, default=2_000, help="iterations of hpcdl's short run, as planned")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/speed_preset.json")
    args = parser.parse_args()
    data = make_data(args)
    contestants = {"plain-float32": plain("float32", False, False),
                   "plain-bf16-channels-last": plain("bf16", True, False),
                   "plain-bf16-channels-last-compiled": plain("bf16", True, True),
                   "hpcdl-speed-fast-long-run": hpcdl_fast(args.long_run),
                   "hpcdl-speed-fast-short-run": hpcdl_fast(args.short_run)}
    speeds: dict[str, list[float]] = {name: [] for name in contestants}
    for repeat in range(args.repeats):  # rotate the order, so that none gains from going first
        names = list(contestants)[repeat % len(contestants):] + list(contestants)[:repeat % len(contestants)]
        for name in names:
            speeds[name].append(contestants[name](args, data))
            print(f"repeat {repeat}: {name:36s} {speeds[name][-1]:9.1f} images/s", flush=True)
    baseline = statistics.median(speeds["plain-float32"])
    result = {"benchmark": "speed_preset", "device_name": torch.cuda.get_device_name(), "torch": torch.__version__,
              **vars(args), "images_per_s": {k: round(statistics.median(v), 1) for k, v in speeds.items()},
              "spread_images_per_s": {k: [round(min(v), 1), round(max(v), 1)] for k, v in speeds.items()},
              "ratio_to_plain_float32": {k: round(statistics.median(v) / baseline, 3) for k, v in speeds.items()},
              "hpcdl_speed_by_planned_epochs": SPEED_CHOSEN}
    for name in contestants:
        print(f"{name:36s} {result['images_per_s'][name]:9.1f} images/s  x{result['ratio_to_plain_float32'][name]:.2f}")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
