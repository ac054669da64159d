#!/usr/bin/env bash
# Download, here (with network), the wheels that benchmarks/gpu_check.sh installs on the GPU machine,
# which has no network and lacks these packages: Python 3.12, manylinux x86-64, into .whl/ (in
# .gitignore; the device tool takes it along when asked: carry [".whl"]).
#
#   bash benchmarks/gpu_wheels.sh            # then check: ls .whl
#
# Versions are those the project is tested with (pyproject: pydantic>=2.6, omegaconf>=2.3,
# filelock). omegaconf 2.4 vendors its ANTLR runtime, so antlr4-python3-runtime is not needed (and
# the 4.9 that omegaconf 2.3 pins exists only as an sdist). typing-extensions travels too: pydantic
# 2.14 needs >= 4.16 and the GPU image's version is not known; a newer one is backward compatible.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHEELS=(
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0
  omegaconf==2.4.0
  filelock==4.3.1
)
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
# one wheel per package, or the --no-deps install there stops
n=$(ls .whl/*.whl | wc -l)
[ "$n" -eq "${#WHEELS[@]}" ] || { echo "Error: expected ${#WHEELS[@]} wheels in .whl, got $n" >&2; exit 1; }
ls -l .whl
du -sh .whl
