"""Batches made ready on a side CUDA stream, ``depth`` ahead of the training step.

A thread takes host batches (from the workers), copies, decodes and augments
each on its own stream and records an event; the step's stream waits on that
event alone, so batch N+1 is prepared while step N runs. Tensors handed across
streams are marked with ``record_stream`` so their memory is not reused before
the step's stream is done with it. The host functions involved (copies, nvJPEG)
release the GIL, so the thread does not hold the training loop back.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, Optional

import torch

from hpcdl.data.batches import Batch

_END = object()


def prefetched(batches: Iterator[Any], prepare: Callable[[Any], Optional[Batch]], device: torch.device,
               depth: int) -> Iterator[Optional[Batch]]:
    """``prepare(b)`` of every host batch ``b``, made on a side stream of ``device`` up to ``depth`` ahead."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    stream = torch.cuda.Stream(device)

    def hand_over(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            with torch.cuda.device(device), torch.cuda.stream(stream):
                for host in batches:
                    batch = prepare(host)
                    event = torch.cuda.Event()
                    event.record(stream)
                    if not hand_over((batch, event)):
                        return
        except BaseException as error:  # noqa: BLE001 - re-raised in the training loop
            hand_over(error)
            return
        hand_over(_END)

    thread = threading.Thread(target=work, name="hpcdl-device-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            batch, event = item
            if batch is None:
                yield None
                continue
            current = torch.cuda.current_stream(device)
            current.wait_event(event)
            for tensor in batch:
                tensor.record_stream(current)
            yield batch
    finally:
        stop.set()
        thread.join()
