#!/usr/bin/env bash
# make bench-gpu-served on a bare, offline GPU host (a Python with torch; no Java, no Triton,
# no network), in one command: install what `make gpu-stage` staged (build/stage/load-N, each
# sent in its own call; buildsteps/stage.py), then both engines served on the GPU and measured
# -> results/gpu-served.md (build/gpu-served.md on a CPU; bench/gpuserved.py). HOST_PYTHON: the
# host's Python with torch (python3); the arguments go to python -m bench.gpuserved.
set -euo pipefail
started=$(date +%s.%N)
cd "$(dirname "$0")/.."
"${HOST_PYTHON:-python3}" -m buildsteps.stage install
exec .venv/bin/python -m bench.gpuserved --started "$started" "$@"
