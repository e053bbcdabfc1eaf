"""Step files vouched for by their cards: what the node spool's publisher recorded about each file it wrote.

Why: a fresh reader checks every segment's footer before DuckDB reads it (``_segment_checks``), and the
verdict read the rows the footers count. At 10,000 ranks that is 1,250 node
files whose footers DuckDB parses twice, 0.13 s and 0.07 s: a fifth of a first verdict (cpu_scale_history.md,
"Scale v6"). The publisher holds the file's bytes when it writes the file's digest, so it records in the
digest's header the file's size, a hash of its footer's bytes, its rows and a hash of its columns
(``digest_file.file_card``). A file of its card's size whose footer hashes as the card says holds the very
footer the card was made from (one read of the footer, where DuckDB parsed it), so it says what the card
says.

The check stays the same check: one file of each distinct card is judged from its own footer, as before,
and vouches for the others only where that file's footer says exactly what its card says; every file
without a card that matches (an older agent's digest, a file changed since, a card that lies) is judged from
its footer as before. Nothing here reads the parts of a digest: only its header.
"""

from __future__ import annotations

import os
from typing import Callable

from ranksight.format.digest import digest_keys
from ranksight.format.digest_file import footer_hash, read_card, schema_hash

Verdict = tuple  # (problem or None, (name, Arrow type) columns) as ``_segment_checks`` keeps it


def vouched(
    folder: str,
    listed: dict[str, tuple[int, int]],
    judge: Callable[[str], Verdict | None],
    needs_each: Callable[[str], bool],
) -> tuple[dict[str, Verdict | None], dict[str, int]]:
    """(verdicts, rows) of the files of ``listed`` (name -> (size, mtime_ns) in the listing) in the step
    folder ``folder`` that their cards vouch for: each the verdict of a file with the same card judged from
    its footer (``judge(name)``; ``needs_each(name)``: whether that verdict read its data, so it holds for
    that file alone), and the rows each such file holds by its card. The files left out are for the caller
    to judge from their footers."""
    cards = _matching_cards(folder, {name: size for name, (size, _) in listed.items()})
    groups: dict[str, list[str]] = {}
    for name, card in cards.items():
        groups.setdefault(card["schema"], []).append(name)
    out: dict[str, Verdict | None] = {}
    rows: dict[str, int] = {}
    for schema, members in groups.items():
        first = members[0]
        out[first] = verdict = judge(first)
        if verdict is None or verdict[0] is not None or needs_each(first):
            continue
        if _real_schema(os.path.join(folder, first)) != schema:
            continue  # its footer does not say what its card says: the others are judged from theirs
        out.update((name, verdict) for name in members[1:])
        rows.update((name, cards[name]["rows"]) for name in members)
    return out, rows


def _matching_cards(folder: str, sizes: dict[str, int]) -> dict[str, dict]:
    """name -> card, for the files whose digest (of this code's definitions) carries a card of their size and
    footer."""
    found: dict[str, dict] = {}
    for key in digest_keys(folder):
        digests = os.path.join(folder, ".digests", key)
        try:
            present = set(os.listdir(digests))
        except OSError:
            continue
        for name in (sizes.keys() & present) - found.keys():
            card = read_card(os.path.join(digests, name))
            if _well_formed(card) and card["size"] == sizes[name] and _holds_its_footer(folder, name, card):
                found[name] = card
    return found


def _well_formed(card) -> bool:
    if not isinstance(card, dict):
        return False
    footer = card.get("footer")
    return (
        type(card.get("size")) is int
        and type(card.get("rows")) is int
        and card["rows"] >= 0
        and isinstance(footer, list)
        and len(footer) == 2
        and type(footer[0]) is int
        and 12 <= footer[0] <= card["size"]
        and isinstance(footer[1], str)
        and isinstance(card.get("schema"), str)
    )


def _holds_its_footer(folder: str, name: str, card: dict) -> bool:
    """Whether the file starts as Parquet does and ends with the footer its card describes, byte for byte
    (one read of the footer, as DuckDB's or pyarrow's check reads it)."""
    length, expected = card["footer"]
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
    except OSError:
        return False
    try:
        return os.pread(fd, 4, 0) == _MAGIC and footer_hash(os.pread(fd, length, card["size"] - length)) == expected
    except OSError:
        return False
    finally:
        os.close(fd)


_MAGIC = b"PAR1"


def _real_schema(path: str) -> str | None:
    """The hash of the columns of the file's own footer, as its card would give it; None where it does not read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as parquet:
            return schema_hash(parquet.schema_arrow)
    except (OSError, pa.ArrowException, ValueError):
        return None
