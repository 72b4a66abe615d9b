from minisgl.scheduler.scheduler import CacheStats, Scheduler, TokenEvent

__all__ = ["CacheStats", "Scheduler", "TokenEvent"]
