"""Distributed training: strategy construction, multi-worker training, a local launcher and Horovod."""

from tfopt.distribute.environment import ClusterEnvironment, detect_environment
from tfopt.distribute.launcher import launch_local_workers
from tfopt.distribute.probe import keras_fit_works_multi_worker
from tfopt.distribute.strategy import make_strategy
from tfopt.distribute.training import fit

__all__ = ["ClusterEnvironment", "detect_environment", "fit", "keras_fit_works_multi_worker",
           "launch_local_workers", "make_strategy"]
