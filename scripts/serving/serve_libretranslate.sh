#!/usr/bin/env bash
# Serve a model with LibreTranslate (its REST API and web page) on 127.0.0.1, offline.
#
#   scripts/serving/serve_libretranslate.sh <checkpoint dir | mt-export dir | file.argosmodel> [port]
#   scripts/serving/serve_libretranslate.sh --setup        # only build LibreTranslate's venv (CI)
#
# A checkpoint is packed with `mt-export format=argos` (int8 unless QUANTIZATION=none|...);
# an mt-export directory is packed from the checkpoint its export.json names, with its
# quantization. LibreTranslate runs from its own venv (MT_SERVE_VENV, default .venv-serve):
# it installs its fork of argostranslate over the argostranslate module, so it must not
# share the project's .venv. Everything Argos writes goes to a scratch folder (MT_SERVE_HOME,
# default a temporary one, deleted at exit), and nothing is fetched: a local empty package
# index, --load-only it,en, spaCy sentence splitting shipped in the package. Ctrl-C or
# SIGTERM stops the server, and so does the script's death however it comes (the server
# holds a parent-death signal), taking the scratch folder with it. Nothing leaves the
# machine: onnxruntime's telemetry is off and the server refuses any socket past loopback.
# Settings (each bounded; a bad one is one line before anything starts): PORT (5000),
# CHAR_LIMIT (5000 characters a text), BATCH_LIMIT (16 texts a request), ALTERNATIVES_LIMIT
# (3; each widens the beam), THREADS (LibreTranslate's request threads, 8: two are kept for
# short requests), REQ_LIMIT (requests a minute per client address, LibreTranslate's
# --req-limit; 0 = none), MAX_SENTENCES (1000 sentences a request, all texts and lines),
# MAX_PIECES (20000 SentencePiece pieces a request), REQUEST_SECONDS (20: a request not
# done by then is answered 503), LENGTH_BUCKET (8: a sentence of n pieces gets at most
# 1.2 n' + 10, n' = n rounded up to a multiple of it; sentences that share n' share a
# batch), ARGOS_BEAM_SIZE (Argos's 4), ARGOS_INTER_THREADS
# (concurrent CTranslate2 calls: the CPU count, at most 8), ARGOS_INTRA_THREADS (1 thread
# each), MT_SERVE_DEBUG=1 (Argos's log of every request's text; off by default).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${MT_SERVE_VENV:-$ROOT/.venv-serve}"
# The versions this project tests with. Nothing they pull needs torch (pip's resolver report:
# argos-translate-lt dropped stanza), so no CUDA build of torch is downloaded.
LT_PACKAGES=(libretranslate==1.9.6 spacy==3.8.18)

die() { echo "serve_libretranslate: error: $*" >&2; exit 1; }

# onnxruntime (which argostranslate and libretranslate import through minisbd, for a sentence
# splitter this project does not use) sends telemetry to mobile.events.data.microsoft.com
# when imported, unless this is set. The server does not even load it.
export ORT_DISABLE_TELEMETRY=1

