"""The live follower's reading side, in a process of its own: ``python -m ranksight.exporters._reader RUN_PATH``.

The training process keeps the tracker objects (``wandb.run``, the active MLflow run, a ``SummaryWriter``'s log
dir) and only logs what this process sends it; the reading (DuckDB over the run's new segments), the final
diagnosis and the report are done here, so none of it takes a core's time or the GIL from the training thread.

Commands come one per line on stdin: ``poll`` (answered with the points of the segments written since the last
poll) and ``final WAIT_S`` (wait until every rank closed, then the last points, the diagnosis and the report
files). Each answer is one frame on the original stdout: an 8-byte big-endian length and a pickle of a dict.
End of stdin (the training process finished or died) ends this process. Anything printed goes to stderr.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys

from ranksight.format.warmup import WARMUP_STEPS


def write_frame(out, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(struct.pack(">Q", len(data)) + data)
    out.flush()


def read_frame(f):
    """One frame from the binary file ``f``; EOFError when the other side is gone."""
    head = f.read(8)
    if len(head) < 8:
        raise EOFError("the follower's reader process ended")
    (n,) = struct.unpack(">Q", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError("the follower's reader process ended mid-answer")
    return pickle.loads(data)


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def serve(run_path: str, warmup_steps: int, commands, out) -> None:
    from ._points import SpoolCursor
    from ._verdict import diagnose_run, report_files, wait_for_ranks

    cursor = SpoolCursor(run_path)

    def points():
        try:
            return cursor.new_points(), None
        except Exception as exc:  # a run folder not there yet, a segment pruned under us: next poll
            return [], _error(exc)

    for line in commands:
        words = line.split()
        if not words:
            continue
        if words[0] == "poll":
            pts, err = points()
            write_frame(out, {"points": pts, "error": err})
        elif words[0] == "final":
            wait_for_ranks(run_path, float(words[1]) if len(words) > 1 else 30.0)
            pts, err = points()
            answer = {"points": pts, "error": err, "result": None, "files": None, "verdict_error": None}
            try:
                answer["result"] = diagnose_run(run_path, warmup_steps)
                answer["files"] = report_files(answer["result"], run_path)
            except Exception as exc:
                answer["verdict_error"] = _error(exc)
            write_frame(out, answer)
            return


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_path, warmup_steps = argv[0], int(argv[1]) if len(argv) > 1 else WARMUP_STEPS
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a library's print must not corrupt the frames
    try:
        serve(run_path, warmup_steps, sys.stdin, out)
    except (BrokenPipeError, KeyboardInterrupt):  # the training process is gone or interrupted: nothing to tell
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
