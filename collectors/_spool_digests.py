"""``digest_spool``: this version's digests for a spool's step files that lack them, each with its file's card.

Why: a reader takes a step file's digest only under its own definition's key (``ranksight.format.digest``), and
vouches for the file without DuckDB reading its footer only by a card (``_file_cards``). A spool an older agent
published -- its digests of another definition, or none, or without cards -- is read from its rows (at
10,000 ranks about five times slower: cpu_scale_history.md "Scale v5") or has its footers read by DuckDB, until
something writes what a publisher of this version would have written. This does, beside what is there: a
digest of another definition is left as it is (no reader of this version reads it), one of this definition
without a card gets its card in its header (its parts byte for byte), and a file without one gets one.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field

from ranksight.format.digest import DIGEST_DIR, digest_keys
from ranksight.format.digest_file import file_card, read_card, with_card, write_digest
from ranksight.format.files import atomic_write_bytes

from ._rundir import SkippedFile, check_run_dir
from ._segment_checks import scan_segments


@dataclass
class SpoolDigests:
    """What ``digest_spool`` did: digests written, files whose digests got their card (one that did not read
    made again from the rows), files left as they were (their digest and card already there), and the step
    files that do not read (left out, as readers leave them)."""

    written: int = 0
    carded: int = 0
    kept: int = 0
    skipped: list[SkippedFile] = field(default_factory=list)


def digest_spool(run_path: str) -> SpoolDigests:
    """Write this version's digest, with its file's card, for every readable step file of the spool at
    ``run_path`` that lacks one; add the card to each digest of this version that lacks it. Safe beside a
    live job: a published step file never changes, and each digest is put in place whole (by rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_run_dir(run_path)
    steps_dir = os.path.join(run_path, "steps")
    files, skipped = scan_segments(run_path, "steps")
    out = SpoolDigests(skipped=list(skipped))
    keys = digest_keys(steps_dir)
    for path in files:
        name = os.path.basename(path)
        digests = [d for key in keys if os.path.exists(d := os.path.join(steps_dir, DIGEST_DIR, key, name))]
        if digests and all(read_card(d) is not None for d in digests):
            out.kept += 1
            continue
        with open(path, "rb") as f:
            data = f.read()
        if not digests:
            write_digest(pq.read_table(pa.BufferReader(data)), steps_dir, name, _write_durably, data)
            out.written += 1
            continue
        card = file_card(data)
        for digest in digests:
            if read_card(digest) is None:
                with open(digest, "rb") as f:
                    held = f.read()
                try:
                    atomic_write_bytes(digest, with_card(held, card))
                except ValueError:  # a digest that does not read: made again from the file's rows, as a publisher does
                    write_digest(pq.read_table(pa.BufferReader(data)), steps_dir, name, _write_durably, data)
        out.carded += 1
    return out


def _write_durably(directory: str, name: str, write) -> None:
    """``write_digest``'s writer (``write(file)``): the digest in place whole or not at all."""
    buffer = io.BytesIO()
    write(buffer)
    atomic_write_bytes(os.path.join(directory, name), buffer.getvalue())
