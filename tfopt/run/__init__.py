"""What `tfopt-recipe run` does, for one recipe file: `process` applies the file's process-wide settings
before TensorFlow starts, `model` builds the file's model and data, `directory` owns the run directory,
`training` trains after the measurements, and `runner` puts them in order and writes the report.
"""
