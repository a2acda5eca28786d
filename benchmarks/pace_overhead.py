"""The cost of recording each rank's pace (hpcdl.distributed.pace): training steps with the recording on and off,
in one process, in interleaved blocks, so that both see the same machine.

"On" is what a rank of a multi-rank job does: a clock reading per step, the two marks of the backward and
gradient exchange (CUDA events on a GPU), the data wait noted, and the sampling thread folding them into a line
of its pace file every second (the shortest interval). "Off" trains the same steps without any of it. The
recording's own cost per step is also timed alone (``recording_us_per_step``): on a machine shared with other
work the two medians differ by more than that noise-free figure.

    python benchmarks/pace_overhead.py [--device cuda] [--model small_cnn|resnet18] [--batch 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import write_result
from hpcdl.config import TrainingOptions
from hpcdl.distributed import pace
from hpcdl.distributed.context import init_context
from hpcdl.models import build_model
from hpcdl.train.datawait import Wait, WaitClock
from hpcdl.train.loop import Step
from hpcdl.train.steps import autocast, make_loss, make_optimizer


def _block(step: Step, x: torch.Tensor, y: torch.Tensor, steps: int, on: bool, device: torch.device) -> float:
    """Seconds per step over ``steps`` steps, the device synchronised at both ends."""
    step.exchange = WaitClock(device) if on else None
    clock = WaitClock(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        asked = clock.mark() if on else None
        step(x, y, len(y), 0.01)
        if on:
            Wait(asked, clock.mark())  # the data wait's marks, as the loop takes them
            pace.step()
            pace.waited(0.0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def recording_cost_us(device: torch.device, repeats: int = 20000) -> float:
    """Microseconds the recording adds to one step, timed alone (no step between): the marks, the notes."""
    clock = WaitClock(device)
    start = time.perf_counter()
    for _ in range(repeats):
        began = clock.mark()
        pace.exchanged(Wait(began, clock.mark()))
        Wait(clock.mark(), clock.mark())
        pace.step()
        pace.waited(0.0)
    return 1e6 * (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--steps", type=int, default=50, help="steps per block")
    parser.add_argument("--blocks", type=int, default=20, help="blocks of each kind, interleaved")
    parser.add_argument("--out", default="benchmarks/results/pace_overhead.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    options = TrainingOptions(solver="sgdm")
    model = build_model(args.model, in_channels=3, num_classes=10).to(device)
    step = Step(model=model, forward=model, optimizer=make_optimizer(model, options, 0.01),
                scaler=torch.amp.GradScaler(device.type, enabled=False), loss_fn=make_loss(options),
                cast=autocast(options, device), context=init_context(options, device), options=options)
    x = torch.randn(args.batch, 3, args.image, args.image, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    with tempfile.TemporaryDirectory() as folder:
        pace.start(Path(folder), 0, "benchmark", window_s=10)  # a sample every second
        _block(step, x, y, args.steps, True, device)  # warm-up of both paths
        _block(step, x, y, args.steps, False, device)
        times: dict[bool, list[float]] = {True: [], False: []}
        for block in range(2 * args.blocks):
            on = block % 2 == (block // 2) % 2  # on, off, off, on, on, off, ...: neither always goes first
            times[on].append(_block(step, x, y, args.steps, on, device))
        cost_us = recording_cost_us(device)
        pace.finish()
        samples = len((Path(folder) / "pace" / "rank0.jsonl").read_text().splitlines())
    on, off = statistics.median(times[True]), statistics.median(times[False])
    result = {"device": str(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
              "model": args.model, "batch": args.batch, "image": args.image, "steps_per_block": args.steps,
              "blocks_each": args.blocks, "step_ms_on": round(1000 * on, 4), "step_ms_off": round(1000 * off, 4),
              "overhead_pct": round(100 * (on - off) / off, 3), "pace_lines_written": samples,
              "recording_us_per_step": round(cost_us, 3),
              "recording_pct_of_step_off": round(100 * cost_us / 1e6 / off, 4),
              "block_ms_on": [round(1000 * t, 4) for t in times[True]],
              "block_ms_off": [round(1000 * t, 4) for t in times[False]]}
    print(f"{result['device']} {args.model} batch {args.batch}: {result['step_ms_off']:.3f} ms/step off, "
          f"{result['step_ms_on']:.3f} ms on: overhead {result['overhead_pct']:+.2f}% (median of {args.blocks} "
          f"interleaved blocks each); the recording alone {cost_us:.2f} us/step "
          f"({100 * cost_us / 1e6 / off:.3f}% of a step)")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
