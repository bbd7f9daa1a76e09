#!/usr/bin/env bash
# Installs Horovod 0.28.1 (the last release, sdist only) for the TensorFlow installed in $PYTHON's env.
#
# Why a script: 0.28.1 does not build out of the box any more.
#   * It must be built with --no-build-isolation: its setup.py compiles against the *installed*
#     TensorFlow headers and ABI; an isolated build env would not see (or would fetch another) TF.
#   * On TF >= 2.19 horovod/tensorflow/xla_mpi_ops.cc fails to compile: it includes XLA headers that
#     moved. That file is GPU-only code (an XLA custom call for CUDA/ROCm), so guarding it with
#     `&& HAVE_GPU` is a no-op for CPU builds and lets the rest compile.
# Default build: TensorFlow only, Gloo controller, no MPI, no PyTorch/MXNet (CPU here). Override the
# HOROVOD_* variables in the environment for GPU/NCCL builds (e.g. HOROVOD_GPU_OPERATIONS=NCCL).
#
# Usage: PYTHON=/path/to/venv/bin/python scripts/install_horovod.sh
set -euo pipefail

PYTHON="${PYTHON:-python3}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
WORK_DIR="$(mktemp -d)"
trap 'rm -rf "$WORK_DIR"' EXIT

TF_VERSION="$("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)" || {
  echo "install_horovod: TensorFlow is not importable with $PYTHON; install tensorflow first." >&2
  exit 1
}
echo "install_horovod: Horovod $HOROVOD_VERSION for TensorFlow $TF_VERSION ($PYTHON)"
for tool in cmake g++ make; do
  command -v "$tool" >/dev/null || { echo "install_horovod: $tool is missing (apt-get install cmake g++ make)." >&2; exit 1; }
done

"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$WORK_DIR"
tar -xzf "$WORK_DIR/horovod-$HOROVOD_VERSION.tar.gz" -C "$WORK_DIR"
SOURCE="$WORK_DIR/horovod-$HOROVOD_VERSION"

NEEDS_GUARD="$("$PYTHON" -c "import sys; major, minor = map(int, '$TF_VERSION'.split('.')[:2]); print(int((major, minor) >= (2, 19)))")"
if [[ "$NEEDS_GUARD" == 1 ]]; then
  XLA_OPS="$SOURCE/horovod/tensorflow/xla_mpi_ops.cc"
  sed -i 's/^#if TENSORFLOW_VERSION >= 2006000000$/#if TENSORFLOW_VERSION >= 2006000000 \&\& HAVE_GPU/' "$XLA_OPS"
  grep -q '^#if TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU$' "$XLA_OPS" || {
    echo "install_horovod: could not apply the HAVE_GPU guard to $XLA_OPS (source changed?)." >&2
    exit 1
  }
  echo "install_horovod: TF $TF_VERSION >= 2.19: guarded the GPU-only XLA ops in xla_mpi_ops.cc"
fi

export HOROVOD_WITH_TENSORFLOW="${HOROVOD_WITH_TENSORFLOW:-1}"
export HOROVOD_WITHOUT_PYTORCH="${HOROVOD_WITHOUT_PYTORCH:-1}"
export HOROVOD_WITHOUT_MXNET="${HOROVOD_WITHOUT_MXNET:-1}"
export HOROVOD_WITH_GLOO="${HOROVOD_WITH_GLOO:-1}"
export HOROVOD_WITHOUT_MPI="${HOROVOD_WITHOUT_MPI:-1}"
export MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
"$PYTHON" -m pip install --no-build-isolation --no-cache-dir "$SOURCE"

# Prove it works: the TF extension loads and Gloo is built in.
"$PYTHON" - <<'PY'
import horovod
import horovod.tensorflow as hvd
if not hvd.gloo_built():
    raise SystemExit("install_horovod: Horovod installed but without Gloo; check the build log above.")
print(f"install_horovod: OK, horovod {horovod.__version__} with Gloo (mpi={hvd.mpi_built()})")
PY
