"""Every benchmark behind one command, so that each figure in the docs is one command away.

    python -m benchmarks --list                # each benchmark, what it measures, the results files the docs cite
    python -m benchmarks NAME [ARGS...]        # benchmarks/NAME.py with ARGS, as if run as a script

A benchmark is a ``benchmarks/*.py`` whose name does not start with ``_`` (those are shared helpers). A retired
one, which docs/benchmarks.md runs from a checkout of its last commit, is listed with that commit, and
``NAME`` prints the command that runs it.
"""

from __future__ import annotations

import ast
import os
import re
import runpy
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(os.path.dirname(HERE), "docs", "benchmarks.md")
"""Its table of headline figures: one row a figure, its command and its results file."""


def benchmarks() -> dict[str, str]:
    """Each benchmark's name and the first sentence of its docstring, read without importing it."""
    out = {}
    for name in sorted(os.listdir(HERE)):
        if name.endswith(".py") and not name.startswith("_"):
            with open(os.path.join(HERE, name)) as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
            out[name[:-3]] = re.split(r"(?<=[.?])\s", " ".join(doc.strip().split("\n\n")[0].split()))[0]
    return out


def cited_results() -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each benchmark's results files as the docs' table of headline figures names them, in its order; and each
    retired benchmark's last commit, where the table runs it from a checkout of that commit."""
    out: dict[str, list[str]] = {}
    retired: dict[str, str] = {}
    with open(TABLE) as f:
        section = f.read().split("## Every headline figure")[1].split("\n## ")[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and line.count(" | ") == 2]
    for _, command, files in rows:
        for _folder, commit, name in re.findall(
            r"git worktree add (\S+) ([0-9a-f]{7,40}) && [^`]*?\1/benchmarks/(\w+)", command
        ):
            retired[name] = commit
        command = re.sub(r"`[^`]*` at commit [0-9a-f]{7,40}", "", command)  # a retired section's, run from there
        for name in dict.fromkeys(re.findall(r"(?:python -m benchmarks |benchmarks/|its `)(\w+)", command)):
            out.setdefault(name, []).append(files.strip(" |").replace("`", ""))
    return out, retired


def main(argv: list[str]) -> int:
    known = benchmarks()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        (cited, retired) = cited_results()
        width = max(map(len, [*known, *retired]))
        for name, line in [*known.items(), *((n, f"retired: runs from commit {c}") for n, c in retired.items())]:
            print(textwrap.fill(line, 118, initial_indent=f"{name:<{width}}  ", subsequent_indent=" " * (width + 2)))
            for files in dict.fromkeys(cited.get(name, [])):
                print(f"{'':<{width}}  results: {files}")
        print(f"\npython -m benchmarks NAME --help: its options; {os.path.relpath(TABLE)}: every headline figure")
        return 0
    name, args = argv[0].removesuffix(".py"), argv[1:]
    if name not in known:
        commit = cited_results()[1].get(name)
        where = f"retired: git worktree add /tmp/rs {commit} && python /tmp/rs/benchmarks/{name}.py" if commit else ""
        print(where or f"no benchmark {name!r}; `python -m benchmarks --list` names them", file=sys.stderr)
        return 2
    path = os.path.join(HERE, name + ".py")
    sys.argv = [path, *args]
    sys.path.insert(0, HERE)  # the scripts import their helpers (_harness, _peers, ...) by name
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
