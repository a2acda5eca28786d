"""What slows a GPU-decoding training run down: each part of the data path run beside synthetic-data training.

ResNet-50 (bf16, channels_last, batch 256) trains on synthetic data already on the GPU while one part of the
JPEG data path runs in a background thread of the same process as fast as it can: nvJPEG decode + augment of
file bytes already in memory (the decode stage's GPU and GIL contention, and its own rate beside training).
Then the whole GPU-decode path with several shares of the JPEG files decoded by the workers on the CPU
(training.cpu_decode_share), timing how long its prefetch thread waits for host batches and decodes. Printed:
images/s of each and the ratio to synthetic data alone; also whether nvJPEG holds the GIL.

    python benchmarks/gpu_decode_interference.py [--images 5120 --workers 15 --repeats 2 --shares 0 0.2 0.55]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from common import write_result  # benchmarks/common.py
from hpcdl import ImageDatastore
from hpcdl.data.augment import AugmentedImageDatastore
from hpcdl.data.encoded import decode_on_device, nvjpeg
from hpcdl.data.loader import BatchLoader
from jpeg_resnet50 import hpcdl_run, write_images


@contextlib.contextmanager
def beside(work: Callable[[threading.Event], None]) -> Iterator[list[int]]:
    """Run ``work(stop)`` in a thread while the block runs."""
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,), daemon=True)
    thread.start()
    try:
        yield []
    finally:
        stop.set()
        thread.join()


def gil_share_during_decode(files: list[torch.Tensor]) -> float:
    """Python loop iterations another thread manages while nvJPEG decodes, against while the main thread sleeps."""
    counts = [0]
    done = threading.Event()

    def count() -> None:
        while not done.is_set():
            counts[0] += 1

    def measure(action: Callable[[], None]) -> float:
        counts[0] = 0
        done.clear()
        thread = threading.Thread(target=count)
        start = time.perf_counter()
        thread.start()
        action()
        done.set()
        thread.join()
        return counts[0] / (time.perf_counter() - start)

    def decode() -> None:
        for _ in range(8):
            nvjpeg(files, 3, torch.device("cuda"))
        torch.cuda.synchronize()

    sleeping = measure(lambda: time.sleep(0.5))
    return measure(decode) / sleeping


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5120)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--shares", type=float, nargs="*", default=[0.0, 0.2, 0.55],
                        help="cpu_decode_share values to try besides the default")
    parser.add_argument("--out", default="results/gpu_decode_interference_h200.json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hpcdl-jpeg-beside-"))
    write_images(root, args.images)
    store = AugmentedImageDatastore(ImageDatastore(root, channels=3), [224, 224], crop="random",
                                    random_x_reflection=True)
    files = [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p in store.store.paths]
    gil = gil_share_during_decode(files[:args.batch])
    print(f"another thread's Python speed while nvJPEG decodes 256 files: {gil:.2f} of its speed alone", flush=True)
    synthetic = (torch.rand(args.images, 3, 224, 224, device="cuda"), torch.randint(10, (args.images,), device="cuda"))
    chunks = list(torch.randperm(args.images).split(args.batch))
    device = torch.device("cuda")

    loader = BatchLoader(store, device, torch.channels_last, background=True, workers=1, gpu_decode=True)
    batches = [loader.loader.collate_fn([loader.loader.dataset[(int(i), 0)] for i in c]) for c in chunks[:4]]

    def stage(stop: threading.Event) -> None:  # decode + augment of bytes in memory, on a side stream
        done, start = 0, time.perf_counter()
        with torch.cuda.stream(torch.cuda.Stream()):
            while not stop.is_set():
                for batch in batches:
                    decode_on_device(batch, store, device, torch.channels_last)
                torch.cuda.current_stream().synchronize()
                done += sum(len(b.indices) for b in batches)
        print(f"  the stage beside made {done / (time.perf_counter() - start):.0f} images/s", flush=True)

    def decoding(share: float) -> tuple[float, float]:
        spent = {"host batch": 0.0, "to device": 0.0, "batches": 0}
        host_batches, to_device = BatchLoader.host_batches, BatchLoader.to_device

        def timed_host(self, chunks, epoch):  # noqa: ANN001, ANN202
            batches = host_batches(self, chunks, epoch)
            while True:
                start = time.perf_counter()
                batch = next(batches, None)
                spent["host batch"] += time.perf_counter() - start
                if batch is None:
                    return
                yield batch

        def timed_device(self, batch):  # noqa: ANN001, ANN202
            start = time.perf_counter()
            try:
                return to_device(self, batch)
            finally:
                spent["to device"] += time.perf_counter() - start
                spent["batches"] += 1

        BatchLoader.host_batches, BatchLoader.to_device = timed_host, timed_device
        try:
            start = time.perf_counter()
            result = hpcdl_run(store, args, False, gpu_decode="on", dispatch_in_background=True,
                               num_workers=args.workers, prefetch_factor=4, cpu_decode_share=share)
            print(f"  prefetch thread over {time.perf_counter() - start:.1f} s: waited for host batches "
                  f"{spent['host batch']:.2f} s, decoded {spent['to device']:.2f} s, {spent['batches']} batches",
                  flush=True)
            return result
        finally:
            BatchLoader.host_batches, BatchLoader.to_device = host_batches, to_device

    runs = {
        "synthetic": lambda: hpcdl_run(synthetic, args, False),
        "synthetic + decode stage beside": lambda: _beside(stage, synthetic, args),
        **{f"hpcdl-gpu-decode, cpu share {share}": (lambda share=share: decoding(share)) for share in args.shares},
    }
    figures: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(args.repeats):
        for name in (list(runs) if repeat % 2 == 0 else list(runs)[::-1]):
            rate, wait = runs[name]()
            figures[name].append(rate)
            print(f"{name:40s} {rate:8.0f} images/s  data wait {100 * wait:.1f}%", flush=True)
    base = statistics.median(figures["synthetic"])
    for name, rates in figures.items():
        print(f"{name:40s} median {statistics.median(rates):8.0f} ({min(rates):.0f}-{max(rates):.0f})  "
              f"ratio {statistics.median(rates) / base:.3f}")
    write_result(args.out, {"benchmark": "gpu_decode_interference", "gil_share_during_decode": gil,
                            **{k: {"median": statistics.median(v), "min": min(v), "max": max(v),
                                   "ratio": statistics.median(v) / base} for k, v in figures.items()}})


def _beside(work: Callable[[threading.Event], None], synthetic: tuple, args: argparse.Namespace) -> tuple[float, float]:
    with beside(work):
        return hpcdl_run(synthetic, args, False)


if __name__ == "__main__":
    main()
