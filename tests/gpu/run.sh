#!/usr/bin/env bash
# The real-GPU acceptance suite (tests/gpu/acceptance.py): the wall as the host measures it
# for every client, the views inside a slice, the SM share and the launch cost, with the node
# agent at its defaults. Builds nothing; give it a bundle from scripts/gpu-bundle:
#
#   scripts/gpu-bundle                                  # here: target/gpu-bundle
#   tests/gpu/run.sh --bundle target/gpu-bundle         # on the GPU machine, as root
#   tests/gpu/run.sh --sim --python PY                  # the suite itself, on a simulated H100
#
# Needs python3 with the clients (torch, cupy, numba-cuda, cuda-bindings, nvidia-ml-py, jax)
# and an otherwise idle GPU 0. Run with --help for the options.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" tests/gpu/acceptance.py "$@"
