#!/usr/bin/env bash
# The GPU check in one command (scripts/gpu_check.py has the steps; docs/training.md,
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

pack() {
    local shared=../shared/data wheels=.gpu/wheels data=.gpu/data
    [ -d "$shared/tatoeba" ] || { echo "gpu_check.sh --pack: $shared/tatoeba not found" >&2; exit 2; }
    mkdir -p "$wheels" "$data/tatoeba" "$data/eval"
    rm -f "$wheels"/*.whl   # .gpu/ is this script's own folder
    local platform=(--python-version 3.12 --implementation cp --only-binary=:all:
                    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
                    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    "$PYTHON" -m pip download -q --no-deps "${platform[@]}" -d "$wheels" \
        hydra-core==1.3.8 omegaconf==2.3.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
        fsspec==2026.9.0 ctranslate2==4.8.5 sentence-splitter==1.4
    "$PYTHON" -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$wheels"  # an sdist only
    gzip -c "$shared/tatoeba/train.it" > "$data/tatoeba/train.it.gz"
    gzip -c "$shared/tatoeba/train.en" > "$data/tatoeba/train.en.gz"
    install -m 644 "$shared"/tatoeba/dev.{it,en} "$data/tatoeba/"
    install -m 644 "$shared"/eval/tatoeba-test.{it,en} "$data/eval/"
    install -m 644 "$shared"/eval/europarl-test.{it,en} "$data/eval/"  # the decode step's long prose
    du -sh .gpu
}

install_wheels() {
    # Into a folder of its own, ahead of the image's packages on PYTHONPATH.
    local site=/tmp/gpu_check_site
    if ls .gpu/wheels/*.whl >/dev/null 2>&1 && [ ! -d "$site" ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" .gpu/wheels/*.whl
    fi
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$site/bin:$PATH"
}

case "${1:-}" in
    --pack) pack ;;
    --cpu) export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"; exec "$PYTHON" scripts/gpu_check.py "$@" ;;
    *)  if ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
            echo "gpu_check: no CUDA device here; run it on a GPU machine, or with --cpu" >&2; exit 2
        fi
        install_wheels
        export PYTHONUNBUFFERED=1
        exec "$PYTHON" scripts/gpu_check.py "$@" ;;
esac
