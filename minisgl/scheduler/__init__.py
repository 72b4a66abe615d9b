"""Continuous batching: the scheduler and the policies it is made of, each swappable by name
(``ADMISSION_POLICIES``, ``CHUNKING_POLICIES``, ``LOOPS``)."""

from minisgl.scheduler.admission import ADMISSION_POLICIES, AdmissionContext, AdmissionPolicy, Optimistic, ReserveAll
from minisgl.scheduler.chunking import CHUNKING_POLICIES, ChunkingPolicy, GreedyChunking
from minisgl.scheduler.events import BatchEvent, CacheStats, TokenEvent
from minisgl.scheduler.loop import LOOPS, Phases, SchedulerLoop
from minisgl.scheduler.loops import OverlapLoop, PlainLoop
from minisgl.scheduler.scheduler import Scheduler

__all__ = [
    "ADMISSION_POLICIES",
    "AdmissionContext",
    "AdmissionPolicy",
    "BatchEvent",
    "CHUNKING_POLICIES",
    "CacheStats",
    "ChunkingPolicy",
    "GreedyChunking",
    "LOOPS",
    "Optimistic",
    "OverlapLoop",
    "Phases",
    "PlainLoop",
    "ReserveAll",
    "Scheduler",
    "SchedulerLoop",
    "TokenEvent",
]
