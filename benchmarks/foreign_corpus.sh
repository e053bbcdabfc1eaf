#!/usr/bin/env bash
# benchmarks/foreign_corpus.py --run on a bare GPU machine: ranksight on PYTHONPATH in the layout it installs
# as, DuckDB and TraceML from carried wheels (.whl/), the run folders packed into $OUT/NAME.runs.tgz for scoring
# elsewhere (`tar xzf` it, then `foreign_corpus.py --score DIR`). CORPUS_ARGS passes options (default:
# --repeats 3 --traceml); NAME names the pack (default foreign), OUT its folder, SRC the checkout (default .).
set -u
OUT=${OUT:-foreign-out}; W=${WORK:-/tmp/foreign}; NAME=${NAME:-foreign}
rm -rf "$W" && mkdir -p "$OUT" "$W" && OUT=$(cd "$OUT" && pwd)
SRC=${SRC:-.}; PKG=/tmp/rs-pkg && rm -rf $PKG && mkdir -p $PKG/ranksight && cp -r $SRC/ranksight/. $PKG/ranksight/
for d in agent collectors rules dashboard integrations; do cp -r $SRC/$d $PKG/ranksight/$d; done
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PKG:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -P -c 'import torch, duckdb, ranksight.agent; print("torch", torch.__version__, "duckdb", duckdb.__version__)'
# shellcheck disable=SC2086
python3 benchmarks/foreign_corpus.py --run --out "$W" ${CORPUS_ARGS:---repeats 3 --traceml}
(cd "$W" && tar czf "$OUT/$NAME.runs.tgz" runs logs traceml jobs.jsonl device.json 2>/dev/null)
ls -la "$OUT"
