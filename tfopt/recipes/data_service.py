"""Preprocessing beyond the host's cores: the pipeline runs on tf.data service workers.

Where the graph rewrite has made every stage parallel and the host's cores are all busy, more parallelism
on the same host cannot help; the tf.data service (TensorFlow's dispatcher and workers) runs the pipeline
in other processes and streams the batches back. This recipe decides from the pipeline's graph whether and
how (`tfopt.data.service`: what cannot leave this process, the sharding that keeps epochs right, the
compression); `build()` then starts the local cluster where one is asked for and reads the pipeline back
from the service. It comes after the graph rewrite in the DATA stage, so the workers run the rewritten
pipeline; the batches it hands on are the same, in an order the workers' timing decides.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, ClassVar

from tfopt.errors import DataError, RecipeConfigError
from tfopt.plan import Plan
from tfopt.recipes.base import Recipe, Stage

if TYPE_CHECKING:
    import tensorflow as tf

COMPRESSION_CHOICES = ("auto", "none", "snappy")
_ADDRESS = re.compile(r"^(grpc://)?[A-Za-z0-9_.\-\[\]:]+:\d+$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataService(Recipe):
    """Runs the input pipeline on tf.data service workers: a running cluster, or N worker processes here.

    Args:
        dispatcher: "grpc://host:port" (or "host:port") of a running dispatcher, e.g. one started with
            `tfopt-recipe data-service dispatcher --port P`.
        workers: Start a dispatcher and this many worker processes on this machine (127.0.0.1) for the run,
            for a host with spare cores; they stop when the run ends. One where no dispatcher is given.
        compression: "auto" (none on this host; Snappy for elements from 64 KiB on over a network), "none"
            or "snappy".
        job_name: The tf.data service job that every training worker reads, so that they share the
            preprocessing; by default one derived from the training cluster (TF_CONFIG or the Slurm job).
        answer_timeout_seconds: How long to wait for the dispatcher to answer before failing with its address
            (a host that accepts the connection and never answers would otherwise hang the run).
        start_timeout_seconds: How long to wait for another process to start its part: each worker process
            started here to serve, and, in a multi-worker run, the chief to register the shared pipeline.

    Example:
        >>> DataService(workers=2).get_config()  # doctest: +NORMALIZE_WHITESPACE
        {'dispatcher': None, 'workers': 2, 'compression': 'auto', 'job_name': None, 'answer_timeout_seconds': 10.0,
         'start_timeout_seconds': 120.0}
    """

    name: ClassVar[str] = "data_service"
    stage: ClassVar[Stage] = Stage.DATA

    dispatcher: str | None = None
    workers: int | None = None
    compression: str = "auto"
    job_name: str | None = None
    answer_timeout_seconds: float = 10.0
    start_timeout_seconds: float = 120.0

    def __post_init__(self) -> None:
        if self.dispatcher is None and self.workers is None:
            object.__setattr__(self, "workers", 1)
        if (self.dispatcher is None) == (self.workers is None):
            raise RecipeConfigError(
                "data_service: give dispatcher (a running service, e.g. dispatcher: grpc://data-dispatcher:5050) or "
                "workers (worker processes tfopt starts on this machine, e.g. workers: 2), not both; received "
                f"dispatcher={self.dispatcher!r}, workers={self.workers!r}.",
                setting="workers" if self.dispatcher is None else "dispatcher",
            )
        if self.dispatcher is not None and (
            not isinstance(self.dispatcher, str) or not _ADDRESS.match(self.dispatcher)
        ):
            raise RecipeConfigError(
                f"data_service: dispatcher={self.dispatcher!r} is not an address. Expected "
                "grpc://host:port or host:port, e.g. grpc://10.0.0.5:5050.",
                setting="dispatcher",
            )
        if self.workers is not None and (
            isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1
        ):
            raise RecipeConfigError(
                f"data_service: workers={self.workers!r} must be a whole number of at least 1, "
                "e.g. workers: 1 for one worker process on the spare cores.",
                setting="workers",
            )
        if self.compression not in COMPRESSION_CHOICES:
            raise RecipeConfigError(
                f"data_service: compression={self.compression!r} is not valid. Expected one of "
                f"{', '.join(map(repr, COMPRESSION_CHOICES))}.",
                setting="compression",
            )
        if self.job_name is not None and (not isinstance(self.job_name, str) or not self.job_name.strip()):
            raise RecipeConfigError(
                f"data_service: job_name={self.job_name!r} must be a non-empty string.", setting="job_name"
            )
        for setting, example in (
            ("answer_timeout_seconds", "30 for a dispatcher on a busy network"),
            ("start_timeout_seconds", "300 for workers that start slowly"),
        ):
            seconds = getattr(self, setting)
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:
                raise RecipeConfigError(
                    f"data_service: {setting}={seconds!r} must be a number of seconds above 0 and at most 3600, "
                    f"e.g. {example}.",
                    setting=setting,
                )

    def __call__(self, plan: Plan) -> Plan:
        from tfopt.data.service import plan_offload, served_form
        from tfopt.distribute.environment import detect_environment

        cluster = detect_environment()
        if self.workers is not None and cluster.num_workers > 1:
            return plan.record(
                self.name,
                f"left local: {cluster.num_workers} training workers ({cluster.reason}) "
                "would each start a cluster of their own and preprocess the whole dataset; "
                "give them one shared service with dispatcher: grpc://HOST:PORT",
                skipped=True,
            )
        length = int(plan.dataset.cardinality())
        if cluster.num_workers > 1 and length < 0:
            what = "endless (repeat() without a count)" if length == -1 else "of a length tf.data does not know"
            return plan.record(
                self.name,
                f"left local: {cluster.num_workers} training workers share one stream, cut "
                f"into epochs by the pipeline's length, and the pipeline is {what}; give "
                "it a known length (assert_cardinality)",
                skipped=True,
            )
        dataset, served_change = served_form(plan.dataset, own_pipeline=plan.source is not None)
        offload, why = plan_offload(
            dataset,
            dispatcher=self._target(),
            workers=self.workers,
            compression=self.compression,
            job_name=self.job_name,
            batch_size=plan.batch_size,
            batches_per_pass=int(plan.dataset.cardinality()),
            answer_timeout_seconds=self.answer_timeout_seconds,
            start_timeout_seconds=self.start_timeout_seconds,
        )
        if offload is None:
            return plan.record(self.name, why, skipped=True)
        return plan.replace(data_service=offload).record(
            self.name, "; ".join(filter(None, [offload.describe(), served_change]))
        )

    def _target(self) -> str | None:
        if self.dispatcher is None:
            return None
        return self.dispatcher if self.dispatcher.startswith("grpc://") else f"grpc://{self.dispatcher}"


def offload_pipeline(
    dataset: tf.data.Dataset,
    *,
    batch_size: int,
    dispatcher: str | None = None,
    workers: int | None = None,
    compression: str = "auto",
) -> tuple[Any, Any]:
    """The recipe's functional form: `dataset` (batched) as read back from tf.data service workers.

    Args:
        dataset: The batched pipeline.
        batch_size: Its batch size.
        dispatcher, workers, compression: As `DataService`'s.

    Returns:
        The pipeline read back from the service, and the cluster started on this host for `workers` (None
        with a dispatcher), whose `close()` stops its worker processes.

    Raises:
        DataError: The pipeline cannot run in a worker (the reason says which op and why), or no dispatcher
            answers.

    Example:
        >>> served, cluster = offload_pipeline(dataset, batch_size=32, workers=1)  # doctest: +SKIP
        >>> model.fit(served, epochs=3); cluster.close()  # doctest: +SKIP
    """
    from tfopt.data.service import plan_offload
    from tfopt.data.service_client import serve_offload

    recipe = DataService(dispatcher=dispatcher, workers=workers, compression=compression)
    offload, why = plan_offload(
        dataset, dispatcher=recipe._target(), workers=workers, compression=compression, batch_size=batch_size
    )
    if offload is None:
        raise DataError(f"data_service: the pipeline cannot be offloaded: {why.removeprefix('left local: ')}.")
    return serve_offload(dataset, offload, batch_size=batch_size)
