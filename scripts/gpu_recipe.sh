#!/usr/bin/env bash
# The GPU recipe in one call: experiment=europarl_tatoeba_gpu trained for six minutes,
# averaged and evaluated on the three test sets (scripts/gpu/gpu_recipe.py has the steps;
# docs/gpu.md, "The GPU recipe in one call").
#
#   scripts/gpu_recipe.sh --pack              # here, once, before a GPU is at hand: fills .gpu/recipe/
#   scripts/gpu_recipe.sh                     # on the GPU machine: $OUT/gpu_recipe.json + .log, < 9 min
#   scripts/gpu_recipe.sh --cpu --out DIR     # every step at toy size on a CPU (CI)
#   scripts/gpu_recipe.sh --cpu --data .gpu/recipe/data --out DIR   # the packed corpus, tiny model
#   scripts/gpu_recipe.sh --steps export      # a step again on the same machine (/tmp/gpu_recipe kept)
#
# The GPU machine has no network, its own python3 with PyTorch, and only what travels with
# the work tree: at most 64 MiB beyond the repository. Europarl's gzip files alone are 65 MB,
# so --pack writes into the git-ignored .gpu/recipe/ 47.3 MB (45.1 MiB; measured 2026-11-27,
# printed at the end), beside a work tree of 3.8 MB:
#   wheels/   1.5 MB: what that image lacks (scripts/gpu/gpu_wheels.sh) without ctranslate2, whose
#             43 MB wheel does not fit beside the corpus; installed into /tmp at start
#   data/europarl/train.{it,en}.xz (41.5 MB), data/tatoeba/train.{it,en}.xz (2.5 MB)
#             the shared training text recompressed with xz -9 (the pipeline reads .xz as it
#             reads .gz): Europarl's 65 MB of gzip, Tatoeba's 19 MB of plain text
#   data/{europarl,tatoeba}/dev.{it,en}, data/eval/{tatoeba-test,europarl-test,flores200-devtest}.{it,en}
#             2.2 MB, copied as they are
#   data/spm.model
#             0.1 MB: the recipe's vocabulary, trained here by preparing the corpus once
#             (data/cache, minutes): the GPU machine only cleans and encodes (data.tokenizer)
# and beside it .gpu/recipe_ct2/, ctranslate2's wheel alone, for the int8 export in a second
# call on the same machine while it is warm (30 s after a call): /tmp/gpu_recipe and the
# first call's .gpu/recipe are still there, and the two folders together (90 MB) would not
# travel in one call. With the device tool:
#   run(command="scripts/gpu_recipe.sh", carry=[".gpu/recipe"], timeout_s=600)
#   run(command="scripts/gpu_recipe.sh --steps export", carry=[".gpu/recipe_ct2"], timeout_s=300)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
source scripts/gpu/gpu_wheels.sh   # download_wheels, install_wheels

squeeze() {   # SRC (text, or .gz) -> DEST.xz, unless DEST is newer than SRC
    local src=$1 dest=$2
    [ "$dest" -nt "$src" ] && return
    case "$src" in *.gz) gzip -dc "$src" ;; *) cat "$src" ;; esac | xz -9 > "$dest.tmp"
    mv "$dest.tmp" "$dest"
}

pack() {
    local shared=../shared/data dest=.gpu/recipe
    local data=$dest/data
    [ -d "$shared/europarl" ] || { echo "gpu_recipe.sh --pack: $shared/europarl not found" >&2; exit 2; }
    mkdir -p "$data/europarl" "$data/tatoeba" "$data/eval"
    download_wheels "$dest/wheels" --no-ct2
    download_wheels .gpu/recipe_ct2 --only-ct2
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/gpu/gpu_recipe.py --vocab "$data/spm.model"
    local lang   # xz -9, four processes: minutes; a file packed before from the same source is kept
    for lang in it en; do
        squeeze "$shared/europarl/train.$lang.gz" "$data/europarl/train.$lang.xz" &
        squeeze "$shared/tatoeba/train.$lang" "$data/tatoeba/train.$lang.xz" &
    done
    wait
    install -m 644 "$shared"/europarl/dev.{it,en} "$data/europarl/"
    install -m 644 "$shared"/tatoeba/dev.{it,en} "$data/tatoeba/"
    install -m 644 "$shared"/eval/{tatoeba-test,europarl-test,flores200-devtest}.{it,en} "$data/eval/"
    du -b --max-depth=2 .gpu/recipe .gpu/recipe_ct2
    echo "gpu_recipe.sh --pack: .gpu/recipe holds $(du -sb $dest | cut -f1) bytes" \
         "($(( $(du -sb $dest | cut -f1) / 1048576 )) MiB) to carry, of 64 MiB with the work tree"
}

case "${1:-}" in
    --pack) pack ;;
    --cpu) export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"; exec "$PYTHON" scripts/gpu/gpu_recipe.py "$@" ;;
    *)  if ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
            echo "gpu_recipe: no CUDA device here; run it on a GPU machine, or with --cpu" >&2; exit 2
        fi
        install_wheels .gpu/recipe/wheels /tmp/gpu_recipe_site
        if ls .gpu/recipe_ct2/*.whl >/dev/null 2>&1; then
            "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target /tmp/gpu_recipe_site .gpu/recipe_ct2/*.whl
        fi
        export PYTHONUNBUFFERED=1
        exec "$PYTHON" scripts/gpu/gpu_recipe.py "$@" ;;
esac
