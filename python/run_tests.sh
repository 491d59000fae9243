#!/usr/bin/env bash
# The Python suite: a virtualenv at <repo>/.venv (made once), the test dependencies, `ruff check` and
# `ruff format --check` on python/ (a failure stops the suite), `pip install ./python` (which builds the extension with
# Bazel through setup.py), then pytest on python/tests. Quiet when everything is already set up; exits with pytest's
# status. Extra arguments go to pytest (e.g. -k reader, -x).
#
# Environment: DISTCKPT_PYTHON (interpreter for the venv; default python3), DISTCKPT_BAZEL_OUTPUT_BASE (a Bazel
# --output_base for the build, see python/setup.py), DISTCKPT_NO_FRAMEWORKS=1 (do not install torch, lightning, JAX
# and orbax-checkpoint; their tests then skip, each with its reason).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
py=$venv/bin/python

if [[ ! -x $py ]]; then
  "${DISTCKPT_PYTHON:-python3}" -m venv "$venv"
fi
pip_q=(-m pip install -q --disable-pip-version-check)
# fsspec, s3fs, boto3 and moto[server]: storage tests (memory://, and S3 on a moto server the tests start on loopback).
# huggingface_hub: the hub cache tests lay out its cache with its own functions and check it with its scan_cache_dir.
if ! "$py" -c "import numpy, pytest, ml_dtypes, safetensors, setuptools, wheel, fsspec, s3fs, boto3, moto.server, \
huggingface_hub" 2>/dev/null; then
  "$py" "${pip_q[@]}" numpy pytest ml_dtypes safetensors setuptools wheel fsspec s3fs boto3 "moto[server]" \
    huggingface_hub
fi
# The frameworks distckpt plugs into (DCP, Lightning, Orbax): the real packages, from PyPI (torch's CUDA build; the
# tests run it on CPU). A failed install is reported and their tests skip with the reason; it does not stop the suite.
if [[ -z ${DISTCKPT_NO_FRAMEWORKS:-} ]] && ! "$py" -c "import torch, lightning, jax, orbax.checkpoint" 2>/dev/null; then
  if ! out=$("$py" "${pip_q[@]}" torch lightning "jax[cpu]" orbax-checkpoint 2>&1); then
    echo "$out" | tail -20 >&2
    echo "python/run_tests.sh: installing torch, lightning, jax, orbax-checkpoint failed: their tests will skip" >&2
  fi
fi
# ruff, pinned (its formatter's style changes between releases): lint and format checks of python/ with the settings
# in python/pyproject.toml ([tool.ruff]), in check mode, before anything is built. `ruff format python` fixes the
# formatting; `ruff check --fix python` what it can of the rest.
ruff_version=0.17.6
if [[ $("$py" -m ruff --version 2>/dev/null) != "ruff $ruff_version" ]]; then
  "$py" "${pip_q[@]}" "ruff==$ruff_version"
fi
"$py" -m ruff check --quiet python
"$py" -m ruff format --check --quiet python
# No build isolation: setuptools and wheel are in the venv, so reinstalling needs no network and Bazel's cache
# keeps the rebuild incremental. pip's own output is dropped unless it fails.
if ! out=$("$py" "${pip_q[@]}" --no-build-isolation --force-reinstall --no-deps ./python 2>&1); then
  echo "$out" >&2
  echo "python/run_tests.sh: pip install ./python failed" >&2
  exit 1
fi
exec "$py" -m pytest python/tests -q -p no:cacheprovider "$@"
