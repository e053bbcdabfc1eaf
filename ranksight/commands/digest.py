"""``ranksight digest RUN``: write this version's step digests, with their files' cards, where a spool lacks them.

A spool an older agent published is read from its rows, or has its footers read one by one, until its step
files carry digests and cards of this version (reading the rows is about five times slower at 10,000
ranks). Safe while the job runs.
"""

from __future__ import annotations

import time

from ._errors import UserError


def add_parser(sub):
    p = sub.add_parser(
        "digest",
        help="write the step digests (and their files' cards) a spool from an older agent lacks",
        description="Write this version's digest, with its file's card, beside every step file of RUN that lacks one.",
    )
    p.add_argument("run_dir", help="the run folder (or a folder of runs: its latest)")
    return p


def run(args) -> int:
    from ranksight.collectors import RunDirError, digest_spool

    start = time.perf_counter()
    try:
        done = digest_spool(args.run_dir)
    except RunDirError as exc:
        raise UserError(str(exc)) from None
    print(
        f"{args.run_dir}: wrote {done.written} digests, added {done.carded} cards, {done.kept} step files had both"
        f" ({time.perf_counter() - start:.1f} s)"
    )
    for skipped in done.skipped:
        print(f"left out (does not read): {skipped}")
    return 0
