"""The package version, kept apart so `tfopt-recipe --version` reads it without importing TensorFlow."""

__version__ = "0.1.0"
