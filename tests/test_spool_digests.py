"""``ranksight digest RUN``: a spool an older agent published -- digests of another definition, or none, or
without cards -- gets this version's digests with their files' cards, and is then read as a spool this
version published is (``ranksight.collectors._spool_digests``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ranksight.collectors import _segment_checks
from ranksight.format.digest import DIGEST_DIR, digest_keys
from ranksight.format.digest_file import CARD_KEY, file_card, read_card
from ranksight.rules import diagnose

from .test_digests import _published_run, _step_files
from .test_file_cards import _footer_readings, fresh_reader  # noqa: F401 -- the fixture, by its name


def _digest(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ranksight.cli", "digest", *args], capture_output=True, text=True)


def _current(run: str) -> str:
    steps = os.path.join(run, "steps")
    (key,) = digest_keys(steps)
    return os.path.join(steps, DIGEST_DIR, key)


def _from_rows(run: str, monkeypatch) -> dict:
    """The verdict of a fresh reader with every digest set aside (the rows read)."""
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    try:
        monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
        return diagnose(run)
    finally:
        os.rename(digests + "-aside", digests)


def _without_card(digest: str) -> None:
    """The digest as a publisher before cards wrote it: its header without the card, its parts unchanged."""
    with open(digest, "rb") as f:
        data = f.read()
    length = int.from_bytes(data[8:12], "little")
    header = json.loads(data[12 : 12 + length])
    header.pop(CARD_KEY)
    body = json.dumps(header).encode()
    with open(digest, "wb") as f:
        f.write(data[:8] + len(body).to_bytes(4, "little") + body + data[12 + length :])


@pytest.mark.usefixtures("fresh_reader")
def test_a_spool_of_another_digest_definition_gets_this_versions_digests_and_reads_as_one(tmp_path, monkeypatch):
    run = _published_run(tmp_path, publishes=4)
    current = _current(run)
    older = os.path.join(os.path.dirname(current), "c2-an-older-definition")
    os.rename(current, older)  # as an older agent's digests: a key this version never reads
    kept = {n: open(os.path.join(older, n), "rb").read() for n in os.listdir(older)}
    rows = _from_rows(run, monkeypatch)
    done = _digest([run])
    assert done.returncode == 0, done.stderr
    assert "wrote 4 digests, added 0 cards, 0 step files had both" in done.stdout
    for name in _step_files(run):
        with open(os.path.join(run, "steps", name), "rb") as f:
            assert read_card(os.path.join(current, name)) == file_card(f.read())
    assert {n: open(os.path.join(older, n), "rb").read() for n in os.listdir(older)} == kept  # left as it was
    calls = _footer_readings(monkeypatch)
    monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
    verdict = diagnose(run)
    assert calls == []  # every file vouched for by its new card, the digests read
    assert [(f["rule"], f["ranks"]) for f in verdict["findings"]] == [(f["rule"], f["ranks"]) for f in rows["findings"]]
    again = _digest([run])
    assert "wrote 0 digests, added 0 cards, 4 step files had both" in again.stdout


@pytest.mark.usefixtures("fresh_reader")
def test_digests_without_cards_get_their_cards_and_keep_their_parts(tmp_path, monkeypatch):
    run = _published_run(tmp_path, publishes=3)
    current = _current(run)
    names = _step_files(run)
    for name in names:
        _without_card(os.path.join(current, name))
    parts = {}
    for name in names:
        with open(os.path.join(current, name), "rb") as f:
            data = f.read()
        parts[name] = data[12 + int.from_bytes(data[8:12], "little") :]
    before = _from_rows(run, monkeypatch)
    done = _digest([run])
    assert "wrote 0 digests, added 3 cards, 0 step files had both" in done.stdout, done.stdout + done.stderr
    for name in names:
        with open(os.path.join(current, name), "rb") as f:
            data = f.read()
        assert data[12 + int.from_bytes(data[8:12], "little") :] == parts[name]  # the parts byte for byte
        with open(os.path.join(run, "steps", name), "rb") as f:
            assert read_card(os.path.join(current, name)) == file_card(f.read())
    monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
    assert diagnose(run)["findings"] == before["findings"]


@pytest.mark.usefixtures("fresh_reader")
def test_a_damaged_digest_is_made_again_and_a_step_file_that_does_not_read_is_left_out(tmp_path, monkeypatch):
    run = _published_run(tmp_path, publishes=3)
    current = _current(run)
    names = _step_files(run)
    with open(os.path.join(current, names[0]), "wb") as f:
        f.write(b"RSDIGEST\xff\xff")  # cut short in its header
    with open(os.path.join(run, "steps", "nodeZ_m0-broken.parquet"), "wb") as f:
        f.write(b"not parquet at all")
    before = _from_rows(run, monkeypatch)
    done = _digest([run])
    assert done.returncode == 0, done.stderr
    assert "wrote 0 digests, added 1 cards, 2 step files had both" in done.stdout
    assert "left out (does not read):" in done.stdout and "nodeZ_m0-broken.parquet" in done.stdout
    with open(os.path.join(run, "steps", names[0]), "rb") as f:
        assert read_card(os.path.join(current, names[0])) == file_card(f.read())
    monkeypatch.setattr(_segment_checks, "_verdicts", _segment_checks._SegmentVerdicts())
    assert diagnose(run)["findings"] == before["findings"]


def test_a_path_that_is_not_a_run_is_one_line_and_exit_2(tmp_path):
    done = _digest([str(tmp_path / "nowhere")])
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "nowhere" in done.stderr
