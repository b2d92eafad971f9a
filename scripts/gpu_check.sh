#!/usr/bin/env bash
# The GPU check in one command (scripts/gpu/gpu_check.py has the steps; docs/gpu.md,
# "Checking a GPU", what each figure means).
#
#   scripts/gpu_check.sh --pack             # here, once, before a GPU is at hand: fills .gpu/
#   scripts/gpu_check.sh                    # on the GPU machine: $OUT/gpu_check.json + .log
#   scripts/gpu_check.sh --cpu --out DIR    # every step at toy size on a CPU, < 90 s (CI)
#   scripts/gpu_check.sh --steps train,decode   # a rerun of some steps
#
# The GPU machine has no network, its own python3 with PyTorch, and only what travels with
# the work tree. Carry exactly this one ignored path (git-ignored, ~53 MB, under the
# device tool's 64 MiB):
#   .gpu/wheels/   wheels of what that image lacks (hydra-core, omegaconf, antlr4, datasets
#                  and its dill/multiprocess/fsspec, ctranslate2, sentence-splitter), installed
#                  into /tmp at start; tests/test_gpu_check.py checks that every module-level
#                  import of the package is either carried or on the image (IMAGE_MODULES)
#   .gpu/data/     Tatoeba train (gzip) and dev, tatoeba-test, europarl-test: copied from ../shared/data,
#                  which does not travel; data.root=.gpu/data points the configs there
# e.g. run(command="scripts/gpu_check.sh", carry=[".gpu"], timeout_s=560)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
source scripts/gpu/gpu_wheels.sh   # download_wheels, install_wheels

pack() {
    local shared=../shared/data wheels=.gpu/wheels data=.gpu/data
    [ -d "$shared/tatoeba" ] || { echo "gpu_check.sh --pack: $shared/tatoeba not found" >&2; exit 2; }
    mkdir -p "$data/tatoeba" "$data/eval"
    download_wheels "$wheels"   # scripts/gpu/gpu_wheels.sh
    gzip -c "$shared/tatoeba/train.it" > "$data/tatoeba/train.it.gz"
    gzip -c "$shared/tatoeba/train.en" > "$data/tatoeba/train.en.gz"
    install -m 644 "$shared"/tatoeba/dev.{it,en} "$data/tatoeba/"
    install -m 644 "$shared"/eval/tatoeba-test.{it,en} "$data/eval/"
    install -m 644 "$shared"/eval/europarl-test.{it,en} "$data/eval/"  # the decode step's long prose
    du -sh .gpu
}

case "${1:-}" in
    --pack) pack ;;
    --cpu) export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"; exec "$PYTHON" scripts/gpu/gpu_check.py "$@" ;;
    *)  if ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
            echo "gpu_check: no CUDA device here; run it on a GPU machine, or with --cpu" >&2; exit 2
        fi
        install_wheels .gpu/wheels /tmp/gpu_check_site
        export PYTHONUNBUFFERED=1
        exec "$PYTHON" scripts/gpu/gpu_check.py "$@" ;;
esac
