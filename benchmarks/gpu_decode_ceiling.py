"""How fast GPU JPEG decoding runs beside ResNet-50 training, by decoder, and what holds it there.

Each decoder decodes the same 500x375 JPEG files (in memory) in a background thread, on a stream of its own,
while the main thread does one of: nothing; trains ResNet-50 (bf16, channels_last, batch 256, synthetic data
on the GPU, a plain loop); runs large bf16 matmuls that fill the GPU with few Python calls; or spins in Python,
holding the GIL with no GPU work. Printed: the decoder's images/s in each case, and the training's images/s
with the decoder beside it as a ratio of training alone. Decoders: torchvision's nvJPEG batch decode (256 and
1024 files a call) and, where ``nvidia-nvimgcodec`` is installed, nvImageCodec (one and two decoders on
high-priority streams, and its hardware-only backend). Cases alternate between two repetitions; medians.

    python benchmarks/gpu_decode_ceiling.py [--images 2048 --seconds 3 --repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from common import write_result  # benchmarks/common.py
from jpeg_resnet50 import new_model, write_images

Decode = Callable[[list[int], torch.cuda.Stream], None]


def decoders(raw: list[bytes]) -> dict[str, tuple[list[Decode], int, int]]:
    """name: (one decode function per decoding thread, files per call, stream priority)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    files = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in raw]

    def torchvision_nvjpeg(chosen: list[int], stream: torch.cuda.Stream) -> None:
        decode_jpeg([files[i] for i in chosen], mode=ImageReadMode.RGB, device="cuda")

    found: dict[str, tuple[list[Decode], int, int]] = {
        "torchvision nvJPEG, 256 a call": ([torchvision_nvjpeg], 256, 0),
        "torchvision nvJPEG, 1024 a call": ([torchvision_nvjpeg], 1024, 0),
    }
    try:
        from nvidia import nvimgcodec
    except ImportError:
        print("nvidia-nvimgcodec is not installed: its rows are left out", flush=True)
        return found

    def nvimgcodec_decode(**options) -> Decode:  # noqa: ANN003
        decoder = nvimgcodec.Decoder(device_id=torch.cuda.current_device(), **options)

        def decode(chosen: list[int], stream: torch.cuda.Stream) -> None:
            images = decoder.decode([nvimgcodec.CodeStream(raw[i]) for i in chosen], cuda_stream=stream.cuda_stream)
            for image in images:
                torch.from_dlpack(image)
        return decode

    hardware = [nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)]
    found.update({
        "nvImageCodec, 1 decoder": ([nvimgcodec_decode()], 256, -1),
        "nvImageCodec, 2 decoders": ([nvimgcodec_decode(), nvimgcodec_decode()], 256, -1),
        "nvImageCodec hardware only": ([nvimgcodec_decode(backends=hardware)], 256, -1),
    })
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2048, help="a multiple of 1024")
    parser.add_argument("--seconds", type=float, default=3.0, help="each measurement")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="results/gpu_decode_ceiling_h200.json")
    args = parser.parse_args()
    if args.images % 1024:
        parser.error("--images must be a multiple of 1024 (the largest call, and two decoders' shares of it)")
    root = Path(tempfile.mkdtemp(prefix="hpcdl-jpeg-ceiling-"))
    mean_kb = write_images(root, args.images) / 1000
    raw = [path.read_bytes() for path in sorted(root.rglob("*.jpg"))]
    model = new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.rand(256, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(10, (256,), device="cuda")
    square = torch.rand(12288, 12288, device="cuda", dtype=torch.bfloat16)

    def train(seconds: float) -> float:
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            with torch.autocast("cuda", torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            if steps % 10 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        return steps * 256 / (time.perf_counter() - start)

    def matmuls(seconds: float) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(4):
                square @ square
            torch.cuda.synchronize()
        return 0.0

    def spin(seconds: float) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            pass
        return 0.0

    def idle(seconds: float) -> float:
        time.sleep(seconds)
        return 0.0

    beside: dict[str, Callable[[float], float]] = {"alone": idle, "beside training": train,
                                                   "beside matmuls": matmuls, "beside a GIL-holding thread": spin}

    def measure(decode: list[Decode], per_call: int, priority: int, main_work: Callable[[float], float]
                ) -> tuple[float, float]:
        """(images/s decoded while ``main_work`` ran, its own rate); a call that straddles the end of that
        time counts for the share of it that falls within."""
        calls_done: list[list[tuple[float, float, int]]] = [[] for _ in decode]
        stop, started = threading.Event(), threading.Barrier(len(decode) + 1)

        def work(k: int) -> None:
            stream = torch.cuda.Stream(priority=priority)
            calls = [list(range(i, i + per_call)) for i in range(k * per_call, len(raw), per_call * len(decode))]
            with torch.cuda.stream(stream):
                started.wait()
                while not stop.is_set():
                    for chosen in calls:
                        if stop.is_set():
                            break
                        begun = time.perf_counter()
                        decode[k](chosen, stream)
                        stream.synchronize()
                        calls_done[k].append((begun, time.perf_counter(), len(chosen)))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(len(decode))]
        for thread in threads:
            thread.start()
        started.wait()
        start = time.perf_counter()
        main_rate = main_work(args.seconds)
        end = time.perf_counter()
        stop.set()
        for thread in threads:
            thread.join()
        images = sum(n * max(0.0, min(1.0, (end - begun) / (ended - begun)))
                     for done in calls_done for begun, ended, n in done)
        return images / (end - start), main_rate

    found = decoders(raw)
    for decode, per_call, _ in found.values():  # warm-up: decoder set-up and first calls
        for one in decode:
            one(list(range(per_call)), torch.cuda.current_stream())
    train(3.0)
    figures: dict[str, list[float]] = {}
    cases = [(name, where) for name in found for where in beside]
    for repeat in range(args.repeats):
        figures.setdefault("training alone", []).append(train(args.seconds))
        for name, where in (cases if repeat % 2 == 0 else cases[::-1]):
            decoded, trained = measure(*found[name], beside[where])
            figures.setdefault(f"{name}: {where}", []).append(decoded)
            if where == "beside training":
                figures.setdefault(f"training beside {name}", []).append(trained)
            print(f"{name:34s} {where:28s} {decoded:7.0f} images/s decoded", flush=True)
    alone = statistics.median(figures["training alone"])
    result = {"benchmark": "gpu_decode_ceiling", "images": args.images, "mean_file_kb": mean_kb,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for key, values in figures.items():
        median = statistics.median(values)
        entry = {"median": median, "min": min(values), "max": max(values)}
        if key.startswith("training"):
            entry["ratio_to_training_alone"] = median / alone
        result[key] = entry
        print(f"{key:66s} {median:7.0f} ({min(values):.0f}-{max(values):.0f})"
              + (f"  ratio {median / alone:.3f}" if key.startswith("training") else ""), flush=True)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
