"""TensorFlow's GPU threads (TF_GPU_THREAD_MODE) against its default, measured in alternating child processes.

TensorFlow reads the mode once, when it creates the GPU devices, so one process cannot try both: each round
starts one child per mode, in an order that alternates from round to round so that a change of load hits
both alike. Every child trains the hand-tuned setup of `hand_tuned.py` (mixed bfloat16, XLA, a parallel map
and a prefetch, from the same seed) and prints its examples/s over its timed steps; the table gives medians
[min-max] over rounds and the ratio to TensorFlow's `global` round by round. `gpu_private` is what
`runtime: {gpu_thread_mode: gpu_private}` (or `tfopt.runtime.configure_gpu_threads`) sets.

    python benchmarks/gpu_threads.py                                                    # a CPU: the harness
    python benchmarks/gpu_threads.py --image-size 224 --batch 128 --steps 60 --rounds 5  # one GPU

On a machine without a GPU the variable changes nothing, and the table says so beside its ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this one

import hand_tuned

from tfopt.hardware import detect

MODES = ("global", "gpu_private")
"""TensorFlow's default first: every ratio is to it."""

_RESULT = "RESULT "


def header() -> str:
    return f"Measured on: {detect().describe()}"


def child(model: str, image_size: int, batch: int, steps: int) -> None:
    """Trains the hand-tuned setup in this process (its TF_GPU_THREAD_MODE as started) and prints its speed."""
    import keras

    from tfopt.profiling.timing import time_training_steps

    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("mixed_bfloat16")
    built = hand_tuned.compiled(hand_tuned.MODELS[model](image_size), jit_compile=True)
    times = time_training_steps(
        built, hand_tuned.images(image_size, batch, tuned=True), steps=steps, warmup_steps=3, batch_size=batch
    )
    print(_RESULT + json.dumps({"examples_per_second": times.examples_per_second}), flush=True)


def measure(mode: str, args: argparse.Namespace) -> float:
    """One child's examples/s, started with `mode`."""
    command = [sys.executable, __file__, "--child", "--model", args.model]
    command += ["--image-size", str(args.image_size), "--batch", str(args.batch), "--steps", str(args.steps)]
    # TensorFlow's own thread count in both (one the shell exported would be the user's setting, not the mode's).
    environment = {name: value for name, value in os.environ.items() if name != "TF_GPU_THREAD_COUNT"}
    environment["TF_GPU_THREAD_MODE"] = mode
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=3600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(_RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the {mode} child failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(_RESULT) :])["examples_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(hand_tuned.MODELS), default="ResNet-50")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model, args.image_size, args.batch, args.steps)
        return
    hardware = detect()
    print(header())
    print(
        f"{args.model}, hand-tuned (bf16, XLA, parallel map, prefetch), {args.image_size}x{args.image_size} images, "
        f"batch {args.batch}, {args.steps} timed steps per child, {args.rounds} rounds of one child per mode.\n"
    )
    speeds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_index in range(args.rounds):
        order = MODES if round_index % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            speeds[mode].append(measure(mode, args))
            print(f"round {round_index + 1}: {mode} {speeds[mode][-1]:.1f} examples/s", file=sys.stderr, flush=True)
    effect = "" if hardware.accelerator == "gpu" else " (no GPU here: the variable changes nothing, so ~1.00x)"
    print("| TF_GPU_THREAD_MODE | examples/s | vs global |")
    print("|---|---:|---:|")
    for mode in MODES:
        ratios = [speed / base for speed, base in zip(speeds[mode], speeds["global"], strict=True)]
        note = effect if mode != "global" else ""
        print(f"| {mode} | {hand_tuned.spread(speeds[mode], 1)} | {hand_tuned.spread(ratios)}x{note} |")


if __name__ == "__main__":
    main()
