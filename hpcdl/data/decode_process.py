"""GPU decoding in a process of its own, feeding the training process through shared CUDA memory.

The training loop and a decoding thread share one interpreter lock: every
Python line of the step (optimizer, hooks, autocast) stalls the thread that
hands file bytes to nvJPEG and back, and GPU decoding then keeps up with eager
ResNet-50 but not with a compiled one. Here a child process (spawned: the
parent has CUDA) runs the background workers, nvJPEG and the GPU augmentation
exactly as the in-process path does (hpcdl.data.encoded) and writes each
batch's uint8 images and labels into one of a few slots of GPU memory that
both processes map (CUDA IPC through torch.multiprocessing). The child
finishes a slot's work before it names the slot; the parent converts the slot
into the step's float32 batch and gives the slot back once that copy has run
on the GPU. Same draws, same images, same order as the in-process path; an
error in the child (a bad file, a dead worker) is raised in the parent, and a
child that dies is named.
"""

from __future__ import annotations

import dataclasses
import os
import queue
from typing import Any, Iterator, Optional, Sequence

import torch
import torch.multiprocessing as mp
from multiprocessing.util import Finalize

from hpcdl.data.batches import Batch

_POLL_S = 1.0
_RETURN_POLL_S = 0.001


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """What the child needs to build the same loader as the in-process path."""

    data: Any
    """The augmented datastore (pickled into the child)."""
    device: int
    workers: Optional[int]
    prefetch: int
    seed: int
    cpu_decode_share: float
    slots: int
    """GPU slots in flight, >= 2: one the parent converts, the others the child fills."""


class DecodeProcess:
    """``epoch(chunks, epoch)`` yields the device batches of those index chunks, decoded in a child process."""

    def __init__(self, spec: DecodeSpec, memory_format: torch.memory_format) -> None:
        context = mp.get_context("spawn")
        self.device = torch.device("cuda", spec.device)
        self.memory_format = memory_format
        self.requests, self.replies, self.free = context.Queue(), context.Queue(), context.Queue()
        self.skipped = 0
        self.slots: Optional[tuple[list[torch.Tensor], list[torch.Tensor]]] = None
        self.returning: list[tuple[int, torch.cuda.Event]] = []
        # not a daemon: a daemon may not start the background workers; ended before exit by the finalizer
        self.child = context.Process(target=_serve, args=(spec, self.requests, self.replies, self.free, os.getpid()),
                                     name="hpcdl-gpu-decode")
        self.child.start()
        self.ending = Finalize(self, _end, args=(self.requests, self.child), exitpriority=10)

    def epoch(self, chunks: Sequence[torch.Tensor], epoch: int) -> Iterator[Optional[Batch]]:
        """The batches of ``chunks`` in order on the device; None for a batch whose every file was skipped."""
        self.requests.put(("epoch", [chunk.tolist() for chunk in chunks], epoch))
        ended = False
        try:
            while True:
                kind, *rest = self._reply()
                if kind == "end":
                    ended = True
                    return
                if kind == "none":
                    self.skipped += rest[0]
                    yield None
                    continue
                slot, count, skipped = rest
                self.skipped += skipped
                yield self._take(slot, count)
        finally:
            if not ended:  # the loop stopped early: the child stops at its next batch, its slots come back
                self.requests.put(("stop-epoch",))
                while self._reply()[0] != "end":
                    pass

    def close(self) -> None:
        """Stop the child and its workers."""
        self.ending()
        self.slots = None

    def _reply(self) -> tuple:
        """The child's next message; its error raised here; its death named."""
        while True:
            self._give_back()
            try:  # slots still on their way back are looked at again soon: the child may wait for one
                message = self.replies.get(timeout=_RETURN_POLL_S if self.returning else _POLL_S)
            except queue.Empty:
                if not self.child.is_alive():
                    raise RuntimeError(f"the GPU decoding process (pid {self.child.pid}) ended with exit code "
                                       f"{self.child.exitcode} without finishing the epoch") from None
                continue
            if message[0] == "slots":
                self.slots = message[1], message[2]
                continue
            if message[0] == "error":
                raise message[1]
            return message

    def _take(self, slot: int, count: int) -> Batch:
        """The step's float32 batch from a slot the child has filled; the slot goes back once copied."""
        assert self.slots is not None, "the decoding process named a slot before sharing them"
        images, labels = self.slots
        x = images[slot][:count].to(torch.float32, memory_format=self.memory_format).div_(255.0)
        y = labels[slot][:count].clone()
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(self.device))
        self.returning.append((slot, copied))
        return x, y

    def _give_back(self) -> None:
        """Hand the child the slots whose copies the GPU has finished."""
        still = []
        for slot, copied in self.returning:
            if copied.query():
                self.free.put(slot)
            else:
                still.append((slot, copied))
        self.returning = still


