"""Reading a pipeline back from tf.data service workers, in the training process.

`tfopt.data.service` decides how a pipeline goes (`plan_offload`); this module sends it and reads it back.

Epochs: a distributed dataset's length is unknown to tf.data; the client takes one pass's batches per epoch
(`take`, the length asserted), so training sees the local steps per epoch. A single training process reads
each epoch as a service job of its own: one pass, each element once (several workers end it in up to one
partial batch each, which the client cuts again into the local batches). The training workers of a
multi-worker run share one job over the pipeline repeated without end (the chief registers it, the others
read it by id): each epoch is a window of that stream, exact in steps, one pass in elements only up to the
few batches around a pass's end that the workers made ahead.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any

from tfopt.data.service import Offload
from tfopt.errors import DataError

if TYPE_CHECKING:
    import tensorflow as tf

_log = logging.getLogger("tfopt")
# Batches the client holds ahead of training, beyond the requests tf.data service already keeps in flight.
CLIENT_PREFETCH_BATCHES = 2


def serve(
    dataset: tf.data.Dataset,
    offload: Offload,
    target: str,
    *,
    batch_size: int,
    static: bool | None = None,
    batches_per_pass: int | None = None,
) -> tf.data.Dataset:
    """The pipeline as read back from the service at `target`: distributed after its last batch, the batches
    cut again to `batch_size` where several workers share the splits, prefetched.

    Args:
        dataset: The batched pipeline the workers run.
        offload: How (`plan_offload`).
        target: The dispatcher, "grpc://host:port".
        batch_size: The pipeline's batch size.
        static: Cut full batches only (XLA's static shapes), dropping a pass's last partial one as the local
            pipeline would; by default where `dataset`'s batches are static. The build serves the pipeline
            from before it made the batches static, so that the workers drop no partial batches of their own.
        batches_per_pass: The batches of a pass as training reads them; by default `dataset`'s.

    One training process reads one pass per job: each epoch (each iterator) starts a job of its own, whose
    batches are cut again into the local pipeline's (each worker ends its share of a pass with a partial
    batch), so an epoch has the local pipeline's batches and elements; if a worker dies, the rest of the
    epoch comes from the next pass. In a multi-worker run (`tfopt.distribute.environment`) the chief
    registers the pipeline, served endlessly, under an id derived from the training cluster; the others wait
    for it (up to `offload.start_timeout_seconds`) and read it by id, all in one job, each taking its share of
    the batches of a pass per epoch, so the preprocessing is shared out, not done once per training worker.
    Their epochs are windows of that one stream: the workers make the next pass's batches before the last
    of this pass are read, so around a pass's end a few batches of the next one come in and as many of this
    one go to the next epoch.

    Raises:
        DataError: No dispatcher answers at `target` within `offload.answer_timeout_seconds`, or a training
            worker found no pipeline registered by its chief in time.
    """
    import tensorflow as tf
    from tensorflow.data.experimental import service

    from tfopt.distribute.environment import detect_environment

    _check_answers(target, offload.answer_timeout_seconds)
    environment = detect_environment()
    batches_per_pass = int(dataset.cardinality()) if batches_per_pass is None else batches_per_pass
    static = tf_batch_dimension(dataset.element_spec) is not None if static is None else static
    mode = service.ShardingPolicy.DYNAMIC if offload.sharding == "dynamic" else service.ShardingPolicy.OFF
    if environment.num_workers == 1:
        distributed = dataset.apply(
            service.distribute(processing_mode=mode, service=target, compression=offload.compression)
        )
    else:
        job_name = offload.job_name or f"tfopt-{hashlib.sha256(_cluster_key().encode()).hexdigest()[:16]}"
        if environment.is_chief:
            service.register_dataset(target, dataset.repeat(), compression=offload.compression, dataset_id=job_name)
        distributed = _registered(target, job_name, mode, offload.start_timeout_seconds)
    if offload.sharding == "dynamic" or static:
        distributed = distributed.rebatch(batch_size, drop_remainder=static)
    if batches_per_pass > 0:
        # A known length, which training needs: a pass cut short by a dying worker is filled from the next
        # one, never from more (an endless repeat of a service that yields nothing would spin forever).
        share = -(-batches_per_pass // environment.num_workers)
        distributed = distributed.repeat(2).take(share).apply(tf.data.experimental.assert_cardinality(share))
    return distributed.prefetch(CLIENT_PREFETCH_BATCHES)


def serve_offload(
    dataset: tf.data.Dataset,
    offload: Offload,
    *,
    batch_size: int,
    static: bool | None = None,
    batches_per_pass: int | None = None,
) -> tuple[Any, Any]:
    """`serve` at the offload's dispatcher, or at a `LocalCluster` started here for its workers.

    Returns:
        The pipeline as read back, and the cluster started (None with a dispatcher); `cluster.close()` stops
        it. Where serving fails, the cluster is stopped before the error is raised.
    """
    from tfopt.data.service_servers import LocalCluster

    cluster = (
        LocalCluster(offload.workers, start_timeout_seconds=offload.start_timeout_seconds) if offload.workers else None
    )
    try:
        served = serve(
            dataset,
            offload,
            cluster.target if cluster else offload.dispatcher,
            batch_size=batch_size,
            static=static,
            batches_per_pass=batches_per_pass,
        )
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise
    return served, cluster


def tf_batch_dimension(element_spec: Any) -> int | None:
    """The static batch dimension of a batched element (None where tf.data leaves it open)."""
    import tensorflow as tf

    first = tf.nest.flatten(element_spec)[0]
    return first.shape[0] if first.shape.rank else None


def _registered(target: str, dataset_id: str, mode: Any, timeout_seconds: float) -> Any:
    """The dataset the chief registered as `dataset_id`, read in the job of the same name."""
    from tensorflow.data.experimental import service

    from tfopt.waiting import announce

    setting = "data_service.start_timeout_seconds"
    deadline = announce(f"the chief to register the pipeline {dataset_id!r} at {target}", timeout_seconds, setting)
    while True:
        try:  # without element_spec, from_dataset_id asks the dispatcher, which knows the id once registered
            return service.from_dataset_id(
                processing_mode=mode, service=target, dataset_id=dataset_id, job_name=dataset_id
            )
        except ValueError as error:
            if time.monotonic() > deadline:
                raise DataError(
                    f"data_service: no pipeline was registered as {dataset_id!r} at {target} within "
                    f"{timeout_seconds:g} s ({setting}; {error}); the chief (worker 0) registers it. "
                    "Check that the chief runs and reaches the same dispatcher, or raise the setting."
                ) from None
            time.sleep(0.5)


def _check_answers(target: str, timeout_seconds: float) -> None:
    """Fails within `timeout_seconds` where no gRPC server answers at the dispatcher's address (an open port
    is not an answer: `tfopt.waiting.first_reply`)."""
    from tfopt.waiting import announce, first_reply, is_grpc

    announce(f"the tf.data service dispatcher at {target} to answer", timeout_seconds, _ANSWER_SETTING)
    try:
        reply = first_reply(target, timeout_seconds)
    except TimeoutError:
        raise DataError(
            f"data_service: the dispatcher at {target} accepted the connection but did not answer within "
            f"{timeout_seconds:g} s ({_ANSWER_SETTING}). Check that a tf.data service "
            "dispatcher runs there (tfopt-recipe data-service dispatcher --port PORT), or raise the setting."
        ) from None
    except OSError as error:
        raise DataError(
            f"data_service: no dispatcher answers at {target} ({error.strerror or error}). Start one "
            "(tfopt-recipe data-service dispatcher --port PORT) or correct the address."
        ) from None
    if not is_grpc(reply):
        raise DataError(
            f"data_service: what answers at {target} is not a gRPC server (its first reply is not HTTP/2). "
            "Check the address: it should be a tf.data service dispatcher's port."
        )


_ANSWER_SETTING = "data_service.answer_timeout_seconds"


def _cluster_key() -> str:
    """What every training worker of one run has in common: the Slurm job, or TF_CONFIG's list of workers."""
    import json

    from tfopt.distribute.environment import parse_tf_config
    from tfopt.environment_variables import text

    job, tf_config = text("SLURM_JOB_ID"), text("TF_CONFIG")
    if job:
        return f"slurm-{job}"
    if tf_config:
        return json.dumps(parse_tf_config(tf_config).get("cluster", {}), sort_keys=True)
    raise DataError(
        "data_service: several training workers need a shared job name, and neither TF_CONFIG nor "
        "a Slurm job says which run they belong to: set data_service: {job_name: ...}."
    )
