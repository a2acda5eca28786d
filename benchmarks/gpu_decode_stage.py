"""The GPU data stage alone: nvJPEG batch decode and the batched augmentation, by host threads in parallel.

Writes 500x375 JPEG files (as benchmarks/jpeg_resnet50.py does), then measures images/s of
``torchvision.io.decode_jpeg(files, device="cuda")`` on batches of --batch files when 1, 2, 4 and 8 host
threads (each with its own CUDA stream) decode at once, the same for decode + hpcdl's augmentation
(random crop 224 + flip), and the CPU time the decoding threads spend per image. Repetitions alternate the
thread counts; medians are reported. Compare with the training step's rate (ResNet-50 bf16, batch 256:
~4,600 images/s eager on an H200) to see whether one decoding thread can keep up.

    python benchmarks/gpu_decode_stage.py [--images 4096 --batch 256 --repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from common import write_result  # benchmarks/common.py
from hpcdl import ImageDatastore
from hpcdl.data.augment import AugmentedImageDatastore
from hpcdl.data.encoded import nvjpeg
from jpeg_resnet50 import write_images


def run(files: list[torch.Tensor], threads: int, batch: int, augmented: AugmentedImageDatastore | None,
        draws: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """(images/s, CPU seconds per image) of ``threads`` threads each decoding its share of ``files``."""
    shares = [files[i::threads] for i in range(threads)]
    cuda = device.type == "cuda"
    streams = [torch.cuda.Stream() if cuda else None for _ in range(threads)]

    errors: list[BaseException] = []

    def work(share: list[torch.Tensor], stream: torch.cuda.Stream | None) -> None:
        try:
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                for start in range(0, len(share) - batch + 1, batch):
                    images = nvjpeg(share[start:start + batch], 3, device)
                    if augmented is not None:
                        augmented.augment(images, draws[:len(images)])
            if cuda:
                stream.synchronize()
        except BaseException as error:  # noqa: BLE001 - raised below: a failed thread is no rate
            errors.append(error)

    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    synchronize()
    cpu, wall = time.process_time(), time.perf_counter()
    workers = [threading.Thread(target=work, args=(s, st)) for s, st in zip(shares, streams)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    synchronize()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = sum(len(s) - len(s) % batch for s in shares)
    return done / wall, cpu / done


def cpu_rate(augmented: AugmentedImageDatastore, workers: int, batch: int) -> float:
    """images/s of ``workers`` processes decoding (PIL) and augmenting on the CPU, as hpcdl's CPU path does."""
    from torch.utils.data import DataLoader

    from hpcdl.data.loader import EpochBatches, collate_skipping

    sampler = EpochBatches(True)
    sampler.set(list(torch.arange(len(augmented)).split(batch)), 0)
    loader = DataLoader(augmented, batch_sampler=sampler, num_workers=workers, collate_fn=collate_skipping,
                        prefetch_factor=4)
    iterator = iter(loader)
    next(iterator)  # the workers started
    start, done = time.perf_counter(), 0
    for x, _, _ in iterator:
        done += len(x)
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--cpu-workers", type=int, nargs="*", default=[1, 15],
                        help="also measure the CPU path (PIL decode + augment) with these many processes")
    parser.add_argument("--device", default="cuda", help="cuda (nvJPEG), or cpu to try the script here")
    parser.add_argument("--out", default="results/gpu_decode_stage.json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hpcdl-jpeg-stage-"))
    mean_bytes = write_images(root, args.images)
    store = ImageDatastore(root)
    augmented = AugmentedImageDatastore(store, output_size=(224, 224), crop="random", random_x_reflection=True)
    files = [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p in store.paths]
    draws = torch.stack([augmented.draws(i, 0) for i in range(args.batch)])
    device = torch.device(args.device)
    run(files[:args.batch * 2], 1, args.batch, augmented, draws, device)  # warm-up: nvJPEG handles, kernels
    figures: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for threads in (args.threads if repeat % 2 == 0 else args.threads[::-1]):
            for stage, aug in (("decode", None), ("decode+augment", augmented)):
                rate, cpu = run(files, threads, args.batch, aug, draws, device)
                figures.setdefault(f"{stage} x{threads} images/s", []).append(rate)
                figures.setdefault(f"{stage} x{threads} cpu ms/image", []).append(1000 * cpu)
    for workers in args.cpu_workers:
        figures[f"cpu path x{workers} processes images/s"] = [cpu_rate(augmented, workers, args.batch)]
    result = {"benchmark": "gpu_decode_stage", "images": args.images, "batch": args.batch,
              "mean_file_kb": mean_bytes / 1024, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              **{k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in figures.items()}}
    write_result(args.out, result)
    for key, value in figures.items():
        print(f"{key:36s} median {statistics.median(value):9.1f}  ({min(value):.1f}-{max(value):.1f})")


if __name__ == "__main__":
    main()
