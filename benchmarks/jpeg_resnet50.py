"""ResNet-50 from real JPEG files against synthetic data: hpcdl GPU decode, hpcdl CPU decode, and torchvision
ImageFolder + DataLoader (CPU decode, a plain loop), eager and compiled, in one run.

Writes its own 500x375 JPEG files (ImageNet's typical size, ~100 KB), trains torchvision's ResNet-50 (bf16,
channels_last, random crop 224 + flip) from them, and reports images/s after a warm-up epoch, the ratio to
hpcdl on synthetic data already on the GPU, and the data-wait share; also hpcdl's GPU data path alone (no
training beside it: its ceiling). Variants alternate within each repetition;
the median and the spread (min-max) of the repetitions are reported.

    python benchmarks/jpeg_resnet50.py [--images 10240 --workers 15 --repeats 2 --modes eager compiled]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from common import write_result  # benchmarks/common.py
from hpcdl import ImageDatastore, TrainingOptions, train_network
from hpcdl.data.augment import AugmentedImageDatastore
from hpcdl.train.datawait import WaitClock

VARIANTS = ("synthetic", "hpcdl-gpu-decode", "hpcdl-cpu-decode", "torchvision", "gpu-data-path-alone")


def write_one(job: tuple[Path, int]) -> None:
    from PIL import Image

    root, n = job
    rng = np.random.default_rng(n)
    base = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
    pixels = np.asarray(Image.fromarray(base).resize((500, 375), Image.BICUBIC)).astype(np.int16)
    pixels = np.clip(pixels + rng.normal(0, 18, pixels.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(root / f"class{n % 10}" / f"{n:06d}.jpg", quality=90)


def write_images(root: Path, count: int) -> float:
    for label in range(10):
        (root / f"class{label}").mkdir(parents=True, exist_ok=True)
    with Pool(os.cpu_count()) as pool:
        pool.map(write_one, [(root, n) for n in range(count)], chunksize=64)
    return sum(f.stat().st_size for f in root.rglob("*.jpg")) / count


def new_model() -> torch.nn.Module:
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet50(num_classes=10).cuda().to(memory_format=torch.channels_last)


def steady(history: list[dict], train_s: float, count: int) -> tuple[float, float]:
    """images/s and data-wait share after the first epoch (from its last step to the synchronised end)."""
    start = [r for r in history if r["epoch"] == 1][-1]["time_s"]
    later = [r for r in history if r["epoch"] > 1]
    seconds = train_s - start
    return len(later) * count / seconds, sum(r["data_wait_s"] for r in later) / seconds


def hpcdl_run(data, args: argparse.Namespace, compiled: bool, **options) -> tuple[float, float]:  # noqa: ANN001
    opts = TrainingOptions(solver="sgdm", initial_learn_rate=0.1, max_epochs=args.epochs,
                           mini_batch_size=args.batch, shuffle="every-epoch", verbose=False, precision="bf16",
                           channels_last=True, compile=compiled, execution_environment="gpu", **options)
    _, info = train_network(data, new_model(), opts)
    return steady(info.history, info.train_s, args.batch)


def data_path_alone(store: AugmentedImageDatastore, args: argparse.Namespace) -> tuple[float, float]:
    """images/s of hpcdl's GPU-decoding data path with no training beside it (its ceiling), after a warm-up epoch."""
    from hpcdl.data.loader import BatchLoader

    loader = BatchLoader(store, torch.device("cuda"), torch.channels_last, background=True, workers=args.workers,
                         prefetch=4, gpu_decode=True, device_prefetch=2)
    chunks = list(torch.randperm(args.images).split(args.batch))
    try:
        for epoch in range(args.epochs):
            if epoch == 1:
                torch.cuda.synchronize()
                begin = time.perf_counter()
            for _ in loader.epoch(chunks, epoch):
                pass
        torch.cuda.synchronize()
    finally:
        loader.close()
    return (args.epochs - 1) * args.images / (time.perf_counter() - begin), 0.0


