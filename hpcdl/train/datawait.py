"""How long each training step waited for its input, and nothing else.

On a GPU the wait is read off the step's own stream: one timing event when the
loop asks for the batch (it completes once the previous step's work is done or
the host got there, whichever is later) and one once the batch is usable (after
the host got it and the stream waited on its copy and decoding). The time
between them is what the step waited: host batches, copies and decoding that
did not overlap, and none of the previous step's compute. The events are read
when the records are (no host synchronisation per step). On the CPU the wait is
the host time spent getting the batch.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Union

import torch


class Wait:
    """One step's wait: two timing events on the step's stream, or host seconds."""

    def __init__(self, asked: Union[float, torch.cuda.Event], ready: Union[float, torch.cuda.Event]) -> None:
        self.asked, self.ready = asked, ready

    def passed(self) -> bool:
        """Whether both marks have passed (a GPU's events completed), so that ``seconds`` can be read."""
        return isinstance(self.ready, float) or self.ready.query()

    def seconds(self) -> float:
        """The wait in seconds (both events must have completed: read after the step's results)."""
        if isinstance(self.asked, float):
            return self.ready - self.asked
        return self.asked.elapsed_time(self.ready) / 1000.0


class WaitClock:
    """Marks when the loop asks for a batch and when it is ready to use, on the device's timeline."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> Union[float, torch.cuda.Event]:
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def timed(self, batches: Iterator[Any]) -> Iterator[tuple[Any, Wait]]:
        """Each batch with the wait for it."""
        end = object()
        try:
            while True:
                asked = self.mark()
                batch = next(batches, end)
                if batch is end:
                    return
                yield batch, Wait(asked, self.mark())
        finally:
            if hasattr(batches, "close"):  # a stopped run ends the prefetch thread now, not at collection
                batches.close()
