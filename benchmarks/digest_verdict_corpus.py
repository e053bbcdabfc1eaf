"""The verdict from step digests against the verdict from the rows, on real runs of the diagnosis corpus.

Why: ``diagnose()`` reads a run's per-rank medians from the digests' histograms (within 0.5 %) and its
per-step comparisons across ranks from per-file partials when the node spool published them
(``ranksight.format.verdict_digest``). This script takes finished run folders (``diagnosis_corpus.py --out``'s
``runs/*``, CPU or GPU), gives every step segment of a copy the digest a node spool's publisher would
write, and diagnoses the copy twice -- from the digests and with them set aside -- so that what the
approximation changes on jobs we did not plant is counted: findings that differ, and each feature's
largest relative difference. ``--store`` ingests half of each copy's step segments first and drops the
store's answers, as for a live run that ``ingest --every`` compacts: the verdict then reads the store's
copies of the parts with the pending files' digests. ``--grow`` diagnoses each copy with the later half of
its step segments held back, then with all of them, in one process: the second verdict takes the parts that
process kept merged for the first half and merges in the other half's alone (``collectors/_digest_fold.py``),
as a live dashboard's next diagnosis does.

    python benchmarks/digest_verdict_corpus.py CPU_CORPUS_OUT GPU_CORPUS_RUNS --json out.json
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import shutil
import sys
import tempfile

from _harness import cli, write_results


def run_folders(roots: list[str]) -> list[str]:
    """Run folders (a ``ranks/`` and a ``steps/`` folder) under each root's ``runs/`` (or the root itself)."""
    found = []
    for root in roots:
        for path in sorted(glob.glob(os.path.join(glob.escape(root), "runs", "*"))) or [root]:
            if os.path.isdir(os.path.join(path, "ranks")) and os.path.isdir(os.path.join(path, "steps")):
                found.append(path)
    return found


def _write_durably(directory: str, name: str, write) -> None:
    tmp = os.path.join(directory, f".{name}.partial")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, os.path.join(directory, name))


def digest_every_segment(run: str) -> int:
    """Write the node spool's digest, with the file's card, beside every step segment of ``run``; the segments
    digested."""
    import pyarrow.parquet as pq

    from ranksight.collectors import segment_files
    from ranksight.format.digest_file import write_digest

    steps = os.path.join(run, "steps")
    files = segment_files(run, "steps")
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        write_digest(pq.read_table(path), steps, os.path.basename(path), _write_durably, data)
    return len(files)


def verdict_of(run: str) -> tuple[list, dict, bool]:
    """(findings as (rule, ranks, severity), features per rank with the breakdown's figures under
    ``breakdown.``, whether the verdict read digests)."""
    from ranksight.collectors import open_run
    from ranksight.collectors._digest_source import verdict_digests
    from ranksight.collectors._run import run_features
    from ranksight.rules import diagnose

    con = open_run(run, follow_spool=False)
    used = verdict_digests(con, "medians", "steps") is not None
    con.close()
    verdict = diagnose(run)
    findings = [(f["rule"], tuple(f["ranks"]), f["severity"]) for f in verdict["findings"]]
    features = run_features(run)
    for row in verdict.get("breakdown", {}).get("ranks", []):
        features.setdefault(row["rank"], {}).update({f"breakdown.{k}": v for k, v in row.items()})
    return findings, features, used


