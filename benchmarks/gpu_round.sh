#!/usr/bin/env bash
# One validation round on a GPU machine: the CUDA tests, ranksight import against the agent and the sampled
# shares. Work happens in $WORK; the JSON results and the run folders (packed in runs.tgz, for diagnosis
# elsewhere; the tests' own under pytest/) are copied to $OUT. ranksight is put on PYTHONPATH in the layout it
# installs as (no pip needed); DuckDB comes from .whl/ when the machine lacks it (see docs/gpu-validation.md).
# PARTS picks what runs (default all): tests import shares; ROUND_TESTS the test files; SHARES_FAULTS and
# SHARES_STEPS the demo jobs whose sampled shares are compared with every step's. Each part runs under its
# own `timeout` (PART_TIMEOUT, default 540 s) so the parts after a slow one still run.
set -u
PARTS=${PARTS:-tests import shares}
T=${PART_TIMEOUT:-540}
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
OUT=${OUT:-gpu-round}
W=${WORK:-/tmp/gpu-round}
rm -rf "$W" && mkdir -p "$OUT" "$W"  # a warm machine keeps /tmp: never mix two rounds' run folders
PKG=/tmp/rs-pkg
rm -rf $PKG && mkdir -p $PKG/ranksight && cp -r ranksight/. $PKG/ranksight/
for d in agent collectors rules dashboard integrations; do cp -r $d $PKG/ranksight/$d; done
if ! python3 -c 'import duckdb, ijson' 2>/dev/null && ls .whl/duckdb-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
    $(ls .whl/{duckdb,ijson}-*.whl 2>/dev/null)
  PKG=$PKG:/tmp/site
fi
export PYTHONPATH=$PKG${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The checkout's own ranksight/ folder (without agent/, collectors/...) would shadow the package from the
# current directory: tests run from a copy of tests/ elsewhere, one-liners with -P.
rm -rf "$W/t" && mkdir -p "$W/t" && cp -r tests benchmarks "$W/t/"  # some tests load benchmarks/ scripts
python3 -P -c 'import torch, ranksight.agent; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'
if has tests; then
  # --basetemp keeps each test's run folders under $W (packed into runs.tgz below), so a verdict a GPU
  # test disagreed with can be re-diagnosed here after the machine is gone.
  (cd "$W/t" && python3 -m pytest -q -p no:cacheprovider --basetemp "$W/pytest" ${ROUND_TESTS:-tests/test_gpu_cuda.py tests/test_import_gpu.py \
    tests/test_gpu_nccl_timing.py tests/test_measurement.py} 2>&1 | tee "$OUT/gpu_pytest.log" | tail -15)
fi
if has import; then
  # ranksight import against the agent on the same steps (pageable copies and a host sync)
  timeout "$T" python3 -P benchmarks/import_trace.py paired --device cuda --out "$W/imp" \
    --json "$OUT/gpu_import_paired.json" 2>&1 | tail -25
fi
if has shares; then
  # The demo's one-GPU jobs with events on every step, then the same rows read as if sampled at 1 in N
  # (docs/agent.md); from $W: the checkout's own ranksight/ folder would shadow the package.
  for fault in ${SHARES_FAULTS:-none input pageable host-sync}; do
    (cd "$W" && RANKSIGHT_GPU='{"events_every_steps": 1}' timeout "$T" python3 -m ranksight demo --fault "$fault" \
      --steps "${SHARES_STEPS:-500}" --ranks 1 --no-dashboard --run-dir shares/runs --run-id "sampled-$fault" | tail -2)
  done
  timeout "$T" python3 -P benchmarks/sampled_shares.py compare "$W"/shares/runs/* --every 4 8 16 \
    --json "$OUT/gpu_sampled_shares.json" 2>&1 | tail -30
fi
RUNS=$(cd "$W" && ls -d imp shares/runs pytest 2>/dev/null)
[ -n "$RUNS" ] && (cd "$W" && tar czf "$OUT/runs.tgz" $RUNS)
ls -la "$OUT"
