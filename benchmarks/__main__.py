"""Every benchmark behind one command, so that each figure in the docs is one command away.

    python -m benchmarks --list                # each benchmark and the first line of its docstring
    python -m benchmarks NAME [ARGS...]        # benchmarks/NAME.py with ARGS, as if run as a script

A benchmark is a ``benchmarks/*.py`` whose name does not start with ``_`` (those are shared helpers).
"""

from __future__ import annotations

import ast
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def benchmarks() -> dict[str, str]:
    """Each benchmark's name and the first line of its docstring, read without importing it."""
    out = {}
    for name in sorted(os.listdir(HERE)):
        if name.endswith(".py") and not name.startswith("_"):
            with open(os.path.join(HERE, name)) as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
            out[name[:-3]] = doc.strip().split("\n")[0]
    return out


def main(argv: list[str]) -> int:
    known = benchmarks()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        width = max(map(len, known))
        print("\n".join(f"{name:<{width}}  {line}" for name, line in known.items()))
        return 0
    name, args = argv[0].removesuffix(".py"), argv[1:]
    if name not in known:
        print(f"no benchmark {name!r}; `python -m benchmarks --list` names them", file=sys.stderr)
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
