"""Cost against fix: did the step time a fix gave back match the cost its finding stated?

Reads the results of ``diagnosis_corpus.py --check-fix`` (its ``--json``, or the ``--rediagnose`` of its
kept runs after a rule change) and prints, per (script, fault) that has both the faulty runs and the fixed
reruns: how often the planted fault's rule was named first, the cost its finding stated (``cost_share``,
the median over the runs that named it; fragmentation states none: 0) and the speedup it claims, the step
time per sample before and after the fix on the script's own clock (and on ranksight's), the gain
``1 - after / before``, and whether the two lie within 5 pp of the step.

    python benchmarks/diagnosis_corpus.py --device cuda --gpus 1 --check-fix --json corpus.json ...
    python benchmarks/fix_check.py corpus.json [more.json ...] [--json fix_check.json]

Several files are pooled by (script, fault): the faulty runs of one device call with the fixed runs of
another compare across machines (noisier); each row says how many runs of each it used.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from dataclasses import fields

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _harness import write_results  # noqa: E402


def _corpus():
    spec = importlib.util.spec_from_file_location("diagnosis_corpus", os.path.join(HERE, "diagnosis_corpus.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_runs(paths: list, corpus) -> list:
    known = {f.name for f in fields(corpus.RunResult)}
    runs = []
    for path in paths:
        with open(path) as fh:
            doc = json.load(fh)
        runs += [corpus.RunResult(**{k: v for k, v in r.items() if k in known}) for r in doc.get("runs", [])]
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="diagnosis_corpus.py --json files (or their --rediagnose)")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    corpus = _corpus()
    rows = corpus.fix_check(load_runs(args.results, corpus))
    if not rows:
        print("no (script, fault) has both faulty and fixed runs (run the corpus with --check-fix)")
        return 1
    print("\n".join(corpus.fix_check_text(rows)))
    within = sum(r["within"] for r in rows)
    print(f"\nwithin {corpus.FIX_TOLERANCE:.0%} of the step: {within}/{len(rows)}")
    if args.json:
        write_results(args.json, {"sources": args.results, "tolerance": corpus.FIX_TOLERANCE, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
