"""Step files' cards: the node spool's publisher records each step file's size, last bytes, rows and columns in
the file's digest, and a fresh reader judges the files their cards vouch for without DuckDB reading every
footer (``ranksight.collectors._file_cards``). The verdict, the files read and the files left out are those of
the footers; a file that is not the one its card describes, or a card that lies, is judged from its footer."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from ranksight.collectors import _file_cards, _segment_checks, open_run
from ranksight.format.digest import chunk_steps_for, digest_paths
from ranksight.format.digest_file import footer_hash, read_card, schema_hash, with_card
from ranksight.rules import diagnose

from .test_digests import RANKS, WORLD, _published_run, _step_files


@pytest.fixture
def fresh_reader(monkeypatch):
    """A reader process that has judged no footer yet, judging step files as a 10,000-rank spool's are (one
    footer per schema once 64 files are new; here from 2)."""
    monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
    monkeypatch.setattr(_segment_checks, "_BATCH_FROM", 2)


def _digests(run: str) -> dict[str, str]:
    return digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run))


def _footer_readings(monkeypatch) -> list[str]:
    """Each time DuckDB is asked to read many footers (the schemas' check)."""
    calls: list[str] = []
    judge = _segment_checks.judge_by_schema

    def judged(folder, names, *args, **kwargs):
        calls.append(f"schemas of {len(names)}")
        return judge(folder, names, *args, **kwargs)

    monkeypatch.setattr(_segment_checks, "judge_by_schema", judged)
    return calls


def _without_cards(run: str, monkeypatch) -> dict:
    """The verdict of a fresh reader that finds no card (as of a spool an older agent published)."""
    monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
    with monkeypatch.context() as m:
        m.setattr(_file_cards, "read_card", lambda path: None)
        return diagnose(run)


def _steps_schema(nullable: bool = False):
    """The step files' Arrow schema as pyarrow reads it, its identity columns NULL-able with ``nullable``."""
    import pyarrow as pa

    from ranksight.format.schema import arrow_schema

    schema = arrow_schema("steps")
    return pa.schema([f.with_nullable(True) for f in schema]) if nullable else schema


def _rewrite_card(digest: str, change) -> None:
    """The digest at ``digest`` with its header's card changed by ``change(card)`` (the parts as they were)."""
    card = read_card(digest)
    with open(digest, "rb") as f:
        data = f.read()
    with open(digest, "wb") as f:
        f.write(with_card(data, change(card)))


def test_a_published_step_file_carries_its_card(tmp_path):
    run = _published_run(tmp_path, publishes=2)
    for name, digest in _digests(run).items():
        path = os.path.join(run, "steps", name)
        card = read_card(digest)
        with open(path, "rb") as f:
            data = f.read()
        parquet = pq.ParquetFile(path)
        assert card["size"] == len(data) == os.path.getsize(path)
        footer = int.from_bytes(data[-8:-4], "little") + 8
        assert card["footer"] == [footer, footer_hash(data[-footer:])]
        assert card["rows"] == parquet.metadata.num_rows == 40 * len(RANKS)
        assert card["schema"] == schema_hash(parquet.schema_arrow)


def test_a_fresh_reader_of_carded_files_reads_no_footer_with_duckdb_and_gives_the_same_verdict(
    tmp_path, monkeypatch, fresh_reader
):
    run = _published_run(tmp_path, publishes=4)
    before = _without_cards(run, monkeypatch)
    calls = _footer_readings(monkeypatch)
    monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
    verdict = diagnose(run)
    assert calls == []  # every step file vouched for by its card
    assert verdict == before
    paths = [os.path.join(run, "steps", n) for n in _step_files(run)]
    assert _segment_checks.segment_rows(paths) == 4 * 40 * len(RANKS)


def test_a_file_that_is_not_the_one_its_card_describes_is_judged_from_its_footer(tmp_path, monkeypatch, fresh_reader):
    run = _published_run(tmp_path, publishes=4)
    names = _step_files(run)
    grown, edited = (os.path.join(run, "steps", n) for n in names[:2])
    with open(grown, "ab") as f:  # bytes after the footer: not its card's size, and no longer Parquet's framing
        f.write(b"x" * 10)
    with open(edited, "r+b") as f:  # the writer's name in the footer changed: same size, another footer
        data = f.read()
        at = data.rindex(b"parquet-cpp")
        f.seek(at)
        f.write(b"PARQUET-CPP")
    before = _without_cards(run, monkeypatch)
    monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
    calls = _footer_readings(monkeypatch)
    with open_run(run, follow_spool=False) as reading:
        skipped = [(os.path.basename(s.path), s.reason) for s in reading.skipped]
    assert skipped == [(names[0], f"truncated: no Parquet footer at the end of its {os.path.getsize(grown):,} bytes")]
    assert calls == ["schemas of 1"]  # the edited file alone: the grown one failed its framing first
    assert _segment_checks.segment_rows([edited]) is None and _segment_checks.segment_rows([grown]) is None
    others = [os.path.join(run, "steps", n) for n in names[2:]]
    assert _segment_checks.segment_rows(others) == len(others) * 40 * len(RANKS)
    monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
    assert diagnose(run) == before


@pytest.mark.parametrize(
    "change",
    [
        lambda card: {**card, "schema": schema_hash(_steps_schema().remove(0))},  # a column the file has, left out
        lambda card: {**card, "schema": schema_hash(_steps_schema(nullable=True))},  # rank may be NULL
        lambda card: {**card, "rows": "many"},
        lambda card: {**card, "footer": [card["footer"][0], "0" * 32]},
        lambda card: ["not", "a", "card"],
    ],
    ids=["missing-column", "nullable-identity", "rows-not-a-number", "another-footer", "not-an-object"],
)
def test_a_card_that_does_not_say_what_the_footer_says_vouches_for_nothing(tmp_path, monkeypatch, fresh_reader, change):
    run = _published_run(tmp_path, publishes=4)
    for digest in _digests(run).values():
        _rewrite_card(digest, change)
    before = _without_cards(run, monkeypatch)
    monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
    calls = _footer_readings(monkeypatch)
    verdict = diagnose(run)
    assert verdict == before
    assert _segment_checks.segment_rows([os.path.join(run, "steps", n) for n in _step_files(run)]) is None
    assert calls  # judged from the footers, as without cards
