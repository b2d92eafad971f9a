# Wheels of what the GPU machine's image lacks (hydra-core, omegaconf, antlr4, datasets and
# its dill/multiprocess/fsspec, sentence-splitter, and for the exports ctranslate2), for
# scripts/gpu_check.sh and scripts/gpu_recipe.sh, which source this file. The machine has
# no network and Python 3.12; tests/test_gpu_check.py checks that every module-level import
# of the package is either here or on its image (gpu_check.py's IMAGE_MODULES).
#   download_wheels DIR [--no-ct2 | --only-ct2]
#                                    here: DIR's wheels replaced by these (ctranslate2's
#                                    is 43 MB: --no-ct2 leaves it out, --only-ct2 the rest)
#   install_wheels DIR SITE          there: into SITE (once), ahead of the image's packages

download_wheels() {
    local wheels=$1 ct2=ctranslate2==4.8.5
    local rest=(hydra-core==1.3.8 omegaconf==2.3.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
                fsspec==2026.9.0 sentence-splitter==1.4)
    case "${2:-}" in --no-ct2) ct2= ;; --only-ct2) rest=() ;; esac
    mkdir -p "$wheels"
    rm -f "$wheels"/*.whl   # the caller's own folder
    local platform=(--python-version 3.12 --implementation cp --only-binary=:all:
                    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
                    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    "$PYTHON" -m pip download -q --no-deps "${platform[@]}" -d "$wheels" "${rest[@]}" $ct2
    [ "${2:-}" = --only-ct2 ] && return
    "$PYTHON" -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$wheels"  # an sdist only
}

install_wheels() {
    local wheels=$1 site=$2
    if ls "$wheels"/*.whl >/dev/null 2>&1 && [ ! -d "$site" ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "$wheels"/*.whl
    fi
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$site/bin:$PATH"
}
