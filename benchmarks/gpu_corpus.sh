#!/usr/bin/env bash
# The realistic-script diagnosis corpus on GPUs (one rank per GPU, NCCL), on a bare GPU machine.
# Installs what the machine lacks from carried wheels (no network: DuckDB, and transformers/accelerate/
# lightning with their pure-Python dependencies, downloaded beforehand as docs/diagnosis.md says), then
# ranksight itself (--no-deps, editable), then runs benchmarks/diagnosis_corpus.py --device cuda. Three
# files land in $OUT: NAME.txt (the report), NAME.json (every run, the scores, the fix check) and
# NAME.runs.tgz (run folders, logs, truth, results.jsonl and device.json: unpack it anywhere and
# `diagnosis_corpus.py --rediagnose` that folder after a rule change).
#   bash benchmarks/gpu_corpus.sh          # 4 scripts x 7 faults once on every GPU: ~9 minutes on 2 H200s
#   CORPUS_ARGS="--faults none straggler --repeats 1" bash benchmarks/gpu_corpus.sh
# Environment: OUT (results, default ./gpu-corpus), WORK (run folders, default /tmp/gpu-corpus),
# GPUS (ranks, default: every GPU there is), CORPUS_ARGS (more corpus options, default --repeats 1),
# NAME (the results' file names, default corpus_gpu), WHEELS (wheel folders, default .whl),
# CORPUS_TIMEOUT (seconds the corpus may run before it is stopped and what it finished is packed; default none),
# RANKSIGHT_REPO (the ranksight checkout to install, default this script's repository).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=${RANKSIGHT_REPO:-$(dirname "$HERE")}
OUT=${OUT:-gpu-corpus}
W=${WORK:-/tmp/gpu-corpus}
NAME=${NAME:-corpus_gpu}
WHEELS=${WHEELS:-$REPO/.whl}
rm -rf "$W" && mkdir -p "$OUT" "$W" # a warm machine keeps /tmp: never mix two rounds' runs
OUT=$(cd "$OUT" && pwd)

python3 --version
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip list 2>/dev/null | grep -iE '^(torch|duckdb|transformers|accelerate|lightning|pyarrow|numpy) ' || true

pip_install() { python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"; }
links=()
for d in $WHEELS; do [ -d "$d" ] && links+=(--find-links "$d"); done
need=()
python3 -c 'import duckdb' 2>/dev/null || need+=(duckdb)
python3 -c 'import transformers, accelerate' 2>/dev/null || need+=(transformers accelerate)
python3 -c 'import lightning' 2>/dev/null || need+=(lightning)
if [ ${#need[@]} -gt 0 ]; then # an "externally managed" Python is asked again with its override
  echo "installing from ${WHEELS}: ${need[*]}"
  pip_install --no-index "${links[@]}" "${need[@]}" ||
    pip_install --break-system-packages --no-index "${links[@]}" "${need[@]}" ||
    echo "could not install ${need[*]}: the scripts that need them will be error rows"
fi
if ! pip_install --no-deps --no-build-isolation -e "$REPO" &&
  ! pip_install --break-system-packages --no-deps --no-build-isolation -e "$REPO"; then
  # ranksight in the layout it installs as, on PYTHONPATH (as benchmarks/gpu_round.sh does)
  PKG=$W/rs-pkg && mkdir -p "$PKG/ranksight" && cp -r "$REPO/ranksight/." "$PKG/ranksight/"
  for d in agent collectors rules dashboard integrations; do cp -r "$REPO/$d" "$PKG/ranksight/$d"; done
  export PYTHONPATH=$PKG${PYTHONPATH:+:$PYTHONPATH}
  echo "editable install failed: ranksight from $PKG"
fi
(cd "$W" && python3 -c 'import ranksight, torch; print("ranksight", ranksight.__file__, "torch", torch.__version__,
  "gpus", torch.cuda.device_count())')
GPUS=${GPUS:-$(nvidia-smi -L | grep -c '^GPU')}

# shellcheck disable=SC2086  # CORPUS_ARGS is a list of options
timeout "${CORPUS_TIMEOUT:-0}" python3 "$HERE/diagnosis_corpus.py" --device cuda --gpus "$GPUS" ${CORPUS_ARGS:---repeats 1} \
  --out "$W" --json "$OUT/$NAME.json" --text "$OUT/$NAME.txt"
rc=$?
(cd "$W" && tar czf "$OUT/$NAME.runs.tgz" runs logs truth results.jsonl device.json 2>/dev/null) || true
ls -la "$OUT"
exit $rc
