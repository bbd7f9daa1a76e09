"""Distributed training: strategy construction, multi-worker training, a local launcher and Horovod."""

from tfopt.distribute.environment import detect_environment
from tfopt.distribute.launcher import launch_local_workers
from tfopt.distribute.strategy import make_strategy
from tfopt.distribute.training import fit

__all__ = ["detect_environment", "fit", "launch_local_workers", "make_strategy"]
