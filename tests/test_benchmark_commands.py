"""Every benchmark command the docs give runs a script that is there and takes the options it is given.

A figure is one command away only while that command still works: a script renamed, merged or removed, or
an option dropped, would leave a doc pointing at nothing. A command for a script that is gone names the
commit it is at (``... at commit abc1234``, ``in a checkout of commit abc1234``) or checks that commit out
and runs the script from there (``git worktree add /tmp/rs abc1234 && python /tmp/rs/benchmarks/NAME.py ...``);
the latter is checked against the commit where the clone has it.
"""

from __future__ import annotations

import re
import runpy
import subprocess
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
# A retired script run from the last commit that has it, checked out beside this one.
RETIRED = re.compile(
    r"`git worktree add (\S+) ([0-9a-f]{7,40}) && (?:python3? (?:-P )?|torchrun [^`]*?|bash )\1/benchmarks/"
    r"([a-z_]+\.(?:py|sh))([^`]*)`"
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


def retired_commands() -> list[tuple[str, str, str, str]]:
    """(where, commit, script file name, its options) for every retired benchmark command in the docs."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for match in RETIRED.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            out.append((f"{path.relative_to(ROOT)}:{line}", match.group(2), match.group(3), match.group(4)))
    return out


def _at(commit: str, path: str) -> str | None:
    """``path``'s text at ``commit``; None where this clone lacks the commit (a shallow clone) or the file."""
    out = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def test_the_docs_give_benchmark_commands():
    assert len(doc_commands()) + len(retired_commands()) > 50


@pytest.mark.parametrize("where, script, command", doc_commands(), ids=lambda v: v if ":" in str(v) else "")
def test_a_doc_command_runs_a_script_that_takes_its_options(where, script, command):
    path = BENCH / script
    assert path.exists(), f"{where}: {command!r} names {script}, which benchmarks/ does not hold"
    source = path.read_text()
    if "cli(__doc__" in source:  # the options every benchmark takes come from the harness
        source += (BENCH / "_harness.py").read_text()
    for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", command.split(script, 1)[-1]):
        assert f'"{option}"' in source or f"'{option}'" in source, f"{where}: {script} takes no {option}"


@pytest.mark.parametrize("where, commit, script, options", retired_commands(), ids=lambda v: v if ":" in str(v) else "")
def test_a_retired_command_runs_a_script_its_commit_holds_with_its_options(where, commit, script, options):
    if _at(commit, "README.md") is None:
        pytest.skip(f"this clone does not have commit {commit}")
    source = _at(commit, f"benchmarks/{script}")
    assert source is not None, f"{where}: commit {commit} has no benchmarks/{script}"
    assert not (BENCH / script).exists(), f"{where}: {script} is still here; name it as the other commands do"
    if "cli(__doc__" in source:
        source += _at(commit, "benchmarks/_harness.py") or ""
    for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", options):
        assert f'"{option}"' in source or f"'{option}'" in source, f"{where}: {script} at {commit} takes no {option}"


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
        assert COMMAND.search(command) or RETIRED.search(command), f"{figure}: no benchmark command in {command!r}"
        for name in re.findall(r"`(\w[\w.-]*\.(?:json|txt|log|tgz))`", files):
            assert (BENCH / "results" / name).exists(), f"{figure}: {name} is not in benchmarks/results/"


def test_a_results_header_names_the_commit_of_a_copy_outside_git(tmp_path):
    """A ``git archive`` copy on a device machine has no ``.git``: the commit its maker gave is the header's,
    and without one the header says None rather than a commit it was not measured on."""
    import shutil
    import sys

    (tmp_path / "benchmarks").mkdir()
    shutil.copy(Path(__file__).parents[1] / "benchmarks" / "_harness.py", tmp_path / "benchmarks" / "_harness.py")
    code = "import sys; sys.path.insert(0, sys.argv[1]); from benchmarks._harness import commit; print(commit())"

    def header_commit(env: dict) -> str:
        run = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    base = {"PATH": "/usr/bin:/bin", "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    assert header_commit({**base, "RANKSIGHT_COMMIT": "0123abc"}) == "0123abc"
    assert header_commit(base) == "None"
