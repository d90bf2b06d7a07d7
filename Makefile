# Two commands do everything on a fresh machine:
#   make serve   set up, build weights and archives, run TorchServe in the foreground
#   make test    set up, build weights and archives, run the whole test suite
# Every step is skipped when its output is up to date.
#
# Variables: WEIGHTS=auto|imagenet|seeded|/path/to/resnet50.pt (see README; unset keeps the
#            weights already built, else auto),
#            LABELS=labels.json|labels.txt: your checkpoint's class names (WEIGHTS=ckpt.pt with
#            any N >= 2 classes; buildsteps/checkpoint.py says the formats; docs/backends.md),
#            ADD_HEAD="NAME CHECKPOINT LABELS": another tagger head served from the same forward
#            (a checkpoint on the same backbone: tsctl head train's; docs/own-tags.md),
#            BACKEND=openvino (default, fastest on CPU: bf16 where the CPU has it)|onnx|torchscript|
#            eager (PyTorch; the GPU choice)
#            QUANTIZE=int8 (default)|none: int8 also quantises the OpenVINO IR with NNCF
#            (BACKEND=openvino; other backends have no int8), and the archives carry it beside
#            the float IR when it passes the fidelity gate in config/int8_gate.yaml
#            (buildsteps/quantize.py; a refusal is reported and leaves it out).
#            GATE_PHOTOS=dir: judge int8 on your own photos (every image under dir).
#            Not handler.precision in config/models/*.yaml: that is the runtime arithmetic.
#            MODEL_API=1 (make serve): registering and unregistering models on (off by default).
#            DEVICE=cpu (default)|gpu, GPUS=1: gpu builds the GPU deployment beside the CPU one
#            (make gpu: build/gpu/, eager archives with each model's `gpu:` section) and
#            make serve / make triton-repo use it (docs/operations.md, "GPUs").

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
WEIGHTS ?=
LABELS ?=
ADD_HEAD ?=
# The defaults of BACKEND and QUANTIZE are model_files/artifacts.py's (archive.sh asks it too).
BUILD_DEFAULTS := $(shell $(PYTHON) -m model_files.artifacts defaults)
BACKEND ?= $(word 1,$(BUILD_DEFAULTS))
QUANTIZE ?= $(word 2,$(BUILD_DEFAULTS))
GATE_PHOTOS ?=
DEVICE ?= cpu
GPUS ?= 1
ifeq ($(filter cpu gpu,$(DEVICE)),)
$(error DEVICE must be cpu or gpu, got '$(DEVICE)')
endif
GPU := $(filter gpu,$(DEVICE))
GPU_DIR := build/gpu
TS_CONFIG := $(if $(GPU),$(GPU_DIR)/config.properties,config/config.properties)
INT8 := $(and $(filter int8,$(QUANTIZE)),$(filter openvino,$(BACKEND)))
ifdef PRECISION
$(error PRECISION is now QUANTIZE=none|int8 (the runtime arithmetic is handler.precision in config/models/*.yaml))
endif
WEIGHTS_DIR := build/weights
MODEL_CONFIGS := $(wildcard config/models/*.yaml)
SOURCES := $(wildcard handlers/*.py servecore/*.py servecore/*/*.py model_files/*.py serveshared/*.py) \
           $(MODEL_CONFIGS) archive.sh \
           buildsteps/configgen.py

.PHONY: setup java config weights archives gpu samples serve lint test test-fast triton-server triton-repo serve-triton bench bench-sweep bench-ingestion bench-collection bench-traffic bench-ceiling bench-ceiling-tracing bench-gpu soak clean
.DEFAULT_GOAL := test

setup: $(VENV)/.installed java kubectl chromium prometheus

java:
	@devtools/ensure_java.sh

# promtool checks and unit-tests config/monitoring's rules; prometheus runs them (make monitor,
# tests/test_monitoring.py).
.PHONY: prometheus
prometheus:
	@devtools/ensure_prometheus.sh

# Headless Chromium for tests/test_pages.py and make docs-screenshots (apt where it can; else a
# warning, and those browser tests are skipped).
.PHONY: chromium
chromium:
	@devtools/ensure_chromium.sh

# kubectl kustomize renders kserve/ for the KServe lint and tests.
.PHONY: kubectl
kubectl:
	@devtools/ensure_kubectl.sh

# --no-compile: byte-compiling the 21,000 files of torch and the rest is about a minute of a
# 2-core set-up; Python compiles what a process imports, once, on first import.
$(VENV)/.installed: requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] >= (3, 10), "Python 3.10+ needed (3.11 recommended), found " + sys.version' \
		|| { echo "error: set PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV) || { echo "error: could not create $(VENV); on Debian/Ubuntu: apt-get install -y python3-venv" >&2; exit 1; }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $@

# config.properties (local and KServe) generated from config/models/*.yaml and the server
# settings (buildsteps/configgen.py); only stale files are rewritten.
config: $(VENV)/.installed
	@$(PY) -m buildsteps.configgen

# The reference tables in docs/ (settings, error statuses, metrics), rewritten from their one
# source in the code (buildsteps/reference.py); tests/test_reference.py fails when they are stale.
.PHONY: docs-reference
docs-reference: $(VENV)/.installed
	@$(PY) -m buildsteps.reference

# build_weights.py is itself idempotent: it returns at once when WEIGHTS is what it built.
weights: $(VENV)/.installed $(if $(INT8),samples)
	@$(PY) -m buildsteps.weights $(if $(WEIGHTS),--source "$(WEIGHTS)") \
		$(if $(LABELS),--labels "$(LABELS)") $(if $(ADD_HEAD),--add-head $(ADD_HEAD)) \
		--out $(WEIGHTS_DIR)
	@$(PY) -m buildsteps.export --backend "$(BACKEND)" --weights $(WEIGHTS_DIR)
	$(if $(INT8),@$(PY) -m buildsteps.quantize --weights $(WEIGHTS_DIR) --allow-refusal \
		$(if $(GATE_PHOTOS),--gate-photos "$(GATE_PHOTOS)"))

# Archives are rebuilt when the handler, model code, configs, weights (the int8 verdict too),
# BACKEND or QUANTIZE change.
archives: weights
	@echo "$(BACKEND) $(QUANTIZE)" > build/.backend.new
	@cmp -s build/.backend.new build/.backend || mv build/.backend.new build/.backend
	@$(MAKE) --no-print-directory build/.archived

build/.archived: $(SOURCES) $(WEIGHTS_DIR)/weights_info.json build/.backend \
		$(wildcard $(WEIGHTS_DIR)/*.sha256 $(WEIGHTS_DIR)/*_int8.*.json)
	BACKEND=$(BACKEND) QUANTIZE=$(QUANTIZE) ./archive.sh
	@touch $@

# Every precision the archives can run, on your own photos (class-named subfolders give
# accuracy): make eval PHOTOS=dir (buildsteps/evaluate.py; docs/backends.md).
PHOTOS ?=
.PHONY: eval
eval: setup weights
	@test -n "$(PHOTOS)" || { echo "usage: make eval PHOTOS=folder" >&2; exit 2; }
	$(PY) -m buildsteps.evaluate "$(PHOTOS)"

# The GPU deployment (buildsteps/gpu.py): build/gpu/config.properties (number_of_gpu=$(GPUS),
# workersPerGpu x GPUS workers per model) and its eager archives in build/gpu/model-store.
gpu: config weights
	@$(PY) -m buildsteps.gpu --gpus "$(GPUS)"

samples: $(VENV)/.installed
	@$(PY) -m devtools.samples --out build/samples --heldout build/heldout >/dev/null

# umask 077: key_file.json and the logs are private from their creation. A private temp folder
# (TMPDIR for Python, TEMP for the JVM's java.io.tmpdir): archives unpack and worker sockets
# live there, not in a shared /tmp; removed when the server stops. MODEL_API=1 turns on
# registering and unregistering models (off in config/server.properties, which says why).
MODEL_API ?=
serve: setup config archives samples $(GPU)
	@umask 077 && tmp=$$(mktemp -d -t torchserve.XXXXXX) && trap 'rm -rf "$$tmp"' EXIT INT TERM && \
	echo "TorchServe temp folder: $$tmp$(if $(filter 1,$(MODEL_API)), (model API on))" && \
	TMPDIR="$$tmp" TEMP="$$tmp" $(VENV)/bin/torchserve --start --foreground --ncs \
		--ts-config $(TS_CONFIG) $(if $(filter 1,$(MODEL_API)),--enable-model-api)

# Prometheus with config/monitoring's rules scraping make serve's metrics port (run make serve
# in another terminal; MONITOR_ENGINE=triton: make serve-triton's), its UI on
# http://127.0.0.1:$(MONITOR_PORT); Ctrl-C stops it (devtools/prometheus.py;
# docs/operations.md, Monitoring).
MONITOR_PORT ?= 9090
MONITOR_ENGINE ?= torchserve
.PHONY: monitor
monitor: $(VENV)/.installed prometheus
	$(PY) -m devtools.prometheus --port $(MONITOR_PORT) --engine $(MONITOR_ENGINE)

# Triton (docs/triton.md, tritonrepo/): the server from the pinned nvidia-pytriton wheel in its
# own venv (numpy<2; the project's venv keeps numpy 2) laid out in build/triton-server; a model
# repository in build/triton generated from config/models/*.yaml and the archives; the server on
# 127.0.0.1 (ports in serveshared/ports.py), Ctrl-C stops it. Without the wheel, make test goes on
# and tests/test_triton.py is skipped, saying why.
TRITON_VENV := build/triton-venv

NO_TRITON := "warning: no Triton (nvidia-pytriton did not install): tests/test_triton.py will be skipped"
triton-server: $(VENV)/.installed
	@$(MAKE) --no-print-directory $(TRITON_VENV)/.installed || echo $(NO_TRITON) >&2

# The wheel's venv needs nothing of the project's, so make test installs it beside the
# project's (pip works on one core; the other was idle).
.PHONY: triton-venv
triton-venv:
	@$(MAKE) --no-print-directory $(TRITON_VENV)/.pip || echo $(NO_TRITON) >&2

$(TRITON_VENV)/.pip: requirements-triton.txt
	rm -rf $(TRITON_VENV)
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install --quiet --no-compile -r requirements-triton.txt
	@touch $@

$(TRITON_VENV)/.installed: $(TRITON_VENV)/.pip tritonrepo/install.py
	$(PY) -m tritonrepo.install
	@touch $@

# DEVICE=gpu: KIND_GPU instance groups (workersPerGpu on each of GPUS) from the GPU archives.
triton-repo: config archives $(GPU)
	$(PY) -m tritonrepo.generate $(if $(GPU),--gpus "$(GPUS)" --model-store $(GPU_DIR)/model-store)

serve-triton: setup triton-server triton-repo
	$(PY) -m tritonrepo.server

# The linters, configured in pyproject.toml (seconds): ruff's rules, mypy on the core and the
# engine adapters, vulture for dead code (devtools/vulture_whitelist.py lists what frameworks
# call), and last the formatting check.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/vulture
	@$(VENV)/bin/ruff format --check --output-format concise . \
		|| { echo "lint: the files above need formatting; run: $(VENV)/bin/ruff format" >&2; exit 1; }

# The whole suite, the benchmark smoke test (marked slow) and the runtime image's container
# test included (the image: ~10 minutes the first time, reused afterwards; see kserve/README.md).
# TEST_WORKERS pytest processes (pytest-xdist), each taking whole modules (--dist loadfile: a
# module's servers start once); 0 runs it in this process. Two on a 2-core host: the suite's
# servers spend much of their time starting and waiting, which the other process fills.
TEST_WORKERS ?= 2
PYTEST := $(VENV)/bin/pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
# The set-up (its apt steps one at a time) beside Triton's venv; after them the independent
# steps side by side (each mostly on one core: NNCF, mypy), each one's output printed whole when
# it ends; then the tests. The runtime image (minutes on a bare machine: debootstrap, then the
# image's pip) builds in the background from the set-up's end, its output in
# build/kserve-image.log and its exit status in build/kserve-image.status, which the container
# tests wait for (tests/conftest.py's runtime_image), so the other tests need not.
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target setup-serial triton-venv
	@$(MAKE) --no-print-directory config samples
	@rm -f build/kserve-image.status
	@{ $(MAKE) --no-print-directory kserve-image; echo $$? > build/kserve-image.status; } \
		> build/kserve-image.log 2>&1 < /dev/null &
	@$(MAKE) --no-print-directory -j3 --output-sync=target archives triton-server lint
	KSERVE_IMAGE_STATUS=build/kserve-image.status $(PYTEST)

.PHONY: setup-serial
setup-serial:
	@$(MAKE) --no-print-directory -j1 setup

# The inner loop: everything but the tests marked slow or container (see pytest.ini).
test-fast: setup config archives samples triton-server
	@$(MAKE) --no-print-directory lint
	$(PYTEST) -m "not slow and not container"

# Raw model speed, our tagger served (the shipped archives: auto may serve int8), and
# TorchServe's stock image_classifier on the same weights -> results/benchmark.md, .json, .png
# (8-12 minutes on 2 cores). The raw int8 rows need the int8 IR (quantised by `make weights`
# unless QUANTIZE=none; a refusal by the fidelity gate leaves them out).
bench: setup config archives samples
	@$(PY) -m buildsteps.export --backend openvino --weights $(WEIGHTS_DIR)
	@$(PY) -m buildsteps.quantize --weights $(WEIGHTS_DIR) || echo "bench: no int8 rows" >&2
	$(PY) -m bench

# batchSize x maxBatchDelay x workers for the tagger -> results/sweep.md (about 8 minutes).
bench-sweep: setup config archives samples
	$(PY) -m bench.sweep

# Where a request's time goes (upload, frontend, socket, handler) for a small JPEG and a noisy
# 12 MP photo, under frontend JVM/netty variants -> results/ingestion.md (about 6 minutes).
bench-ingestion: setup config archives samples
	$(PY) -m bench.ingestion

# Every kind of client at once against one local server (photos, v2 x8, explanations, bad
# inputs, the floods) -> results/soak.md and .png: latency per class, statuses, worker
# restarts, RSS over time. Bounded: SOAK_MINUTES (10), loopback only; SOAK_QUICK=1 for 30 s;
# SOAK_ENGINE=triton soaks Triton on the generated repository -> results/soak-triton.md.
SOAK_MINUTES ?= 10
SOAK_ENGINE ?= torchserve
soak: setup config archives samples $(if $(filter triton,$(SOAK_ENGINE)),triton-server)
	$(PY) -m bench.soak --minutes $(SOAK_MINUTES) --engine $(SOAK_ENGINE) $(if $(SOAK_QUICK),--quick)

# tsctl embed over 2,000 generated photos vs the server's own throughput, a SIGKILL at ~50%
# and the rerun, exact search over 100,000 vectors -> results/collection.md (about 6 minutes).
bench-collection: setup config archives samples
	$(PY) -m bench.collection

# tsctl index build over 100k synthetic clustered 2,048-d vectors against exact search (#51):
# build time, bytes per vector, query p50/p99 at k=10, recall@10, duplicates' pairs found;
# the same through Milvus (a Milvus Lite server process); the index on the embeddings of 2,000
# generated photos (the archives' weights) -> results/search.md (about 17 minutes on 2 cores).
.PHONY: bench-search
bench-search: setup weights
	$(PY) -m bench.search --milvus --photos 2000

# The CPU path before and after uint8 went to the model (#41), side by side in one process:
# per-image decode + transform, and the batch-8 pipeline with a float-input IR against the
# served one -> results/preprocess.md (about 2 minutes).
.PHONY: bench-preprocess
bench-preprocess: setup weights samples
	$(PY) -m bench.preprocess

# Interactive p95 (2 clients, a photo every 0.2 s each) alone and while tsctl embed runs over
# 2,000 generated photos, on ours (TorchServe, Triton) and stock TorchServe -> traffic.md in results/
# (about 8 minutes).
bench-traffic: setup config archives samples triton-server
	$(PY) -m bench.traffic

# The server fed uint8 crops against fed JPEGs (small, noisy 12 MP) on TorchServe and Triton, and
# the bytes on the wire per image -> results/crops.md (about 4 minutes).
.PHONY: bench-crops
bench-crops: setup config archives samples triton-server
	$(PY) -m bench.crops

# TorchServe and Triton serving models that do no work (the engine alone, and our adapter and
# core with decode and forward no-ops), 1-image and 8-image (v2 JSON, v2 binary) requests ->
# results/ceiling.md: requests/s, images/s and CPU per request, and the plan for one H100
# (docs/backends.md); each row three times, its median shown (about 10 minutes).
bench-ceiling: setup config weights samples triton-server
	$(PY) -m bench.ceiling

# The core rows of bench-ceiling with tracing off beside tracing on at ratio 1.0 ->
# results/ceiling-tracing.md (about 10 minutes; bench/README.md).
bench-ceiling-tracing: setup config weights samples triton-server
	$(PY) -m bench.ceiling --tracing

# The core's own CPU per image with the null model, each request form and both models, this
# tree against landed main before issue #49 (a temporary worktree) -> results/core-cost.md
# (about 3 minutes).
.PHONY: bench-core
bench-core: setup config weights samples
	$(PY) -m bench.corecost

# The served tagger of BEFORE (default 399bde5, before issue #49) and of this tree, two
# TorchServes side by side, 16 clients on each sample image in turn, three rounds ->
# results/before-after.md (about 8 minutes).
BEFORE ?=
.PHONY: bench-before-after
bench-before-after: setup config archives samples
	$(PY) -m bench.beforeafter $(if $(BEFORE),--before $(BEFORE))

# Several tagger heads from one forward against one head and against two models, the core in
# process, side by side -> results/heads.md (about a minute).
.PHONY: bench-heads
bench-heads: setup weights samples
	$(PY) -m bench.heads

# A worker's start with and without the host's stored precision decision -> results/worker-start.md
# (about 2 minutes).
.PHONY: bench-worker-start
bench-worker-start: setup config archives
	$(PY) -m bench.workerstart

# On the device it finds (CUDA, else CPU): the raw forward per precision and layout, the pipeline
# limit (decode, resize, crop, normalise on the device, then forward) and the core's
# ImageModel.run on small and 12 MP JPEGs, as ratios -> results/gpu.md on a GPU (bounded to
# under 5 minutes on an H100), build/bench-gpu.md on CPU. No Java, no Triton: on a bare GPU
# host `python3 -m bench.gpu` needs torch, torchvision, numpy and Pillow (psutil for the core's
# row, else it says "core skipped"), and builds seeded weights when none are built.
bench-gpu: $(VENV)/.installed
	$(PY) -m bench.gpu

# A bare, offline GPU host (a Python with torch only; no Java, no Triton, no network): what it
# lacks staged here for its Python (GPU_PYTHON) into build/stage/load-N, folders of at most what
# one call to it carries beside the checkout (buildsteps/stage.py: a jlinked Java runtime,
# TorchServe's and our wheels, Triton's, the GPU decoders', each with the manifest). Send each
# load, then run `bash bench/gpuserved.sh` there (make bench-gpu-served): it installs them
# offline and measures TorchServe with GPU workers and Triton with KIND_GPU instances beside
# the core -> results/gpu-served.md, in under 8 minutes. make bench-gpu-served-rehearsal plays
# the bare host here (devtools/barehost.py: a Python seeing only torch, a copy of the tree, a
# stage for this Python) and runs the same script on the CPU -> build/gpu-served.md.
# LIBPYTHON=/path/libpython3.12.so.1.0: for a host whose Python has no shared libpython (Triton's
# backend stub links it; default: a python3.12 on PATH's, if any).
GPU_PYTHON ?= 3.12
LIBPYTHON ?=
.PHONY: gpu-stage bench-gpu-served bench-gpu-served-rehearsal
gpu-stage: $(VENV)/.installed java
	$(PY) -m buildsteps.stage --python $(GPU_PYTHON) $(if $(LIBPYTHON),--libpython "$(LIBPYTHON)")

bench-gpu-served:
	bash bench/gpuserved.sh

bench-gpu-served-rehearsal: $(VENV)/.installed java triton-server
	$(PY) -m devtools.barehost

# The GPU path's open questions (nvImageCodec's backend kinds, regions and 4:1:1 on its hardware
# engines, chroma upsampling against PIL, corrupt scans and mixed batches through the core, the
# decode stream's drain and its pool) asked of the device in about a minute: results/gpu-check.md
# on a GPU, build/gpu-check.md as a rehearsal on CPU. Bare: `python3 -m bench.gpucheck`.
.PHONY: gpu-check
gpu-check: $(VENV)/.installed
	$(PY) -m bench.gpucheck

# KServe (kserve/README.md). The storage bundle our runtime reads, as a folder and a .tar.gz
# under build/kserve/ (KSERVE_DEVICE=gpu for the GPU bundle: eager archives packed with each
# model's gpu: section for KSERVE_GPUS GPUs per pod, buildsteps/gpu.py;
# KSERVE_MODEL_VERSION=2.0 for the canary's; KSERVE_ENGINE=triton: the model repository our
# Triton runtime reads, build/kserve/resnet50-triton/, with KSERVE_DEVICE=gpu the KIND_GPU one
# for the stock runtime, resnet50-triton-gpu/), and the offline lint of every manifest.
KSERVE_ENGINE ?= torchserve
KSERVE_DEVICE ?= cpu
KSERVE_GPUS ?= 1
KSERVE_MODEL_VERSION ?=
.PHONY: kserve-bundle kserve-lint

kserve-bundle: $(VENV)/.installed config archives
	$(PY) -m kserve_tools.bundle --engine "$(KSERVE_ENGINE)" --device "$(KSERVE_DEVICE)" --gpus "$(KSERVE_GPUS)" $(if $(KSERVE_MODEL_VERSION),--model-version "$(KSERVE_MODEL_VERSION)")

kserve-lint: $(VENV)/.installed config
	$(PY) -m kserve_tools.lint

# The runtime image (kserve/runtime/Dockerfile) with podman or docker (devtools/ensure_podman.sh
# installs podman where apt-get can), FROM Debian 12 debootstrapped here (KSERVE_BASE=debian, no
# registry needed) or an image (KSERVE_BASE=python:3.11-slim-bookworm); reused while the
# Dockerfile, the files it copies (the runtime pins, the Triton launcher) and the base are
# unchanged (kserve_tools/image.py). One image serves both runtimes (TorchServe and Triton).
# Then the container tests: the image started as each ClusterServingRuntime starts it, on its
# bundle.
KSERVE_BASE ?= debian
.PHONY: podman kserve-image kserve-image-test

podman:
	@KSERVE_BASE="$(KSERVE_BASE)" devtools/ensure_podman.sh

kserve-image: $(VENV)/.installed podman
	$(PY) -m kserve_tools.image --base "$(KSERVE_BASE)" $(if $(KSERVE_TORCH_INDEX),--torch-index "$(KSERVE_TORCH_INDEX)")

# The bundle as a modelcar (kserve/overlays/modelcar, storageUri oci://...): an OCI image holding
# it under /models, FROM the runtime image's base (KSERVE_BASE), tagged
# localhost/<bundle name>:<version>-<key> and reused while the bundle and the base are unchanged
# (kserve_tools/modelcar.py). KSERVE_DEVICE and KSERVE_MODEL_VERSION as for kserve-bundle.
.PHONY: kserve-modelcar
kserve-modelcar: kserve-bundle podman
	$(PY) -m kserve_tools.modelcar --device "$(KSERVE_DEVICE)" --base "$(KSERVE_BASE)" $(if $(KSERVE_MODEL_VERSION),--model-version "$(KSERVE_MODEL_VERSION)")

kserve-image-test: setup config archives kserve-image
	$(VENV)/bin/pytest -m container tests/test_kserve_image.py tests/test_kserve_triton_image.py

# The screenshots of the result pages (tsctl similar|duplicates|explain --html) in
# docs/operations.md: docs/page-*.png (each under 150 KB), made from scikit-image's sample
# photos against a TorchServe started for it (devtools/pages_demo.py; about 1 minute).
.PHONY: docs-screenshots
docs-screenshots: setup config archives samples
	$(PY) -m devtools.pages_demo

clean:
	rm -rf build *.egg-info model-store/*.mar logs key_file.json config/config.properties kserve/config.properties kserve/runtime/config.properties
