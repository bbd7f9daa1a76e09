#!/usr/bin/env bash
# The GPU measurements issue 35 waits for, most important first, each under a time limit of its own so that a
# short lease still brings the first ones back. Run from the project root on a GPU machine once TensorFlow is
# there (shared/gpu/README.md: `. /tmp/env.sh` first). Tables go to $OUT/<name>.txt, logs to $OUT/<name>.log.
#
#   OUT=/tmp/results bash benchmarks/on_gpu.sh [name ...]   # every measurement, or the ones named
#
# All four take up to 21 minutes: where one command may run 10, name one or two per call (the first alone, then
# gpu_threads alone, then the last two). gpu_threads writes each child's speed to its .log as it goes, so a
# run cut short still says what it measured.
set -u
out=${OUT:-gpu-results}
mkdir -p "$out"
export TF_CPP_MIN_LOG_LEVEL=3
chosen=("$@")

measure() {
  local name=$1 seconds=$2
  shift 2
  if [ "${#chosen[@]}" -gt 0 ] && [[ " ${chosen[*]} " != *" $name "* ]]; then
    return
  fi
  echo "== $name (at most ${seconds}s): $*"
  timeout "$seconds" python3 "$@" >"$out/$name.txt" 2>"$out/$name.log"
  echo "exit $?"
  cat "$out/$name.txt"
}

# The target: ResNet-50 at 224px, batch 128, tfopt.apply against the hand-tuned bf16 + XLA setup.
measure hand_tuned_resnet50 420 benchmarks/hand_tuned.py --model ResNet-50 --image-size 224 --batch 128 --steps 60
# TF_GPU_THREAD_MODE=gpu_private against TensorFlow's default, in alternating child processes.
measure gpu_threads 480 benchmarks/gpu_threads.py --image-size 224 --batch 128 --steps 60 --rounds 3
# Steps per call where a step is short.
measure steps_per_execution 150 benchmarks/steps_per_execution.py
# The second convolutional model of the hand-tuned table.
measure hand_tuned_cnn 240 benchmarks/hand_tuned.py --model "keras-io CNN from scratch" --image-size 224 --batch 128 --steps 60