def under_switch_interval(interval: float, run: Callable[[bool], tuple[float, float]],
                          compiled: bool) -> tuple[float, float]:
    """``run(compiled)`` with Python's thread switch interval set to ``interval`` seconds, restored after."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        return run(compiled)
    finally:
        sys.setswitchinterval(before)


def torchvision_run(root: Path, args: argparse.Namespace, compiled: bool) -> tuple[float, float]:
    """ImageFolder + DataLoader as its documentation shows, shipping uint8 (as hpcdl), a plain loop."""
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.RandomCrop(224), transforms.RandomHorizontalFlip(),
                                    transforms.PILToTensor()])
    loader = torch.utils.data.DataLoader(datasets.ImageFolder(str(root), transform=transform),
                                         batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                         pin_memory=True, drop_last=True, persistent_workers=True,
                                         prefetch_factor=4)
    model = new_model()
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    clock, waits, begin = WaitClock(torch.device("cuda")), [], 0.0
    for epoch in range(args.epochs):
        for (x, y), wait in clock.timed(iter(loader)):
            x = x.cuda(non_blocking=True).to(torch.float32, memory_format=torch.channels_last).div_(255)
            y = y.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(forward(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if epoch:
                waits.append(wait)
        begin = begin or time.perf_counter()  # the last warm-up step enqueued
    torch.cuda.synchronize()
    seconds = time.perf_counter() - begin
    return len(waits) * args.batch / seconds, sum(w.seconds() for w in waits) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10240, help="a multiple of --batch (no partial batch)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=3, help="the first is a warm-up")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", default="benchmarks/results/jpeg_resnet50_h200")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval for the whole run (Python's default 0.005 s)")
    parser.add_argument("--gpu-decode-switch-intervals", type=float, nargs="*", default=[],
                        help="also run hpcdl-gpu-decode under each of these sys.setswitchinterval values, "
                             "alternating with the other variants (variant hpcdl-gpu-decode-si<value>)")
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if args.images % args.batch:
        parser.error("--images must be a multiple of --batch (a partial batch recompiles)")
    figures: dict[str, dict[str, list[tuple[float, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="hpcdl-jpeg-") as scratch:
        root = Path(scratch)
        mean_bytes = write_images(root, args.images)
        store = AugmentedImageDatastore(ImageDatastore(root, channels=3), [224, 224], crop="random",
                                        random_x_reflection=True)
        synthetic = (torch.rand(args.images, 3, 224, 224, device="cuda"),
                     torch.randint(10, (args.images,), device="cuda"))
        runs = {
            "synthetic": lambda c: hpcdl_run(synthetic, args, c),
            "hpcdl-gpu-decode": lambda c: hpcdl_run(store, args, c, gpu_decode="on", dispatch_in_background=True,
                                                    num_workers=args.workers, prefetch_factor=4),
            "hpcdl-cpu-decode": lambda c: hpcdl_run(store, args, c, gpu_decode="off", dispatch_in_background=True,
                                                    num_workers=args.workers, prefetch_factor=4),
            "torchvision": lambda c: torchvision_run(root, args, c),
            "gpu-data-path-alone": lambda c: data_path_alone(store, args),
        }
        for interval in args.gpu_decode_switch_intervals:
            runs[f"hpcdl-gpu-decode-si{interval:g}"] = functools.partial(under_switch_interval, interval,
                                                                       runs["hpcdl-gpu-decode"])
            args.variants.append(f"hpcdl-gpu-decode-si{interval:g}")
        for mode in args.modes:
            figures[mode] = {name: [] for name in args.variants}
            for repeat in range(args.repeats):
                order = args.variants[repeat % len(args.variants):] + args.variants[:repeat % len(args.variants)]
                for name in order:
                    figures[mode][name].append(runs[name](mode == "compiled"))
                    print(mode, name, repeat, figures[mode][name][-1], flush=True)
    rows, table = [], ["| mode | variant | images/s (median) | spread | ratio to synthetic | data wait |",
                       "|---|---|---|---|---|---|"]
    for mode, variants in figures.items():
        base = statistics.median(r for r, _ in variants["synthetic"]) if "synthetic" in variants else None
        for name, values in variants.items():
            rate = statistics.median(r for r, _ in values)
            wait = statistics.median(w for _, w in values)
            ratio = rate / base if base else None
            rows.append({"mode": mode, "variant": name, "images_per_s": round(rate, 1),
                         "min": round(min(r for r, _ in values), 1), "max": round(max(r for r, _ in values), 1),
                         "ratio_to_synthetic": None if ratio is None else round(ratio, 3),
                         "data_wait_share": round(wait, 4)})
            table.append(f"| {mode} | {name} | {rate:.0f} | {rows[-1]['min']:.0f}-{rows[-1]['max']:.0f} | "
                         f"{'' if ratio is None else f'{ratio:.3f}'} | {100 * wait:.1f}% |")
    print("\n".join(table))
    write_result(args.out + ".json", {"benchmark": "jpeg_resnet50", **vars(args), "mean_file_bytes": mean_bytes,
                                      "device_name": torch.cuda.get_device_name(), "torch": torch.__version__,
                                      "cpus": os.cpu_count(), "rows": rows, "runs": figures})
    Path(args.out + ".md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
