"""``digest_spool``: this version's digests for a spool's step files that lack one.

Why: the summary relation takes a step file's verdict parts from its digest under this code's definition
(``ranksight.format.digest``) and scans the rows of a file without one, several times slower. A spool an older
agent published (its digests of another definition, or none) is read from its rows until something writes what
a publisher of this version would have written. This does, beside what is there: a digest of another definition
is left as it is, one of this definition that does not read is made again from the file's rows.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field

from ranksight.format.digest import DIGEST_DIR, digest_keys
from ranksight.format.digest_file import DigestError, read_digest_parts, write_digest
from ranksight.format.files import atomic_write_bytes

from ._rundir import SkippedFile, check_run_dir
from ._segment_checks import scan_segments


@dataclass
class SpoolDigests:
    """What ``digest_spool`` did: digests written (for files without one, or whose digest did not read), files
    whose digest was there, and the step files that do not read (left out, as readers leave them)."""

    written: int = 0
    kept: int = 0
    skipped: list[SkippedFile] = field(default_factory=list)


def digest_spool(run_path: str) -> SpoolDigests:
    """Write this version's digest for every readable step file of the spool at ``run_path`` that lacks one (or
    whose digest does not read). Safe beside a live job: a published step file never changes, and each digest is
    put in place whole (by rename)."""
    import pyarrow.parquet as pq

    check_run_dir(run_path)
    steps_dir = os.path.join(run_path, "steps")
    files, skipped = scan_segments(run_path, "steps")
    out = SpoolDigests(skipped=list(skipped))
    keys = digest_keys(steps_dir)
    for path in files:
        name = os.path.basename(path)
        digests = [d for key in keys if os.path.exists(d := os.path.join(steps_dir, DIGEST_DIR, key, name))]
        if digests and _reads(digests):
            out.kept += 1
            continue
        write_digest(pq.read_table(path), steps_dir, name, _write_durably)
        out.written += 1
    return out


def _reads(digests: list[str]) -> bool:
    try:
        read_digest_parts(digests, ("sums", "medians", "steps"), threads=False)
    except DigestError:
        return False
    return True


def _write_durably(directory: str, name: str, write) -> None:
    """``write_digest``'s writer (``write(file)``): the digest in place whole or not at all."""
    buffer = io.BytesIO()
    write(buffer)
    atomic_write_bytes(os.path.join(directory, name), buffer.getvalue())