def _end(requests: Any, child: Any) -> None:
    """Ask the child to quit, and kill it if it has not within 10 s."""
    if child.is_alive():
        requests.put(("quit",))
        child.join(timeout=10)
    if child.is_alive():
        child.kill()
        child.join()


def _serve(spec: DecodeSpec, requests: Any, replies: Any, free: Any, parent: int) -> None:
    """The child: one loader as the in-process path builds it; each batch decoded into a free slot. A sender
    thread names each slot once the GPU has finished it, so the next batch's decoding is queued meanwhile."""
    import threading

    from hpcdl.data.encoded import decoded_uint8
    from hpcdl.data.loader import BatchLoader

    device = torch.device("cuda", spec.device)
    torch.cuda.set_device(device)
    loader = BatchLoader(spec.data, device, torch.contiguous_format, True, spec.workers, spec.prefetch, spec.seed,
                         gpu_decode=True, cpu_decode_share=spec.cpu_decode_share)
    finished: queue.Queue = queue.Queue()  # (message, event or None) in batch order

    def send() -> None:
        while True:
            message, event = finished.get()
            if message is None:
                return
            if event is not None:
                event.synchronize()  # whole before it is named
            replies.put(message)

    sender = threading.Thread(target=send, name="hpcdl-decode-sender", daemon=True)
    sender.start()
    slots: Optional[tuple[list[torch.Tensor], list[torch.Tensor]]] = None
    try:
        while True:
            request = _next(requests, parent)
            if request is None or request[0] == "quit":
                return
            if request[0] != "epoch":  # a stop for an epoch that had already ended
                continue
            _, chunks, epoch = request
            try:
                for host in loader.host_batches([torch.tensor(c, dtype=torch.long) for c in chunks], epoch):
                    if _stopped(requests):
                        break
                    decoded, skipped = decoded_uint8(host, spec.data, device)
                    if decoded is None:
                        finished.put((("none", skipped), None))
                        continue
                    x, y = decoded
                    if slots is None:
                        slots = _new_slots(x, max(len(c) for c in chunks), spec.slots)
                        finished.put((("slots", *slots), None))
                        for slot in range(spec.slots):
                            free.put(slot)
                    slot = _next(free, parent)
                    if slot is None:
                        return
                    slots[0][slot][:len(x)].copy_(x)
                    slots[1][slot][:len(y)].copy_(y)
                    event = torch.cuda.Event()
                    event.record(torch.cuda.current_stream(device))
                    finished.put((("batch", slot, len(x), skipped), event))
            except Exception as error:  # noqa: BLE001 - raised again in the training process
                finished.put((("error", _sendable(error)), None))
            finished.put((("end",), None))
    finally:
        finished.put((None, None))
        sender.join()
        loader.close()


def _new_slots(x: torch.Tensor, batch: int, count: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    images = [torch.empty((batch, *x.shape[1:]), dtype=x.dtype, device=x.device) for _ in range(count)]
    labels = [torch.empty(batch, dtype=torch.long, device=x.device) for _ in range(count)]
    return images, labels


def _next(source: Any, parent: int) -> Any:
    """The next item of a queue from the parent; None once the parent is gone."""
    while True:
        try:
            return source.get(timeout=_POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _stopped(requests: Any) -> bool:
    """Whether the parent asked to stop this epoch (anything else waiting is put back for later)."""
    try:
        request = requests.get_nowait()
    except queue.Empty:
        return False
    if request[0] == "stop-epoch":
        return True
    requests.put(request)  # a quit: the epoch stops, the serving loop then reads it
    return request[0] == "quit"


def _sendable(error: Exception) -> Exception:
    """The error itself where it pickles, else a RuntimeError with its text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(error).__name__}: {error}")
