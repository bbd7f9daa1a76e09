"""What "do no harm" costs a default `tfopt.apply`, and what it decides, on models written as keras-io writes them.

A default apply runs the first batch through the user's and the optimized model (the fidelity check) and
measures four setups side by side instead of two (the baseline, the user's model on the rewritten
pipeline, the optimized model on the user's pipeline, and the optimized setup), so that mixed precision
and the pipeline rewrite are each kept only where they measured faster (`tfopt.verdict`). This benchmark
times `tfopt.apply` on each model two ways, in alternating order so that drift on a noisy machine hits
both alike: the default (verified) and the same recipes with their settings named (applied as asked, two
sides), and says what the default kept, with the speedup it gave back. Mixed precision is tried as on a
CPU with bfloat16 instructions whatever this machine has (the decision is faked, the timing is this
machine's), so the check and the extra sides always run.

    python benchmarks/verification.py [--rounds 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.keras_examples

import tfopt
from tests import keras_examples
from tfopt.hardware import detect

MODELS = {
    "transformer (float ids, 20k vocabulary)": keras_examples.transformer_classifier,
    "VAE (own train_step, Sampling)": keras_examples.vae,
    "LSTM forecaster": keras_examples.lstm_forecaster,
    "loss layer on dict inputs": keras_examples.loss_layer_model,
    "conditional GAN (own compile)": keras_examples.conditional_gan,
    "distiller (compute_loss without training)": keras_examples.distiller,
    "imbalanced classifier (AUC metrics)": keras_examples.imbalanced_classifier,
}
AS_ASKED = [{"data_pipeline": {"cache": "memory"}}, {"mixed_precision": {"policy": "mixed_bfloat16"}}, "xla"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    machine = detect()
    bf16 = dataclasses.replace(machine, cpu_flags=machine.cpu_flags | {"avx512_bf16"})
    print(f"Measured on: {machine.describe()}; mixed precision tried as on a CPU with bf16 instructions.")
    print(f"{args.rounds} rounds, {args.steps} timed steps per side; apply's wall seconds, median [min-max].\n")
    print(
        "| model | default (verified) s | as asked s | default / as asked | default's speedup | "
        "pipeline rewrite in the default | mixed precision in the default |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, make in MODELS.items():
        seconds: dict[str, list[float]] = {"default": [], "asked": []}
        decisions: dict[str, str] = {}
        speedup = ""
        for _ in range(args.rounds):
            for kind, recipes in (("default", "default"), ("asked", AS_ASKED)):
                model, data = make()
                start = time.perf_counter()
                result = tfopt.apply(model, data, recipes=recipes, hardware=bf16, steps=args.steps, warmup_steps=2)
                seconds[kind].append(time.perf_counter() - start)
                if kind == "default":
                    for recipe in ("data_pipeline", "mixed_precision"):
                        step = next(step for step in result.plan.applied if step.recipe == recipe)
                        measured = step.detail.split("measured ")[-1].split(" against")[0]
                        decisions[recipe] = ("left out" if step.skipped else "kept") + ": " + measured[:70]
                    speedup = result.summary().split(" examples/s (")[1].split(");")[0]
        ratios = [a / b for a, b in zip(seconds["default"], seconds["asked"])]
        print(
            f"| {name} | {_spread(seconds['default'])} | {_spread(seconds['asked'])} | {_spread(ratios, 2)}x | "
            f"{speedup} | {decisions['data_pipeline']} | {decisions['mixed_precision']} |"
        )


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


if __name__ == "__main__":
    main()
