"""What a newcomer reads first: every figure on the Verdict page has its unit, and a CPU job's checklist
shows only what applies, with one line for the rest."""

from __future__ import annotations

import pytest

from ranksight.dashboard._units import figure_text, unit_kind
from ranksight.dashboard._verdict_rows import checklist_rows, evidence_rows
from ranksight.rules import load_rules


def test_every_evidence_and_checklist_figure_of_the_builtin_rules_has_a_unit():
    rules = load_rules()
    names = {n for r in rules.rules for n in r.evidence} | {n for c in rules.checklist for n in c.value.names}
    assert sorted(n for n in names if unit_kind(n) is None) == []


@pytest.mark.parametrize(
    "name,value,text",
    [
        ("data_wait_share", 0.6112, "61.1 %"),
        ("grad_bytes_per_step", 215556, "216 kB / step"),
        ("comm_floor_s", 0.002, "2 ms"),
        ("allreduce_wire_s", 0.0002, "200 µs"),
        ("step_median_s", 1.5, "1.5 s"),
        ("compute_vs_median", 1.0213, "1.02×"),
        ("buckets_per_step", 1, "1 / step"),
        ("allreduce_achieved_bytes_per_s", 2.5e9, "2.5 GB/s"),
        ("ddp_backend_gloo", 1, "yes"),
        ("memory_reserved_excess", 0.12, "+12.0 %"),
        ("host_load_ratio", 0.9177, "0.918 load / CPU"),
        ("h2d_gap_share", None, "—"),
    ],
)
def test_figure_text_carries_the_unit(name, value, text):
    assert figure_text(name, value) == text


def test_the_compared_value_is_not_shown_twice():
    f = {"rule": "input-bound", "evidence": {"data_wait_share": 0.5341, "step_median_s": 0.1448, "value": 0.5341}}
    assert evidence_rows(f) == [
        {"evidence": "data_wait_share", "value": "53.4 %"},
        {"evidence": "step_median_s", "value": "145 ms"},
    ]


def _cpu_diag() -> dict:
    rules = load_rules()
    rows = [
        {"item": c.item, "group": c.group, "status": "n/a", "value": None, "unit": "number"} for c in rules.checklist
    ]
    graph = next(r for r in rows if r["item"] == "graph breaks")
    graph.update(status="pass", value=0)
    overlap = next(r for r in rows if r["item"] == "comm/compute overlap (DDP buckets)")
    overlap.update(status="warn", value=0.42)
    breakdown = {"ranks": [{"rank": 0, "h2d_share": None}, {"rank": 1, "h2d_share": None}]}
    return {"checklist": rows, "breakdown": breakdown, "findings": []}


def test_a_cpu_jobs_checklist_shows_only_what_applies_with_one_line_for_the_gpu_rows():
    rows, line = checklist_rows(_cpu_diag())
    assert rows == [
        {"status": "pass", "item": "graph breaks", "group": rows[0]["group"], "value": "0 breaks"},
        {"status": "warn", "item": "comm/compute overlap (DDP buckets)", "group": rows[1]["group"], "value": "42.0 %"},
    ]
    assert "GPU items hidden: they need a GPU, and this job ran on CPUs" in line
    assert "n/a" not in str(rows)


def _comm_latency(contended: int, on_gpu: int):
    from ranksight.rules import evaluate

    from .test_rules_evaluate import HEALTHY, frame

    # A healthy demo run at a load of 5 per CPU: 216 kB in one all-reduce, 0.25 ms of round trip on loopback,
    # 18.9 ms measured (12.4 % of the step) on the rank that waited least.
    f = {**HEALTHY, "comm_floor_share": 0.1245, "comm_floor_share_noise": 0.01, "comm_floor_s": 0.0189}
    f.update(grad_bytes_per_step=215556, allreduce_wire_s=0.000216, allreduce_latency_s=0.00025, buckets_per_step=1)
    f.update(host_cpu_contended=contended, model_on_gpu=on_gpu)
    found = {x["rule"]: x for x in evaluate(load_rules().rules, frame(r0=f, r1=f))}
    return found.get("comm-latency", {}).get("severity")


def test_a_round_trip_that_waited_for_a_core_is_the_hosts_not_a_warning():
    """What the transport does not explain of a latency-bound all-reduce on a contended CPU host waited for a
    core: no warning there; the same figures on a quiet host, or on a GPU job, still are one."""
    assert _comm_latency(contended=1, on_gpu=0) in (None, "info")
    assert _comm_latency(contended=0, on_gpu=0) == "warning"
    assert _comm_latency(contended=1, on_gpu=1) == "warning"
