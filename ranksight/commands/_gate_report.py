"""The change and the gate's verdict for people: terminal text and Markdown (a GitHub job summary).

Both render the dict ``_gate.assess`` returns, so they say the same numbers as ``--json``. A phase's part of
the change is in points (pp) of A's step time, so the parts add up to the change in step time.
"""

from __future__ import annotations

_LABELS = {"data_wait_s": "data wait", "h2d_s": "H2D copy", "compute_s": "compute",
           "comm_exposed_s": "exposed comm", "optimizer_s": "optimizer", "other_s": "other"}  # fmt: skip
_STATUS = {"pass": "PASS", "fail": "FAIL", "incomparable": "CANNOT COMPARE", "report": ""}
_MARK = {"pass": "✅", "fail": "❌", "incomparable": "⚠️", "report": "ℹ️"}


def label(phase: str) -> str:
    """A phase column's name as the tables print it."""
    return _LABELS.get(phase, phase)


def _pct(v: float) -> str:
    return f"{100 * v:+.1f} %"


def _pp(v: float) -> str:
    return f"{100 * v:+.1f} pp"


def _span(i: dict, unit=_pct) -> str:
    return f"{unit(i['point'])} [{unit(i['low'])}, {unit(i['high'])}]"


def headline(change: dict) -> str:
    """'+11.0 % ± 2.1 % (slower): data wait +9.0 pp; beyond a uniform x1.02: +9.1 % [+8.3 %, +9.9 %]' (the
    phases whose part beyond the host's stretch excludes 0, then the change they explain)."""
    step = change["job"]["step"]
    c, e = step["change"], step["explained"]
    half = (c["high"] - c["low"]) / 2
    moved = [f"{label(r['phase'])} {_pp(r['excess']['point'])}" for r in change["attribution"] if r["moved"]]
    parts = ", ".join(moved) if moved else "no phase moved beyond the rest"
    return (
        f"{_pct(c['point'])} ± {100 * half:.1f} % ({change['verdict']}): {parts}; "
        f"beyond a uniform x{step['host_stretch']['point']:.2f}: {_span(e)}"
    )


def _unit(failed: dict) -> str:
    return "%" if failed["what"] == "step_time" else "pp"


def _gate_line(change: dict) -> str:
    status = change["status"]
    if status == "incomparable":
        return f"Gate: CANNOT COMPARE: {change['reason']}"
    limits = change["limits"]
    what = []
    if limits["step_time"] is not None:
        what.append(f"step time +{100 * limits['step_time']:g} %")
    what += [f"{label(p)} +{100 * v:g} pp" for p, v in limits["phases"].items()]
    conf = f"{100 * change['confidence']:g} %"
    if status == "report":
        return ""
    if status == "fail":
        why = "; ".join(
            f"{'step time' if f['what'] == 'step_time' else label(f['what'])} is at least "
            f"{100 * f['interval']['low']:+.1f} {_unit(f)} beyond the host's stretch "
            f"(limit +{100 * f['limit']:g} {_unit(f)})"
            for f in change["failed"]
        )
        return f"Gate ({', '.join(what)} at {conf}): FAIL: {why}"
    note = f" (cannot tell: {change['verdict_reason']})" if change["verdict"] == "cannot tell" else ""
    return f"Gate ({', '.join(what)} at {conf}): PASS" + note


