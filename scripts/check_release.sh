#!/usr/bin/env bash
# Release check: build the sdist and wheel as a release would, check them, install the wheel into a fresh
# virtual environment (dependencies from the package index, as a user gets them) and run it from there.
#
#   bash scripts/check_release.sh                  # builds with .venv/bin/python when it exists
#   PYTHON=python3.11 bash scripts/check_release.sh
#   KEEP_DIST=out/ bash scripts/check_release.sh   # also keep the checked sdist and wheel in out/
#
# The interpreter needs `build` and `twine` (both in the dev extra). Everything happens in one temporary
# directory, removed on exit: the build runs on a copy of the tree (tracked files and untracked ones git
# does not ignore), because setuptools writes tfopt.egg-info/ and build/ next to the sources it builds.
# The fresh venv gets tfopt's dependencies from the package index (1.5-3 minutes, 2.7 GB on disk).
# After the build nothing runs from the checkout: the installed package is imported from a directory
# without tfopt/ in it, so `import tfopt` cannot pick up the sources instead of the wheel.
set -euo pipefail
if [[ ${PYTHON:-} == */* && $PYTHON != /* ]]; then PYTHON="$(pwd)/$PYTHON"; fi  # relative to the caller
cd "$(dirname "$0")/.."
repository=$(pwd)

if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON="$repository/.venv/bin/python"; else PYTHON=python3; fi
fi
for module in build twine; do
  if ! "$PYTHON" -c "import $module" 2>/dev/null; then
    echo "check_release: $PYTHON has no '$module'. Install the dev extra (pip install -e '.[dev]') or set PYTHON." >&2
    exit 1
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/tfopt-release.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$SECONDS
say() { echo "check_release [$((SECONDS - started))s]: $*"; }
# Runs a command with its output in a log that is shown only when it fails (pip's and build's chatter,
# TensorFlow's C++ start-up lines in the plain Python checks), and prints the log's lines that match the
# extended regex $1.
quietly() {
  local show=$1 log
  shift
  log=$(mktemp "$work/log.XXXXXX")
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "check_release: this failed (its output is above): $*" >&2
    exit 1
  fi
  grep -E "$show" "$log" | sed 's/^/  /' || true
}

say "copying the tree to $work/src"
mkdir "$work/src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' path; do [ -f "$path" ] && printf '%s\0' "$path"; done \
    | tar --null -T - -cf - | tar -xf - -C "$work/src"
else  # an unpacked archive: leave out what .gitignore names
  tar --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist --exclude=./runs --exclude=./data \
    --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache -cf - . | tar -xf - -C "$work/src"
fi

say "python -m build (the sdist, then the wheel from the sdist)"
quietly '^Successfully built' "$PYTHON" -m build --outdir "$work/dist" "$work/src"
sdist=$(echo "$work"/dist/*.tar.gz)
wheel=$(echo "$work"/dist/*.whl)

say "twine check --strict (the README as PyPI renders it, and the metadata)"
quietly 'PASSED|WARNING' "$PYTHON" -m twine check --strict "$sdist" "$wheel"

say "what the sdist and the wheel contain"
cat >"$work/contents.py" <<'PY'
"""The wheel holds exactly the files of tfopt/ (code and any data it reads) and its metadata; the sdist
holds the whole source: package, tests, recipes, docs, notebooks, benchmarks, scripts."""

import pathlib
import sys
import tarfile
import zipfile

source, sdist, wheel = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
namespace = {}
exec((source / "tfopt" / "_version.py").read_text(), namespace)
version = namespace["__version__"]
package = {str(path.relative_to(source)) for path in (source / "tfopt").rglob("*") if path.is_file()}
problems = []

archive = zipfile.ZipFile(wheel)
names = set(archive.namelist())
info = f"tfopt-{version}.dist-info/"
in_wheel = {name for name in names if not name.startswith(info)}
if in_wheel != package:
    problems.append(
        f"wheel: files of tfopt/ missing {sorted(package - in_wheel)} (list them in package_data in setup.cfg); "
        f"files that are not tfopt's {sorted(in_wheel - package)}"
    )
for required in ("METADATA", "entry_points.txt", "RECORD"):
    if info + required not in names:
        problems.append(f"wheel: no {info}{required} (is the version {version}?)")
if info + "entry_points.txt" in names and "tfopt-recipe = tfopt.cli:main" not in archive.read(
    info + "entry_points.txt"
).decode():
    problems.append("wheel: the tfopt-recipe console script is missing from entry_points.txt")

root = f"tfopt-{version}/"
in_sdist = {name[len(root) :] for name in tarfile.open(sdist).getnames() if name.startswith(root)}
wanted = {
    str(path.relative_to(source))
    for top in ("tfopt", "tests", "recipes", "docs", "notebooks", "benchmarks", "scripts")
    for path in (source / top).rglob("*")
    if path.is_file()
} | {"README.md", "MANIFEST.in", "pyproject.toml", "setup.cfg", "PKG-INFO"}
if wanted - in_sdist:
    problems.append(f"sdist: missing {sorted(wanted - in_sdist)} (MANIFEST.in decides what goes in)")
compiled = sorted(name for name in in_sdist if "__pycache__" in name or name.endswith(".pyc"))
if compiled:
    problems.append(f"sdist: compiled files {compiled[:5]}")

if problems:
    sys.exit("\n  ".join(["check_release: the distributions are not what a release needs:", *problems]))
data = sorted(name for name in in_wheel if not name.endswith(".py"))
print(
    f"  wheel: {len(names)} files ({len(in_wheel)} in tfopt/, data files: {data or 'none'}), "
    f"{pathlib.Path(wheel).stat().st_size // 1024} KiB"
)
print(f"  sdist: {len(in_sdist)} entries, {pathlib.Path(sdist).stat().st_size // 1024} KiB")
PY
"$PYTHON" "$work/contents.py" "$work/src" "$sdist" "$wheel"

say "a fresh virtual environment with the wheel and its profile extra, installed as the notebooks do"
"$PYTHON" -m venv "$work/venv"
quietly '^ERROR' "$work/venv/bin/python" -m pip install -q --disable-pip-version-check \
  "tfopt[profile] @ file://$wheel"

say "the installed package, run from outside the checkout"
cd "$work"
unset PYTHONPATH
export TFOPT_DATA_DIR="$work/data"
cat >"$work/smoke.py" <<'PY'
import importlib.metadata
import pathlib
import sys

import tfopt
import tfopt.hardware
from tfopt.data import ImageFolderSource, default_dataset_dir

venv = pathlib.Path(sys.argv[1]).resolve()
location = pathlib.Path(tfopt.__file__).resolve()
if not location.is_relative_to(venv):
    sys.exit(f"check_release: tfopt was imported from {location}, not from the fresh venv {venv}")
if importlib.metadata.version("tfopt") != tfopt.__version__:
    sys.exit(f"check_release: metadata says {importlib.metadata.version('tfopt')}, tfopt says {tfopt.__version__}")
print(f"tfopt {tfopt.__version__} from {location.parent}")
print(f"hardware: {tfopt.hardware.detect().describe()}")
# The embedded dataset the shipped recipes train on is generated by the package (PIL), not shipped as files.
folder = default_dataset_dir()
images = sorted(folder.rglob("*.jpg"))
batch, labels = next(iter(ImageFolderSource(folder, image_size=(64, 64)).pipeline(batch_size=32, optimized=True)))
if len(images) != 600 or tuple(batch.shape) != (32, 64, 64, 3) or tuple(labels.shape) != (32,):
    sys.exit(f"check_release: the embedded dataset has {len(images)} images and a batch of {batch.shape}")
print(f"embedded dataset: {len(images)} JPEGs in {folder}; one batch {tuple(batch.shape)}")
PY
quietly '^(tfopt |hardware|embedded)' "$work/venv/bin/python" "$work/smoke.py" "$work/venv"
quietly '^usage: tfopt-recipe' "$work/venv/bin/tfopt-recipe" --help
quietly '^tfopt-recipe ' "$work/venv/bin/tfopt-recipe" --version
say "the shipped recipes with the installed tfopt-recipe: validate resnet.yaml, run small_cnn.yaml"
quietly ': valid\.' "$work/venv/bin/tfopt-recipe" validate "$repository/recipes/resnet.yaml"
# The whole run path from the wheel: data, model, build, measurement, training and the reports.
quietly '^small_cnn:' "$work/venv/bin/tfopt-recipe" run "$repository/recipes/small_cnn.yaml" --quiet --steps 2 \
  --set train.epochs=0 --out "$work/run"
for report in report.html report.md report.json; do
  [ -s "$work/run/$report" ] || { echo "check_release: the run wrote no $report" >&2; exit 1; }
done

if [ -n "${KEEP_DIST:-}" ]; then
  cd "$repository"
  mkdir -p "$KEEP_DIST"
  cp "$sdist" "$wheel" "$KEEP_DIST"/
  say "kept $(basename "$sdist") and $(basename "$wheel") in $KEEP_DIST"
fi
say "the release builds, installs into a fresh venv and runs: $(basename "$wheel")"
