"""Every benchmark command the docs give runs a script that is there and takes the options it is given.

A figure is one command away only while that command still works: a script renamed, merged or removed, or
an option dropped, would leave a doc pointing at nothing. A command for a script that is gone names the
commit it is at (``... at commit abc1234``, ``in a checkout of commit abc1234``).
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), BENCH / "README.md"]

# A command in backticks (it may wrap across lines): `python benchmarks/NAME.py ...`, `python -m benchmarks NAME
# ...`, `torchrun ... benchmarks/NAME.py ...`, `bash benchmarks/NAME.sh`.
COMMAND = re.compile(
    r"`((?:python3? (?:-P )?|torchrun [^`]*?)benchmarks/([a-z_]+)\.(?:py|sh)[^`]*"
    r"|python -m benchmarks ([a-z_]+)\b[^`]*|(?:\w+=(?:\"[^\"]*\"|\S+) )*bash benchmarks/([a-z_]+)\.sh[^`]*)`"
)
AT_COMMIT = re.compile(r"^[^.;|]{0,60}?\b(?:at|checkout of) commit [0-9a-f]{7}")


def doc_commands() -> list[tuple[str, str, str]]:
    """(where, script file name, command) for every benchmark command in the docs."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for match in COMMAND.finditer(text):
            command = " ".join(match.group(1).split())
            if AT_COMMIT.match(text[match.end() : match.end() + 120]):
                continue  # a removed script, named with the commit that has it
            name = match.group(2) or match.group(3) or match.group(4)
            suffix = ".sh" if match.group(4) or f"{name}.sh" in command else ".py"
            line = text.count("\n", 0, match.start()) + 1
            out.append((f"{path.relative_to(ROOT)}:{line}", name + suffix, command))
    return out


def test_the_docs_give_benchmark_commands():
    assert len(doc_commands()) > 50


@pytest.mark.parametrize("where, script, command", doc_commands(), ids=lambda v: v if ":" in str(v) else "")
def test_a_doc_command_runs_a_script_that_takes_its_options(where, script, command):
    path = BENCH / script
    assert path.exists(), f"{where}: {command!r} names {script}, which benchmarks/ does not hold"
    source = path.read_text()
    if "cli(__doc__" in source:  # the options every benchmark takes come from the harness
        source += (BENCH / "_harness.py").read_text()
    for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", command.split(script, 1)[-1]):
        assert f'"{option}"' in source or f"'{option}'" in source, f"{where}: {script} takes no {option}"


def test_every_benchmark_is_listed_with_what_it_measures():
    listed = runpy.run_path(str(BENCH / "__main__.py"), run_name="benchmarks_list")["benchmarks"]()
    scripts = {p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert set(listed) == scripts
    assert all(line for line in listed.values()), [name for name, line in listed.items() if not line]


def test_every_headline_figure_names_its_command_and_a_results_file_that_is_kept():
    section = (ROOT / "docs" / "benchmarks.md").read_text().split("## Every headline figure")[1].split("\n## ")[0]
    table = [line.split(" | ") for line in section.splitlines()]
    rows = [cells for cells in table if len(cells) == 3 and cells[0].startswith("| ") and "---" not in cells[0]][1:]
    assert len(rows) > 20
    for figure, command, files in rows:
        assert COMMAND.search(command), f"{figure}: no benchmark command in {command!r}"
        for name in re.findall(r"`(\w[\w.-]*\.(?:json|txt|log|tgz))`", files):
            assert (BENCH / "results" / name).exists(), f"{figure}: {name} is not in benchmarks/results/"
