"""Gradient all-reduce through mpi4py: buckets of gradients, each started as soon as it is ready.

Horovod-style: a hook on every parameter counts gradients as backward produces
them; a full bucket is copied into a (pinned, for CUDA) host buffer and handed
to a non-blocking MPI all-reduce while backward goes on. ``finish`` waits for
every bucket and writes the sums back. Host staging keeps this correct on MPI
libraries that are not CUDA-aware.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

BUCKET_BYTES = 25 * 1024 * 1024


class MpiGradientReducer:
    """Sums the gradients of ``model`` over ``comm`` (an mpi4py communicator) after each backward."""

    def __init__(self, model: nn.Module, comm: Any, bucket_bytes: int = BUCKET_BYTES) -> None:
        from mpi4py import MPI

        self.mpi, self.comm = MPI, comm
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets: list[list[nn.Parameter]] = []
        current: list[nn.Parameter] = []
        size = 0
        for param in reversed(params):  # gradients arrive from the last layer back
            current.append(param)
            size += param.numel() * 4
            if size >= bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        pin = params[0].is_cuda if params else False
        self.buffers = [torch.empty(sum(p.numel() for p in b), dtype=torch.float32, pin_memory=pin)
                        for b in self.buckets]
        self.ready = [0] * len(self.buckets)
        self.requests: list[Any] = [None] * len(self.buckets)
        for param in params:
            param.register_post_accumulate_grad_hook(self._on_gradient)

    def _on_gradient(self, param: torch.Tensor) -> None:
        index = self.bucket_of[id(param)]
        self.ready[index] += 1
        if self.ready[index] == len(self.buckets[index]):
            self._start(index)
        active = [r for r in self.requests if r is not None]
        if active:
            self.mpi.Request.Testall(active)  # lets MPI progress the transfers already started

    def _start(self, index: int) -> None:
        flat, offset = self.buffers[index], 0
        for param in self.buckets[index]:
            n = param.numel()
            if param.grad is None:
                flat[offset:offset + n].zero_()
            else:
                flat[offset:offset + n].copy_(param.grad.detach().reshape(-1), non_blocking=True)
            offset += n
        if self.buckets[index][0].is_cuda:
            torch.cuda.current_stream().synchronize()  # the host copy must land before MPI reads it
        self.requests[index] = self.comm.Iallreduce(self.mpi.IN_PLACE, flat.numpy(), op=self.mpi.SUM)

    def finish(self) -> None:
        """Wait for every bucket (starting those whose parameters got no gradient) and write sums back."""
        for index, request in enumerate(self.requests):
            if request is None:
                self._start(index)
        self.mpi.Request.Waitall(self.requests)
        for index, bucket in enumerate(self.buckets):
            flat, offset = self.buffers[index], 0
            for param in bucket:
                n = param.numel()
                summed = flat[offset:offset + n].view_as(param).to(param.device, non_blocking=True)
                if param.grad is None:
                    param.grad = summed.to(param.dtype)
                else:
                    param.grad.copy_(summed)
                offset += n
        self.ready = [0] * len(self.buckets)
        self.requests = [None] * len(self.buckets)
