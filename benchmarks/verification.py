"""What "do no harm" costs a default `tfopt.apply`, and what it decides, on models written as keras-io writes them.

A default apply runs the first batch through the user's and the optimized model (the fidelity check) and
measures three setups side by side instead of two (the baseline, the optimized pipeline without mixed
precision, and with it), so that mixed precision is kept only where it measured faster. This benchmark
times `tfopt.apply` on each model two ways, in alternating order so that drift on a noisy machine hits
both alike: the default (`policy: auto`, verified) and the same recipes with the policy named (applied as
asked, two sides). Mixed precision is tried as on a CPU with bfloat16 instructions whatever this machine
has (the decision is faked, the timing is this machine's), so the check and the third side always run.

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
}
AS_ASKED = ["data_pipeline", {"mixed_precision": {"policy": "mixed_bfloat16"}}, "xla"]


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
        "| model | default (verified) s | bf16 as asked s | default / as asked | default's speedup | "
        "mixed precision in the default |"
    )
    print("|---|---|---|---|---|---|")
    for name, make in MODELS.items():
        seconds: dict[str, list[float]] = {"default": [], "asked": []}
        decision = speedup = ""
        for _ in range(args.rounds):
            for kind, recipes in (("default", "default"), ("asked", AS_ASKED)):
                model, data = make()
                start = time.perf_counter()
                result = tfopt.apply(model, data, recipes=recipes, hardware=bf16, steps=args.steps, warmup_steps=2)
                seconds[kind].append(time.perf_counter() - start)
                if kind == "default":
                    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
                    decision = ("left out" if step.skipped else "kept") + ": " + step.detail.split("measured ")[-1]
                    speedup = result.summary().split(" examples/s (")[1].split(");")[0]
        ratios = [a / b for a, b in zip(seconds["default"], seconds["asked"])]
        print(
            f"| {name} | {_spread(seconds['default'])} | {_spread(seconds['asked'])} | {_spread(ratios, 2)}x | "
            f"{speedup} | {decision.split(' against')[0]} |"
        )


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


if __name__ == "__main__":
    main()
