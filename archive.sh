#!/usr/bin/env bash
# Pack the handler, model code, weights and configs into TorchServe archives, one per model
# config: model-store/resnet50-embedding.mar and model-store/resnet50-tagger.mar
#
# Usage: ./archive.sh [model-name ...]          (default: every config/models/*.yaml)
# Environment (the defaults of BACKEND, QUANTIZE and VERSION are model_files/artifacts.py's
# and buildsteps/configgen.py's, asked below):
#   BACKEND      openvino (default) | onnx | torchscript | eager: which serialized model goes
#                in (buildsteps/export.py writes the onnx, openvino and torchscript files)
#   QUANTIZE     int8 (default) | none: int8 also packs the quantised OpenVINO IR that
#                buildsteps/quantize.py wrote after its fidelity gate passed (BACKEND=openvino;
#                other backends have none), beside the float one; none leaves it out.
#                The runtime arithmetic is handler.precision in config/models/*.yaml.
#   WEIGHTS_DIR  where buildsteps/weights.py wrote the weights (build/weights)
#   OUT          output folder (model-store)
#   VERSION      archive version (default 1.0): config.properties models={...} is keyed by it.
#                Another version is written as <model-name>-<VERSION>.mar, next to the default,
#                e.g. VERSION=2.0 CONFIG_DIR=/tmp/v2 ./archive.sh resnet50-tagger
#   EXPLAIN      1 (default): pack the PyTorch checkpoint for /explanations; 0: leave it out
#   CONFIG_DIR   where <model-name>.yaml (the archive's model-config.yaml) is read
#                (config/models)
set -euo pipefail
cd "$(dirname "$0")"

die() { echo "archive.sh: error: $*" >&2; exit 1; }

[ -z "${PRECISION+set}" ] \
  || die "PRECISION is now QUANTIZE (none|int8); unset PRECISION (runtime arithmetic: handler.precision)"
WEIGHTS_DIR=${WEIGHTS_DIR:-build/weights}
OUT=${OUT:-model-store}
CONFIG_DIR=${CONFIG_DIR:-config/models}
ARCHIVER=${ARCHIVER:-.venv/bin/torch-model-archiver}
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$ARCHIVER" ] || ARCHIVER=$(command -v torch-model-archiver) \
  || die "torch-model-archiver not found: run 'make setup' first"
[ -x "$PYTHON" ] || PYTHON=$(command -v python3) || die "python3 not found: run 'make setup' first"
DEFAULTS=$("$PYTHON" -m model_files.artifacts defaults) || die "model_files.artifacts failed"
read -r DEFAULT_BACKEND DEFAULT_QUANTIZE <<< "$DEFAULTS"
BACKEND=${BACKEND:-$DEFAULT_BACKEND}
QUANTIZE=${QUANTIZE:-$DEFAULT_QUANTIZE}
[ -n "${VERSION:-}" ] || VERSION=$("$PYTHON" -m buildsteps.configgen version) \
  || die "buildsteps.configgen failed: run 'make setup' first"
MODELS=("$@")
if [ ${#MODELS[@]} -eq 0 ]; then
  for f in "$CONFIG_DIR"/*.yaml; do
    if [ -f "$f" ]; then MODELS+=("$(basename "$f" .yaml)"); fi
  done
  [ ${#MODELS[@]} -gt 0 ] || die "no model config in $CONFIG_DIR"
fi

# model_files/artifacts.py names the file each backend loads, then the files it needs beside it,
# and the int8 files to add (none, with the reason on stderr, when the gate refused them).
FILES=$("$PYTHON" -m model_files.artifacts files "$BACKEND") \
  || die "no archive for BACKEND='$BACKEND' (why: above)"
mapfile -t FILES <<< "$FILES"
SERIALIZED="$WEIGHTS_DIR/${FILES[0]}"
for f in "${FILES[@]/#/$WEIGHTS_DIR/}" "$WEIGHTS_DIR/weights_info.json" "$WEIGHTS_DIR/index_to_name.json"; do
  [ -f "$f" ] || die "missing $f: run 'make weights BACKEND=$BACKEND QUANTIZE=$QUANTIZE' first"
done
INT8=$("$PYTHON" -m model_files.artifacts int8 "$BACKEND" "$QUANTIZE" "$WEIGHTS_DIR") \
  || die "QUANTIZE='$QUANTIZE' (why: above)"
mapfile -t INT8 <<< "$INT8"
[ -n "${INT8[0]}" ] || INT8=()

# torch-model-archiver copies a folder given in --extra-files flat into the archive root, so
# stage one folder holding the handlers/, servecore/, model_files/ and serveshared/ (what the
# core shares with clients) packages and the weight
# metadata. It also stages in $TMPDIR/<model-name> and deletes that first: give each run a
# private TMPDIR.
mkdir -p build "$OUT"
WORK=$(mktemp -d build/archive.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/stage"
ARCHIVER_TMP="$WORK/tmp"
mkdir -p "$STAGE" "$ARCHIVER_TMP"
find handlers servecore model_files serveshared -name '*.py' -exec cp --parents {} "$STAGE/" \;
cp "$WEIGHTS_DIR/weights_info.json" "$WEIGHTS_DIR/index_to_name.json" "$STAGE/"
for f in "${FILES[@]:1}" "${INT8[@]}"; do cp "$WEIGHTS_DIR/$f" "$STAGE/"; done
# Explanations need gradients, so the PyTorch checkpoint goes in whatever the backend (about
# 95 MB more in an onnx or torchscript archive; README "Explanations"). EXPLAIN=0 leaves it
# out: /explanations then answers 501.
CHECKPOINT="$WEIGHTS_DIR/$("$PYTHON" -m model_files.artifacts serialized eager)"
if [ "${EXPLAIN:-1}" != 0 ] && [ "$CHECKPOINT" != "$SERIALIZED" ]; then cp "$CHECKPOINT" "$STAGE/"; fi

# zip-store: the members are stored, not deflated. The weights (230 MB) do not compress (8%),
# but inflating them cost TorchServe 3.5 s per model at every start and the archiver 8 s per
# archive; stored, the frontend extracts them at disk speed (a 2-model start on a 2-core AMD
# EPYC, idle: 20.7 s -> 13.7 s).
for model in "${MODELS[@]}"; do
  config="$CONFIG_DIR/$model.yaml"
  [ -f "$config" ] || die "no model config $config for model '$model'"
  TMPDIR="$PWD/$ARCHIVER_TMP" "$ARCHIVER" \
    --model-name "$model" \
    --version "$VERSION" \
    --serialized-file "$SERIALIZED" \
    --handler handlers/resnet_handler.py \
    --extra-files "$STAGE" \
    --config-file "$config" \
    --export-path "$WORK" \
    --archive-format zip-store \
    --force
  # The archiver names the file after the model; another version must not overwrite the default.
  archive=$("$PYTHON" -m buildsteps.configgen archive-name "$model" "$VERSION")
  mv "$WORK/$model.mar" "$OUT/$archive"
  echo "archived $OUT/$archive (version $VERSION, backend $BACKEND: ${FILES[*]} ${INT8[*]})"
done
