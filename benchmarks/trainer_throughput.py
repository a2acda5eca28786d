"""hpcdl's train_network against a plain PyTorch loop: same model, data, optimizer and device.

hpcdl runs with training.speed=exact, so that both do exactly the work the flags name (benchmarks/speed_preset.py
measures speed=fast).

Prints images/s of both and their ratio (hpcdl / plain), measured in one run with
the two interleaved, and writes the numbers to a JSON file.

    python benchmarks/trainer_throughput.py                       # CPU, small CNN
    python benchmarks/trainer_throughput.py --device cuda --model resnet50 \
        --image-size 224 --batch 256 --precision bf16 --channels-last [--compile]

Networks have their standard width unless --width is given (the result's "variant" then says so).
Use --count a multiple of --batch with --compile: a last partial batch would recompile.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

from hpcdl import TrainingOptions, build_model, train_network
from common import write_result  # benchmarks/common.py


def make_data(count: int, size: int, classes: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(count, 3, size, size, generator=generator)
    y = torch.randint(classes, (count,), generator=generator)
    return x.to(device), y.to(device)


STANDARD_WIDTHS = {"resnet18": 64, "resnet50": 64, "small_cnn": 16, "mlp": 16}


def width_of(args: argparse.Namespace) -> int:
    """The width asked for, or the network's standard one."""
    return args.width if args.width is not None else STANDARD_WIDTHS[args.model]


def new_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(args.model, in_channels=3, num_classes=args.classes, width=width_of(args),
                        image_size=(args.image_size, args.image_size))
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    return model.to(device, memory_format=memory_format)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> float:
    """The loop a careful PyTorch user writes by hand; returns seconds for all epochs."""
    model = new_model(args, device)
    forward = torch.compile(model) if args.compile else model
    x_all, y_all = data
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    cast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    generator = torch.Generator().manual_seed(0)
    model.train()
    sync(device)
    start = time.perf_counter()
    for _ in range(args.epochs):
        for index in torch.randperm(len(x_all), generator=generator).split(args.batch):
            x = x_all[index].contiguous(memory_format=memory_format)
            y = y_all[index]
            with cast():
                loss = F.cross_entropy(forward(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    sync(device)
    return time.perf_counter() - start


def hpcdl_loop(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> float:
    """train_network on the same model and data; returns seconds for all epochs."""
    model = new_model(args, device)
    options = TrainingOptions(solver="sgdm", initial_learn_rate=0.01, max_epochs=args.epochs, speed="exact",
                              mini_batch_size=args.batch, shuffle="every-epoch", verbose=False,
                              precision=args.precision, channels_last=args.channels_last, compile=args.compile,
                              execution_environment="gpu" if device.type == "cuda" else "cpu")
    sync(device)
    start = time.perf_counter()
    train_network(data, model, options)
    sync(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--width", type=int, default=None, help="default: the network's standard width")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--count", type=int, default=4096, help="images per epoch")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--precision", default="float32", choices=["float32", "bf16", "fp16"])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile both loops")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/trainer_throughput.json")
    args = parser.parse_args()
    if args.compile and args.count % args.batch:
        parser.error("--compile needs --count a multiple of --batch (a partial batch recompiles)")
    device = torch.device(args.device)
    data = make_data(args.count, args.image_size, args.classes, device)
    plain_loop(args, data, device)  # warm-up: allocator, kernels, caches
    times: dict[str, list[float]] = {"plain": [], "hpcdl": []}
    for repeat in range(args.repeats):  # alternate which goes first, so neither gains from order
        order = ("plain", "hpcdl") if repeat % 2 == 0 else ("hpcdl", "plain")
        for name in order:
            times[name].append((plain_loop if name == "plain" else hpcdl_loop)(args, data, device))
    images = args.count * args.epochs
    plain = images / statistics.median(times["plain"])
    ours = images / statistics.median(times["hpcdl"])
    result = {"benchmark": "trainer_throughput", "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "threads": torch.get_num_threads(), **vars(args),
              "plain_images_per_s": round(plain, 1), "hpcdl_images_per_s": round(ours, 1),
              "variant": args.model if args.width is None else f"{args.model}-width{args.width}",
              "ratio": round(ours / plain, 4), "spread_images_per_s": {k: [round(images / max(v), 1),
                                                                            round(images / min(v), 1)]
                                                                        for k, v in times.items()},
              "seconds": times}
    print(f"plain PyTorch loop: {plain:10.1f} images/s")
    print(f"hpcdl train_network:{ours:10.1f} images/s")
    print(f"ratio hpcdl/plain:  {ours / plain:10.3f}")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
