"""Tensor-parallel communication: who am I, and the two collectives the layers need.

Every rank runs the same scheduler on the same requests; layers call :func:`all_reduce` (after a
row-parallel matmul) and :func:`all_gather` (vocabulary shards of the logits). With one rank both
are identities, so the single-GPU and CPU paths pay nothing.

The collectives go through a :class:`Communicator`, registered by name in ``COMMUNICATORS`` (the
plug-in point for a faster one: custom all-reduce, symmetric memory; lab 10's seam); the default
wraps ``torch.distributed``.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from minisgl.registry import Registry


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    def shard(self, n: int, what: str = "dimension") -> tuple[int, int]:
        """The slice ``[start, end)`` of ``n`` that this rank owns (``n`` must divide evenly)."""
        if n % self.size:
            raise ValueError(f"cannot split {what} of size {n} over tp={self.size}")
        step = n // self.size
        return self.rank * step, (self.rank + 1) * step


class Communicator(ABC):
    """The collectives of one TP group. Every rank calls them in the same order with tensors of the
    same shape and dtype; each returns the same result on every rank."""

    def __init__(self, group: dist.ProcessGroup | None):
        self.group = group

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over ranks (may be computed in place in ``x``)."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim`` in rank order."""


class TorchCommunicator(Communicator):
    """``torch.distributed`` over the group (NCCL on CUDA, gloo on CPU)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        world = dist.get_world_size(self.group)
        x = x.contiguous()
        if x.is_cuda:  # one NCCL call into a [world * n, ...] buffer
            out = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
            dist.all_gather_into_tensor(out, x, group=self.group)
            parts = out.chunk(world, dim=0)
        else:  # gloo has no all_gather_into_tensor
            parts = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=dim)


class SymmMemCommunicator(TorchCommunicator):
    """Small all-reduces (a decode step's ``[batch, hidden]``) as one kernel over symmetric memory:
    every rank copies its input into a buffer that all ranks have mapped over NVLink, waits for the
    others at a barrier in device memory, then reads and sums every rank's buffer (torch's
    ``symm_mem`` one-shot all-reduce: no NVLink multicast, capturable in CUDA graphs). NCCL's ring
    pays a fixed latency per call that dominates at these sizes; larger messages (prefill) and CPU
    groups still go to NCCL / gloo. Falls back to NCCL entirely when the buffers cannot be mapped."""

    MAX_BYTES = 8 << 20  # per call; one buffer of this size per dtype and rank

    def __init__(self, group: dist.ProcessGroup | None):
        super().__init__(group)
        self._buffers: dict[torch.dtype, torch.Tensor] = {}
        if not torch.cuda.is_available() or dist.get_backend(group) != "nccl":
            return
        import torch.distributed._symmetric_memory as symm_mem

        self._name = (group or dist.group.WORLD).group_name
        device = torch.device("cuda", torch.cuda.current_device())
        try:  # collective: every rank maps every other rank's buffers here, never later (graph capture)
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                buf = symm_mem.empty(self.MAX_BYTES // dtype.itemsize, dtype=dtype, device=device)
                symm_mem.rendezvous(buf, self._name)
                self._buffers[dtype] = buf
        except Exception as e:  # e.g. no peer access between these GPUs
            logging.getLogger(__name__).warning("symmetric memory unavailable (%s): all-reduce stays on NCCL", e)
            self._buffers = {}

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(x.dtype)
        if buf is None or x.numel() > buf.numel() or not x.is_contiguous():
            return super().all_reduce(x)
        out = torch.empty_like(x)
        torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf[: x.numel()].view_as(x), x, "sum", self._name, out)
        return out


# name -> factory(process group)
COMMUNICATORS: Registry[type[Communicator]] = Registry(
    "communicator", {"default": TorchCommunicator, "nccl": TorchCommunicator, "symm-mem": SymmMemCommunicator}
)

COLLECTIVE_TIMEOUT = timedelta(seconds=120)
IDLE_TIMEOUT = timedelta(days=7)
JOIN_POLL_S = 0.1

_TP = TPInfo()
_COMM: Communicator | None = None
_CPU_GROUP: dist.ProcessGroup | None = None


def get_tp_info() -> TPInfo:
    return _TP


def get_communicator() -> Communicator | None:
    """This process's communicator (None with one rank)."""
    return _COMM


def set_tp_info(info: TPInfo) -> None:
    global _TP
    _TP = info


def init_distributed(
    rank: int,
    size: int,
    device: torch.device,
    init_method: str,
    communicator: str = "default",
    check_peers: Callable[[], None] | None = None,
) -> None:
    """Join the TP group. ``init_method`` is a ``tcp://host:port`` rank 0 listens on.

    Rank 0 waits until every rank has checked in, calling ``check_peers`` (which raises when a
    rank died, e.g. before it could start) every ``JOIN_POLL_S``, so a dead rank is an error at
    once instead of a rendezvous timeout. Then creates the device group (NCCL or gloo; a dead peer
    surfaces as an error within ``COLLECTIVE_TIMEOUT``) and a gloo CPU group for broadcasting
    requests, whose timeout is long because idle ranks wait in it for as long as rank 0 is idle."""
    global _COMM, _CPU_GROUP
    set_tp_info(TPInfo(rank, size))
    if size == 1:
        return
    make_comm = COMMUNICATORS.get(communicator)  # an unknown name fails before the rendezvous
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        # NVLink multicast can take a shared host's GPUs down; never let NCCL use it here.
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
    store = dist.TCPStore(
        host, int(port), size, is_master=rank == 0, timeout=COLLECTIVE_TIMEOUT, wait_for_workers=False
    )
    if rank == 0:
        joined = [f"minisgl/joined/{r}" for r in range(1, size)]
        deadline = time.monotonic() + COLLECTIVE_TIMEOUT.total_seconds()
        while not store.check(joined):
            if check_peers is not None:
                check_peers()
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel ranks did not join within {COLLECTIVE_TIMEOUT}")
            time.sleep(JOIN_POLL_S)
    else:
        store.set(f"minisgl/joined/{rank}", "1")
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT)
    _COMM = make_comm(dist.group.WORLD)
    _CPU_GROUP = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


def destroy_distributed() -> None:
    global _COMM, _CPU_GROUP
    if dist.is_initialized():
        dist.destroy_process_group()
    _COMM, _CPU_GROUP = None, None
    set_tp_info(TPInfo())


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP.size == 1:
        return x
    assert _COMM is not None, "init_distributed() was not called"
    return _COMM.all_reduce(x)


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if _TP.size == 1:
        return x
    assert _COMM is not None, "init_distributed() was not called"
    return _COMM.all_gather(x, dim)


def broadcast_objects(objs: list | None) -> list:
    """Rank 0's list of Python objects, on every rank (over the gloo CPU group)."""
    if _TP.size == 1:
        assert objs is not None
        return objs
    box = [objs if _TP.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=_CPU_GROUP)
    return box[0]
