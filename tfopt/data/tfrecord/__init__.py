"""TFRecord conversion without TensorFlow in the writers: `convert` (`to_tfrecord`) plans shards and
resumes killed conversions, `inputs` turns each kind of input into records, `workers` writes shards in
worker processes, `codec` frames records and Examples, `manifest` describes a finished conversion,
`verify` re-checks every byte, and `source` reads a conversion back as a `tfopt.data` source.

Nothing is imported here, so a worker process that imports `workers` stays free of TensorFlow.
"""
