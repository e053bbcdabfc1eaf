"""What Python work on another thread costs a training step that launches many small torch ops.

Each torch op releases the GIL and takes it back; while another thread runs Python, the step gets it back
only when that thread lets go (at the latest after ``sys.getswitchinterval()``, 5 ms). So the agent
thread's Python (reading and reducing a kernel window) costs the training thread about as long as it runs,
and a window's cost counts it (``trace_window_reduce_seconds``). Arms: the step alone, then beside a thread
that runs Python in slices of ``--slices`` ms, sleeping 0.2 ms between slices (``inf``: never letting go).

    python -m benchmarks gil_convoy --json benchmarks/results/cpu_gil_convoy.json
"""

from __future__ import annotations

import statistics
import threading
import time

from _harness import cli, in_rounds, write_results


def main() -> None:
    parser = cli(__doc__, rounds=3)
    parser.add_argument("--slices", type=float, nargs="+", default=[float("inf"), 1.0, 0.2])
    parser.add_argument("--layers", type=int, default=100, help="Linear(16, 16) layers: ~4 ops each, fwd + bwd")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(args.layers)])
    x = torch.randn(2, 16)

    def step_s() -> float:
        t = time.perf_counter()
        model(x).sum().backward()
        return time.perf_counter() - t

    for _ in range(5):
        step_s()

    def measure(arm: str, _round: int) -> dict:
        slice_s = float(arm) / 1e3 if arm != "alone" else None
        stop = threading.Event()

        def busy() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                while time.perf_counter() - t < slice_s and not stop.is_set():
                    sum(range(100))
                time.sleep(0.0002)

        thread = threading.Thread(target=busy) if slice_s is not None else None
        if thread:
            thread.start()
            time.sleep(0.05)
        median = statistics.median(step_s() for _ in range(21))
        stop.set()
        if thread:
            thread.join()
        return {"step_s": median}

    arms = ["alone", *(str(s) for s in args.slices)]
    results = in_rounds(arms, args.rounds, measure)
    alone = statistics.median(r["step_s"] for r in results["alone"])
    figures = {}
    for arm, rs in results.items():
        step = statistics.median(r["step_s"] for r in rs)
        fig = figures[arm] = {"step_ms": 1e3 * step, "x_alone": step / alone}
        print(f"{arm:>6} ms slices: step {fig['step_ms']:8.2f} ms  {fig['x_alone']:7.1f} x alone")
    if args.json:
        write_results(args.json, {"figures": figures}, arms=arms, rounds=args.rounds)


if __name__ == "__main__":
    main()