def render_text(change: dict) -> str:
    """The change section of ``ranksight compare``'s text output."""
    if change["status"] == "incomparable":
        limits = change["limits"]
        gated = limits["step_time"] is not None or bool(limits["phases"])
        return _gate_line(change) if gated else f"Step time, B against A: cannot judge: {change['reason']}"
    job = change["job"]
    lines = [
        f"Step time, B against A (20 % trimmed mean over {job['steps_a']} and {job['steps_b']} steps after "
        f"warm-up; {100 * change['confidence']:g} % interval, block bootstrap):",
        f"  {headline(change)}",
        f"  job     {1000 * job['step']['a_s']:.2f} ms -> {1000 * job['step']['b_s']:.2f} ms  "
        f"{_span(job['step']['change'])}  {change['verdict']}",
    ]
    for rank, r in change["ranks"].items():
        lines.append(
            f"  rank {rank:<2} {1000 * r['step']['a_s']:.2f} ms -> {1000 * r['step']['b_s']:.2f} ms  "
            f"{_span(r['step']['change'])}  {r['verdict']}"
        )
    lines.append(
        "  where it moved (points of A's step time: measured, and beyond the host's stretch; share of each run's step):"
    )
    for row in change["attribution"]:
        p = job["phases"][row["phase"]]
        beyond = _span(row["excess"], _pp) if row["excess"] else "(a wait for peers: not judged)"
        lines.append(
            f"    {label(row['phase']):<13} {_span(row['contribution'], _pp)}   beyond {beyond}   share "
            f"{100 * p['share_a']:.1f} % -> {100 * p['share_b']:.1f} % ({_pp(p['share_change']['point'])})"
        )
    if change["findings"]:
        lines.append("  findings that account for it (their cost, in A's step time):")
        for f in change["findings"]:
            lines.append(f"    {f['rule']:<22} {f['how']:<11} {_pp(f['accounts_for'])}")
    gate = _gate_line(change)
    return "\n".join(lines + ([gate] if gate else []))


def render_markdown(result: dict) -> str:
    """The comparison as Markdown for a pull request or ``$GITHUB_STEP_SUMMARY``."""
    change = result["change"]
    a, b = result["a"], result["b"]
    status = change["status"]
    title = f"### {_MARK[status]} ranksight: {b['run']} against {a['run']}"
    lines = [title, ""]
    if status == "incomparable":
        return "\n".join(lines + [f"**Cannot compare:** {change['reason']}", ""])
    gate = _gate_line(change)
    if gate:
        lines += [f"**{gate}**", ""]
    lines += [f"Step time {headline(change)}", ""]
    if change["verdict_reason"]:
        lines += [f"> cannot tell: {change['verdict_reason']}", ""]
    job = change["job"]
    lines += ["| | A | B | B / A - 1 | interval | verdict |", "|---|---:|---:|---:|---|---|"]
    rows = [("job", job, change["verdict"])] + [(f"rank {k}", v, v["verdict"]) for k, v in change["ranks"].items()]
    for name, r, word in rows:
        c = r["step"]["change"]
        lines.append(
            f"| {name} | {1000 * r['step']['a_s']:.2f} ms | {1000 * r['step']['b_s']:.2f} ms | {_pct(c['point'])} "
            f"| {_pct(c['low'])} … {_pct(c['high'])} | {word} |"
        )
    lines += [
        "",
        "| phase | part of the change | interval | beyond the host's stretch | share A | share B |",
        "|---|---:|---|---|---:|---:|",
    ]
    for row in change["attribution"]:
        p, c, e = job["phases"][row["phase"]], row["contribution"], row["excess"]
        beyond = f"{_pp(e['point'])} ({_pp(e['low'])} … {_pp(e['high'])})" if e else "a wait for peers: not judged"
        lines.append(
            f"| {label(row['phase'])} | {_pp(c['point'])} | {_pp(c['low'])} … {_pp(c['high'])} | {beyond} "
            f"| {100 * p['share_a']:.1f} % | {100 * p['share_b']:.1f} % |"
        )
    if change["findings"]:
        lines += ["", "| finding | | accounts for |", "|---|---|---:|"]
        lines += [f"| {f['rule']} | {f['how']} | {_pp(f['accounts_for'])} |" for f in change["findings"]]
    lines += ["", f"<sub>20 % trimmed mean of the step time, {job['steps_a']} and {job['steps_b']} steps after "
              f"warm-up; {100 * change['confidence']:g} % intervals from a block bootstrap.</sub>", ""]  # fmt: skip
    return "\n".join(lines)