@contextlib.contextmanager
def later_half_held(run: str):
    """The later half of ``run``'s step segments moved aside while the block runs; yields their names."""
    from ranksight.collectors import segment_files

    files = sorted(segment_files(run, "steps"))
    held, aside = files[len(files) // 2 :], run + "-held"
    os.makedirs(aside)
    for path in held:
        os.rename(path, os.path.join(aside, os.path.basename(path)))
    try:
        yield {os.path.basename(p) for p in held}
    finally:
        for path in held:
            os.rename(os.path.join(aside, os.path.basename(path)), path)
        os.rmdir(aside)


def ingest_half(run: str) -> None:
    """Ingest ``run`` with the later half of its step segments held back (pending beside the store after),
    and drop the store's answers: a live run that ``ingest --every`` compacts, judged from the store's
    verdict parts and the pending files' digests."""
    import duckdb

    from ranksight.collectors import ingest

    with later_half_held(run):
        ingest(run)
    with duckdb.connect(os.path.join(run, "store.duckdb")) as con:
        con.execute("DROP TABLE IF EXISTS _answers")


def diagnose_half_first(run: str) -> set[str]:
    """Diagnose ``run`` with the later half of its step segments held back, then put them back; their names."""
    from ranksight.rules import diagnose

    with later_half_held(run) as held:
        diagnose(run)
    return held


@contextlib.contextmanager
def digests_read():
    """Yield a list that collects the names of the digest files the verdict's parts are read from meanwhile."""
    from ranksight.collectors import _digest_fold

    names: list[str] = []
    original = _digest_fold.read_digest_parts

    def recorded(paths, parts, with_file=False):
        names.extend(os.path.basename(p) for p in paths)
        return original(paths, parts, with_file)

    _digest_fold.read_digest_parts = recorded
    try:
        yield names
    finally:
        _digest_fold.read_digest_parts = original


def _rows_only(run: str) -> None:
    """Leave ``run``'s verdict nothing but rows: spool digests set aside, the store's verdict parts dropped."""
    import duckdb

    from ranksight.collectors._tables import VERDICT_PART_TABLES
    from ranksight.format.digest import DIGEST_DIR

    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    if os.path.exists(os.path.join(run, "store.duckdb")):
        con = duckdb.connect(os.path.join(run, "store.duckdb"))
        for table in VERDICT_PART_TABLES.values():
            con.execute(f"DROP TABLE IF EXISTS {table}")
        con.close()


def compare(run: str, workdir: str, store: bool = False, grow: bool = False) -> dict:
    copy = os.path.join(workdir, os.path.basename(run))
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("store.duckdb*", ".digests"))
    segments = digest_every_segment(copy)
    if store:
        ingest_half(copy)
    held = diagnose_half_first(copy) if grow else set()
    with digests_read() as read:
        digested, feats_d, used = verdict_of(copy)
    _rows_only(copy)
    rows, feats_r, _ = verdict_of(copy)
    shutil.rmtree(copy)
    worst: dict[str, float] = {}
    for rank, f in feats_r.items():
        for key, value in f.items():
            other = feats_d.get(rank, {}).get(key)
            if isinstance(value, float) and isinstance(other, float) and value != other:
                rel = abs(other - value) / max(abs(value), 1e-12)
                if math.isfinite(rel) and rel > worst.get(key, 0.0):
                    worst[key] = rel
            elif value != other and not (isinstance(value, float) and isinstance(other, float)):
                worst[key] = math.inf
    return {
        "run": os.path.basename(run),
        "segments": segments,
        "digests_used": used,
        "findings_same": digested == rows,
        # --grow: the digests read for the whole run's verdict are the held-back half's alone
        "read_only_the_added": (set(read) == held) if grow else None,
        "first_same": digested[:1] == rows[:1],
        "from_digests": digested,
        "from_rows": rows,
        "largest_relative_difference": {k: v for k, v in sorted(worst.items()) if v > 1e-9},
    }


def main() -> int:
    parser = cli(__doc__)
    parser.add_argument("roots", nargs="+", help="diagnosis_corpus.py --out folders, or run folders")
    store = "ingest half of each copy's step segments first (a live run's store beside pending files)"
    parser.add_argument("--store", action="store_true", help=store)
    grow = "diagnose each copy with half its step segments first, then all (a live process)"
    parser.add_argument("--grow", action="store_true", help=grow)
    args = parser.parse_args()
    runs = run_folders(args.roots)
    if not runs:
        print(f"no run folders under {', '.join(args.roots)}", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="digest-verdict-") as workdir:
        for run in runs:
            try:
                results.append(compare(run, workdir, args.store, args.grow))
            except Exception as exc:  # noqa: BLE001 -- a run that cannot be diagnosed is reported, not fatal
                results.append({"run": os.path.basename(run), "error": str(exc).splitlines()[0]})
    done = [r for r in results if "error" not in r]
    used = [r for r in done if r["digests_used"]]
    worst: dict[str, float] = {}
    for r in used:
        for k, v in r["largest_relative_difference"].items():
            worst[k] = max(worst.get(k, 0.0), v)
    summary = {
        "runs": len(results),
        "diagnosed": len(done),
        "verdict_read_digests": len(used),
        "findings_same": sum(r["findings_same"] for r in used),
        "first_finding_same": sum(r["first_same"] for r in used),
        "read_only_the_added": sum(bool(r["read_only_the_added"]) for r in used) if args.grow else None,
        "largest_relative_difference": dict(sorted(worst.items(), key=lambda kv: -kv[1])),
        "errors": [r for r in results if "error" in r],
    }
    print(
        f"{summary['verdict_read_digests']} of {len(results)} runs diagnosed from digests: findings identical "
        f"in {summary['findings_same']}, first finding identical in {summary['first_finding_same']}"
    )
    if args.grow:
        print(f"  the whole run's verdict read only the added half's digests in {summary['read_only_the_added']}")
    for k, v in summary["largest_relative_difference"].items():
        print(f"  {k}: largest relative difference {v:.4%}")
    for r in used:
        if not r["findings_same"]:
            print(f"  {r['run']}: digests {r['from_digests']} / rows {r['from_rows']}")
    if args.json:
        write_results(args.json, {"summary": summary, "runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
