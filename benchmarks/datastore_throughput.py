"""Images per second: hpcdl's augmented datastore with background dispatch against torchvision's
ImageFolder + DataLoader, same files, transforms (random crop, random horizontal flip), batch and workers.

Also trains a network (the example's small_cnn by default, --model resnet18 ...) from the datastore and reports the data-wait share of a
training step (time the loop waits for a batch over the training time). Real JPEG files are written
first. torchvision is needed for the baseline (it is on the GPU machine; not installable beside the
CPU torch here).

    python benchmarks/datastore_throughput.py --workers 8 [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hpcdl import ImageDatastore, TrainingOptions, build_model, train_network
from common import write_result  # benchmarks/common.py
from hpcdl.data.augment import AugmentedImageDatastore
from hpcdl.data.encoded import use_gpu_decode
from hpcdl.data.loader import BatchLoader


def write_images(root: Path, count: int, size: int, classes: int) -> None:
    rng = np.random.default_rng(0)
    for n in range(count):
        label = n % classes
        folder = root / f"class{label:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 255, (size // 8, size // 8, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((size, size), Image.BICUBIC)
        image.save(folder / f"{n:06d}.jpg", quality=90)


def hpcdl_epochs(root: Path, args: argparse.Namespace, device: torch.device) -> float:
    store = AugmentedImageDatastore(ImageDatastore(root, channels=3), [args.crop, args.crop], crop="random",
                                    random_x_reflection=True)
    loader = BatchLoader(store, device, torch.contiguous_format, background=True, workers=args.workers,
                         prefetch=args.prefetch, gpu_decode=use_gpu_decode(args.gpu_decode, store, device),
                         device_prefetch=2)
    generator = torch.Generator().manual_seed(0)
    seen, start = 0, 0.0
    for epoch in range(args.epochs + 1):  # the first epoch starts the workers
        if epoch == 1:
            start = time.perf_counter()
        chunks = torch.randperm(len(store), generator=generator).split(args.batch)
        for x, _ in loader.epoch(chunks, epoch):
            seen += len(x) if epoch else 0
    if device.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start)


def torchvision_epochs(root: Path, args: argparse.Namespace, device: torch.device) -> float:
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.RandomCrop(args.crop), transforms.RandomHorizontalFlip(),
                                    transforms.PILToTensor()])  # uint8 from the workers, as hpcdl ships
    data = datasets.ImageFolder(str(root), transform=transform)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                         pin_memory=device.type == "cuda", prefetch_factor=args.prefetch,
                                         persistent_workers=True)
    seen, start = 0, 0.0
    for epoch in range(args.epochs + 1):
        if epoch == 1:
            start = time.perf_counter()
        for x, _ in loader:  # the same float32 [0, 1] batch on the device as hpcdl gives
            x = x.to(device, non_blocking=True).to(torch.float32).div_(255.0)
            seen += len(x) if epoch else 0
    if device.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start)


def data_wait_share(root: Path, args: argparse.Namespace, device: torch.device) -> float:
    store = AugmentedImageDatastore(ImageDatastore(root, channels=3), [args.crop, args.crop], crop="random",
                                    random_x_reflection=True)
    model = build_model(args.model, in_channels=3, num_classes=len(store.classes), width=args.width)
    options = TrainingOptions(max_epochs=args.epochs + 1, mini_batch_size=args.batch, verbose=False,
                              dispatch_in_background=True, num_workers=args.workers, gpu_decode=args.gpu_decode,
                              prefetch_factor=args.prefetch, channels_last=True,
                              execution_environment="gpu" if device.type == "cuda" else "cpu")
    _, info = train_network(store, model, options, callbacks=[lambda record: False])  # one record per step
    steady = [r for r in info.history if r["epoch"] > 1]  # after the workers have started
    return sum(r["data_wait_s"] for r in steady) / (steady[-1]["time_s"] - steady[0]["time_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--crop", type=int, default=112)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gpu-decode", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--model", default="small_cnn", help="the network trained for the data-wait share")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--out", default="benchmarks/results/datastore_throughput.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    result: dict = {"benchmark": "datastore_throughput", **vars(args)}
    with tempfile.TemporaryDirectory(prefix="hpcdl-images-") as scratch:
        root = Path(scratch)
        write_images(root, args.images, args.size, args.classes)
        rates: dict[str, list[float]] = {"hpcdl": [], "torchvision": []}
        try:
            import torchvision  # noqa: F401
        except Exception as e:  # torchvision is only the baseline
            result["torchvision"] = f"unavailable: {e}"
            rates.pop("torchvision")
        for repeat in range(args.repeats):
            names = sorted(rates) if repeat % 2 == 0 else sorted(rates, reverse=True)
            for name in names:
                rates[name].append((hpcdl_epochs if name == "hpcdl" else torchvision_epochs)(root, args, device))
        result.update({f"{k}_images_per_s": statistics.median(v) for k, v in rates.items()})
        result.update({f"{k}_spread_images_per_s": [min(v), max(v)] for k, v in rates.items()})
        if "torchvision" in rates:
            result["ratio"] = result["hpcdl_images_per_s"] / result["torchvision_images_per_s"]
        result["data_wait_share"] = data_wait_share(root, args, device)
    for key in ("hpcdl_images_per_s", "torchvision_images_per_s", "ratio", "data_wait_share"):
        if key in result:
            print(f"{key:26s} {result[key]:.3f}")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