setup_venv() {
  # find_spec, not import: importing libretranslate loads onnxruntime
  if [[ -x "$VENV/bin/libretranslate" && -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c \
      "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ('spacy', 'argostranslate', 'libretranslate'))))" \
      2>/dev/null; then
    return
  fi
  echo "serve_libretranslate: building LibreTranslate's venv in $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "${LT_PACKAGES[@]}"
}

if [[ "${1:-}" == "--setup" ]]; then setup_venv; exit 0; fi
[[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 <checkpoint dir | export dir | file.argosmodel> [port]"
SOURCE="$1"
PORT="${2:-${PORT:-5000}}"
# name=value lo hi: a whole number in [lo, hi], or one line and exit
bounded() {
  [[ "$2" =~ ^[0-9]{1,9}$ ]] && (( 10#$2 >= $3 && 10#$2 <= $4 )) || die "$1=$2: must be a whole number in [$3, $4]"
}
bounded port "$PORT" 1 65535
CPUS="$(nproc 2>/dev/null || echo 2)"
export ARGOS_INTER_THREADS="${ARGOS_INTER_THREADS:-$(( CPUS < 8 ? CPUS : 8 ))}" ARGOS_INTRA_THREADS="${ARGOS_INTRA_THREADS:-1}"
export ARGOS_BEAM_SIZE="${ARGOS_BEAM_SIZE:-4}"
bounded CHAR_LIMIT "${CHAR_LIMIT:=5000}" 1 100000
bounded BATCH_LIMIT "${BATCH_LIMIT:=16}" 1 1000
bounded ALTERNATIVES_LIMIT "${ALTERNATIVES_LIMIT:=3}" 0 16
bounded THREADS "${THREADS:=8}" 3 64
bounded REQ_LIMIT "${REQ_LIMIT:=0}" 0 1000000
bounded MAX_SENTENCES "${MAX_SENTENCES:=1000}" 1 100000
bounded MAX_PIECES "${MAX_PIECES:=20000}" 1 1000000
bounded REQUEST_SECONDS "${REQUEST_SECONDS:=20}" 1 3600
bounded LENGTH_BUCKET "${LENGTH_BUCKET:=8}" 1 256
bounded ARGOS_INTER_THREADS "$ARGOS_INTER_THREADS" 1 64
bounded ARGOS_INTRA_THREADS "$ARGOS_INTRA_THREADS" 0 64
bounded ARGOS_BEAM_SIZE "$ARGOS_BEAM_SIZE" 1 16
[[ -e "$SOURCE" ]] || die "no such file or directory: $SOURCE"
SOURCE="$(cd "$(dirname "$SOURCE")" && pwd)/$(basename "$SOURCE")"  # before any cd
# A busy port: one line now, not a traceback after the model is packed and loaded.
python3 - "$PORT" 2>/dev/null <<'PY' || die "port $PORT is in use (another server?): choose another with PORT=... or a second argument"
import socket, sys
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
PY

# The project's own commands (mt-export): its .venv, or whatever is on PATH.
MT_EXPORT="$ROOT/.venv/bin/mt-export"
[[ -x "$MT_EXPORT" ]] || MT_EXPORT="$(command -v mt-export || true)"

HOME_DIR="${MT_SERVE_HOME:-}"
CLEAN_HOME=0
if [[ -z "$HOME_DIR" ]]; then
  HOME_DIR="$(mktemp -d -t mt-serve-XXXXXX)"; CLEAN_HOME=1
  echo "$$" > "$HOME_DIR/.mt-serve-owner"  # the server deletes a folder so marked when it stops
  export MT_SERVE_CLEANUP="$HOME_DIR"
elif [[ -e "$HOME_DIR" && ! -e "$HOME_DIR/.mt-serve-home" ]] && [[ -n "$(ls -A "$HOME_DIR" 2>/dev/null || echo x)" ]]; then
  # a folder of the user's: this script writes its index, packages and caches there
  die "MT_SERVE_HOME=$HOME_DIR holds files this script did not write: name a new or empty folder"
fi
mkdir -p "$HOME_DIR" && touch "$HOME_DIR/.mt-serve-home"
SERVER=""
cleanup() {
  if [[ -n "$SERVER" ]] && kill -0 "$SERVER" 2>/dev/null; then
    kill -TERM "$SERVER" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  if (( CLEAN_HOME )); then rm -rf "$HOME_DIR"; fi
}
trap cleanup EXIT
trap 'echo "serve_libretranslate: stopping" >&2; exit 0' INT TERM

# 1. The package.
if [[ -f "$SOURCE" && "$SOURCE" == *.argosmodel ]]; then
  PACKAGE="$SOURCE"
elif [[ -d "$SOURCE" ]]; then
  [[ -n "$MT_EXPORT" ]] || die "mt-export not found: activate the project's venv (pip install -e \".[argos]\")"
  CHECKPOINT="$SOURCE"
  QUANT="${QUANTIZATION:-int8}"
  if [[ -f "$SOURCE/export.json" ]]; then  # an mt-export directory: pack its checkpoint again
    INFO="$("$(dirname "$MT_EXPORT")/python" -c \
      'import json,sys; i=json.load(open(sys.argv[1])); print(i["quantization"]); print(i["checkpoint"])' \
      "$SOURCE/export.json")" || die "$SOURCE/export.json: cannot read it"
    QUANT="${INFO%%$'\n'*}" CHECKPOINT="${INFO#*$'\n'}"
    [[ -d "$CHECKPOINT" ]] || die "export $SOURCE was made from $CHECKPOINT, which is gone: serve a checkpoint or an .argosmodel"
  fi
  PACKAGE="$HOME_DIR/$(basename "$CHECKPOINT").argosmodel"
  # force=true replaces only a package mt-export wrote there before (its output rule)
  "$MT_EXPORT" "checkpoint=$CHECKPOINT" "output=$PACKAGE" format=argos "quantization=$QUANT" force=true
else
  die "$SOURCE: expected a checkpoint directory, an mt-export directory or a .argosmodel file"
fi

# 2. LibreTranslate's venv, and an environment in which nothing is fetched.
setup_venv
export XDG_DATA_HOME="$HOME_DIR/data" XDG_CONFIG_HOME="$HOME_DIR/config" XDG_CACHE_HOME="$HOME_DIR/cache"
export ARGOS_PACKAGES_DIR="$HOME_DIR/packages"
mkdir -p "$HOME_DIR/index" "$ARGOS_PACKAGES_DIR"
echo "[]" > "$HOME_DIR/index/index.json"  # LibreTranslate looks for updates at boot: none here
export ARGOS_PACKAGE_INDEX="file://$HOME_DIR/index/"
# Argos downloads spaCy's xx_sent_ud_sm at import unless this folder exists; the package's
# own spacy/ folder is what splits sentences.
mkdir -p "$XDG_CACHE_HOME/argos-translate/spacy/senter/model"
export ARGOS_CHUNK_TYPE=SPACY            # MiniSBD and Stanza would download models
export ARGOS_COMPUTE_TYPE=default        # the weights' own type (argostranslate's "auto" is int8)
export ARGOS_DEVICE_TYPE="${ARGOS_DEVICE_TYPE:-cpu}"
export STANZA_RESOURCES_DIR="$HOME_DIR/stanza" HF_HUB_OFFLINE=1 PIP_NO_INDEX=1
# onnxruntime also writes a session file to $TMPDIR when imported: should anything load it,
# into the scratch folder
export TMPDIR="$HOME_DIR/tmp"
mkdir -p "$TMPDIR"
"$VENV/bin/python" -c 'import sys; from argostranslate import package; package.install_from_path(sys.argv[1])' \
  "$PACKAGE" || die "$PACKAGE: argostranslate could not install it"

# 3. The server, on loopback only: it dies with this script (a parent-death signal), and
# answers with our token, so that the readiness check cannot mistake another server for it.
cd "$HOME_DIR"
export MT_SERVE_PARENT=$$ MT_SERVE_TOKEN="$$-$RANDOM$RANDOM" MT_SERVE_MAX_SENTENCES="$MAX_SENTENCES"
export MT_SERVE_MAX_PIECES="$MAX_PIECES" MT_SERVE_SECONDS="$REQUEST_SECONDS" MT_SERVE_LENGTH_BUCKET="$LENGTH_BUCKET"
LIMITS=(--char-limit "$CHAR_LIMIT" --batch-limit "$BATCH_LIMIT" --alternatives-limit "$ALTERNATIVES_LIMIT" --threads "$THREADS")
if (( REQ_LIMIT > 0 )); then LIMITS+=(--req-limit "$REQ_LIMIT"); fi
# LibreTranslate's command behind our checks and fair batching (scripts/serving/libretranslate_guard.py).
"$VENV/bin/python" "$ROOT/scripts/serving/libretranslate_guard.py" --host 127.0.0.1 --port "$PORT" \
  --load-only it,en "${LIMITS[@]}" --disable-files-translation \
  --frontend-language-source it --frontend-language-target en &
SERVER=$!
URL="http://127.0.0.1:$PORT"
for _ in $(seq 600); do
  kill -0 "$SERVER" 2>/dev/null || { wait "$SERVER" || true; SERVER=""; exit 1; }  # it said why
  if "$VENV/bin/python" - "$URL/languages" "$MT_SERVE_TOKEN" 2>/dev/null <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=1) as r:
    sys.exit(r.headers.get("X-MT-Serve") != sys.argv[2])
PY
  then
    echo "serve_libretranslate: LibreTranslate serves Italian→English at $URL/ (API: $URL/translate); Ctrl-C stops it"
    break
  fi
  sleep 0.2
done
wait "$SERVER" || die "LibreTranslate stopped (status $?)"
