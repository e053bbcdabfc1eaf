"""Features of FSDP2 jobs: what the all-gathers and reduce-scatters cost the step, per pass, and the unit
layout, resharding, prefetching and precision the FSDP rules' fixes are fitted to.

The agent records each FSDP2 unit's collectives per step as ``collectives`` rows of origin ``fsdp``: op
``all_gather_forward`` / ``all_gather_backward`` (``blocked_s``: time the training thread was held at
the issue and at the wait, i.e. exposed), ``reduce_scatter``; the unit (or a slot of units, for more
than 8) after a ``|`` in ``process_group``. Rows of an older agent (``all_gather_single``,
``all_gather_into_tensor``, an fsdp ``wait``) count as all-gathers without a pass.

What an all-gather costs by itself is, per call, the wait of the rank that arrived last (as for the
gradient all-reduce's floor, docs/diagnosis.md): per (step, op, unit) the least ``blocked_s`` across
ranks, summed per step, over the mean period of the steps every rank recorded. On a loaded host each
rank is late at a different collective; a per-step floor of the sums would keep those waits, the
per-call floor does not. On a GPU rank the time the step's stream waited (``gpu_comm_blocked_s``, the
agent brackets FSDP2's wait for the all-gather with CUDA events) stands for the exposed all-gathers.
"""

from __future__ import annotations

import math

from ._queries import kept_steps_sql, share_and_noise, steps_source
from ._tables import has_table, query

#: Features this module adds (merged into ``FEATURES``); absent (None) for a job that is not FSDP2.
FSDP_FEATURES: dict[str, str] = {
    "fsdp_units": "FSDP2 units that hold parameters (fully_shard modules with parameters of their own).",
    "fsdp_param_bytes": "Bytes of the parameters FSDP2 shards (unsharded size).",
    "fsdp_largest_unit_share": "The largest unit's parameter bytes over all units': near 1 when one unit holds "
    "the model (its all-gather cannot overlap anything).",
    "fsdp_reshard_units": "Units with reshard_after_forward (their parameters are all-gathered again in backward).",
    "fsdp_forward_prefetch_units": "Units with explicit forward prefetching (set_modules_to_forward_prefetch).",
    "fsdp_backward_prefetch_units": "Units with explicit backward prefetching (set_modules_to_backward_prefetch).",
    "fsdp_unshard_async": "1 when all-gathers are issued with async_op (on the compute stream on a GPU), else 0.",
    "fsdp_param_bits": "Bits per element FSDP2 computes and all-gathers in (MixedPrecisionPolicy.param_dtype; "
    "32 without one).",
    "fsdp_reduce_bits": "Bits per element of the gradient reduce-scatter (reduce_dtype, else param_dtype).",
    "fsdp_shard_size": "Ranks each unit is sharded over.",
    "fsdp_all_gather_share": "Share of the step period this rank waited for FSDP2 all-gathers (exposed).",
    "fsdp_all_gather_forward_share": "The same, forward all-gathers only (CPU ranks).",
    "fsdp_all_gather_backward_share": "The same, backward all-gathers only (CPU ranks).",
    "fsdp_all_gather_floor_share": "What the all-gathers cost by themselves: per call, the wait of the rank that "
    "arrived last, summed per step, over the mean period (copied to every rank).",
    "fsdp_all_gather_floor_share_noise": "Uncertainty of fsdp_all_gather_floor_share from its per-step spread.",
    "fsdp_all_gather_forward_floor_share": "fsdp_all_gather_floor_share of the forward all-gathers.",
    "fsdp_all_gather_backward_floor_share": "fsdp_all_gather_floor_share of the backward all-gathers.",
    "fsdp_reduce_scatter_share": "Share of the step period this rank was held in FSDP2 reduce-scatters.",
    "fsdp_reduce_scatter_floor_share": "Reduce-scatters' own cost, per call the least wait across ranks, over "
    "the period (copied to every rank; CPU ranks: on a GPU they run on a stream of their own).",
    "fsdp_reduce_scatter_floor_share_noise": "Uncertainty of fsdp_reduce_scatter_floor_share.",
    "fsdp_comm_floor_share": "fsdp_all_gather_floor_share + fsdp_reduce_scatter_floor_share.",
    "fsdp_all_gathers_per_step": "Median FSDP2 all-gathers per step (forward and backward).",
    "fsdp_all_gather_bytes_per_step": "Median bytes all-gathered per step (the unsharded output).",
    "fsdp_all_gather_bytes_per_call": "Mean bytes of one all-gather: the unit size as the wire sees it.",
    "fsdp_reduce_scatters_per_step": "Median FSDP2 reduce-scatters per step.",
    "fsdp_reduce_scatter_bytes_per_step": "Median bytes reduce-scattered per step (the unsharded gradient input).",
    "fsdp_backward_all_gather_ratio": "Backward all-gathers over forward ones: about 1 when every unit reshards "
    "after forward, 0 when none does.",
    "fsdp_all_gather_overlap": "1 - exposed / issue-to-wait span of the all-gathers (whole run, from the agent's "
    "per-unit totals): how much of them ran while the rank computed. CPU ranks only (host times).",
    "fsdp_all_gather_wire_s": "Per step, the all-gathered bytes' time on the transport's bandwidth: (N-1)/N x bytes "
    "/ bandwidth.",
    "fsdp_all_gather_latency_s": "Per step, the all-gathers' round trips at the transport's latency: calls x latency.",
}

FSDP_CONTEXT: dict[str, str] = {
    "fsdp_top_units": "Where the all-gather waits were, per pass and unit, e.g. '13% of the step in forward, 5% in "
    "backward; longest: blocks.0 (31%), blocks.1 (24%)' (CPU ranks: per-unit waits on a GPU are on its clock).",
    "fsdp_first_unit": "The name of the first FSDP2 unit with parameters below the root, e.g. 'layers.0'.",
}

FSDP_CONTEXT_DEFAULTS: dict[str, str] = {
    "fsdp_top_units": "per pass and unit: timed on CPU ranks only",
    "fsdp_first_unit": "blocks[0]",
}

_AG_OPS = "('all_gather_forward', 'all_gather_backward', 'all_gather_single', 'all_gather_into_tensor', 'wait')"
# Gradient reductions: FSDP2's reduce-scatter, and the all-reduce of HSDP's replicas (or of a torch that
# reduces with all_reduce on gloo).
_RS_OPS = "('reduce_scatter', 'reduce_scatter_single', 'reduce_scatter_tensor', 'all_reduce')"
_BITS = {"float32": 32, "float64": 64, "bfloat16": 16, "float16": 16, "float8_e4m3fn": 8, "float8_e5m2": 8}


_NONE: dict = {}


def fsdp_features(con, metas: list, feats: dict[int, dict], warmup_steps: int, since_ns: int | None, link) -> None:
    """Set the FSDP features (``FSDP_FEATURES``) of the FSDP2 ranks in ``feats``, in place. Every rank's dict
    already holds each name (``compute_features`` starts them all from ``FEATURES``, None for a job that is
    not FSDP2). ``link(backend, f)``: (bandwidth, latency) of the rank's transport, None when unknown."""
    meta_by_rank = {m.rank: m.data for m in metas}
    fsdp_ranks = [r for r in feats if (meta_by_rank.get(r) or _NONE).get("parallelism") == "fsdp2"]
    if not fsdp_ranks:
        return
    for r in fsdp_ranks:
        feats[r].update(_meta_features(meta_by_rank[r]))
    if not has_table(con, "collectives"):
        return
    reporting = sorted(r for r in fsdp_ranks if feats[r].get("steps"))
    per_rank = _rank_figures(con, warmup_steps, since_ns, reporting)
    floors = _floors(con, warmup_steps, since_ns, reporting) if reporting else {}
    for r in fsdp_ranks:
        feats[r].update(per_rank.get(r, {}))
        if reporting:  # blocking-collectives judges what FSDP2 does not: its own are the fsdp_* figures
            feats[r].update(floors)
            feats[r].update(per_rank.get("shared", {}))
    for r in fsdp_ranks:
        f = feats[r]
        f.update(_transport(f, meta_by_rank[r], link))
        ag, rs = f.get("fsdp_all_gather_floor_share"), f.get("fsdp_reduce_scatter_floor_share")
        if ag is not None or rs is not None:
            f["fsdp_comm_floor_share"] = (ag or 0.0) + (rs or 0.0)


def fsdp_context(metas: list, features: dict[int, dict]) -> dict[int, dict]:
    """Context strings per rank for the FSDP fixes (``FSDP_CONTEXT``)."""
    out = {}
    for m in metas:
        data = m.data or {}
        if data.get("parallelism") != "fsdp2":
            continue
        units = [u for u in (data.get("fsdp") or {}).get("unit_list") or [] if u.get("has_params")]
        ctx = dict(FSDP_CONTEXT_DEFAULTS)
        inner = [u for u in units if u.get("name") != "(root)"]
        if inner:
            ctx["fsdp_first_unit"] = str(inner[0].get("name"))
        f = features.get(m.rank) or {}
        fwd, bwd = f.get("fsdp_all_gather_forward_floor_share"), f.get("fsdp_all_gather_backward_floor_share")
        stats = [u for u in data.get("fsdp_units") or [] if isinstance(u, dict)]
        total = sum(float(u.get("all_gather_exposed_s") or 0) for u in stats)
        if fwd is not None and bwd is not None and total > 0:  # host times: CPU ranks (NCCL returns at enqueue)
            top = sorted(stats, key=lambda u: -float(u.get("all_gather_exposed_s") or 0))[:3]
            ctx["fsdp_top_units"] = f"{fwd:.0%} of the step in forward, {bwd:.0%} in backward; longest: " + ", ".join(
                f"{u.get('name')} ({float(u.get('all_gather_exposed_s') or 0) / total:.0%})" for u in top
            )
        out[m.rank] = ctx
    return out


def _bits(dtype) -> int | None:
    return _BITS.get(str(dtype)) if dtype else None


def _meta_features(meta: dict) -> dict:
    facts = meta.get("fsdp") or {}
    units = [u for u in facts.get("unit_list") or [] if u.get("has_params")]
    f: dict = {}
    if units:
        sizes = [float(u.get("param_bytes") or 0) for u in units]
        f["fsdp_units"] = len(units)
        f["fsdp_param_bytes"] = sum(sizes)
        f["fsdp_largest_unit_share"] = max(sizes) / sum(sizes) if sum(sizes) > 0 else None
    for key, name in (
        ("reshard_after_forward_units", "fsdp_reshard_units"),
        ("forward_prefetch_units", "fsdp_forward_prefetch_units"),
        ("backward_prefetch_units", "fsdp_backward_prefetch_units"),
        ("shard_group_size", "fsdp_shard_size"),
    ):
        if isinstance(facts.get(key), (int, float)):
            f[name] = facts[key]
    if "unshard_async_op" in facts:
        f["fsdp_unshard_async"] = int(bool(facts["unshard_async_op"]))
    if "unit_list" in facts:  # the agent read the policy (None: no MixedPrecisionPolicy, fp32 throughout)
        param = _bits(facts.get("param_dtype")) or 32
        f["fsdp_param_bits"] = param
        f["fsdp_reduce_bits"] = _bits(facts.get("reduce_dtype")) or param
    stats = [u for u in meta.get("fsdp_units") or [] if isinstance(u, dict)]
    exposed = sum(float(u.get("all_gather_exposed_s") or 0) for u in stats)
    span = sum(float(u.get("all_gather_span_s") or 0) for u in stats)
    on_gpu = any(str(d).startswith("cuda") for d in (meta.get("model") or {}).get("devices") or [])
    if span > 0 and not on_gpu:  # host times: on NCCL the issue returns at enqueue, so no overlap to read
        f["fsdp_all_gather_overlap"] = max(0.0, 1.0 - exposed / span)
    return f


def _rank_figures(con, warmup_steps: int, since_ns: int | None, reporting: list[int]) -> dict:
    """Per rank: exposed all-gather and reduce-scatter shares, calls and bytes per step; and, over the ``reporting``
    ranks, the blocking-collective features without FSDP2's own collectives, which have rules of their own
    (``comm_blocked_share``, ``collectives_per_step``, ``collective_bytes_per_step`` per rank;
    ``comm_blocked_floor_share`` and its noise under ``"shared"``): the metric all-reduces, barriers and object
    collectives the job adds. On a GPU rank the FSDP part of the stream's blocked time is taken in proportion to
    the host's. One scan of the steps and the collectives for both."""
    source = steps_source(since_ns)
    sql = f"""
        WITH {kept_steps_sql(source)},
             c AS (SELECT rank, step,
                          sum(blocked_s) FILTER (WHERE op IN {_AG_OPS}) AS ag_s,
                          sum(blocked_s) FILTER (WHERE op = 'all_gather_forward') AS fwd_s,
                          sum(blocked_s) FILTER (WHERE op = 'all_gather_backward') AS bwd_s,
                          sum(blocked_s) FILTER (WHERE op IN {_RS_OPS}) AS rs_s,
                          sum(count) FILTER (WHERE op IN {_AG_OPS} AND op <> 'wait') AS ag_n,
                          sum(count) FILTER (WHERE op = 'all_gather_forward') AS fwd_n,
                          sum(count) FILTER (WHERE op = 'all_gather_backward') AS bwd_n,
                          sum(bytes) FILTER (WHERE op IN {_AG_OPS}) AS ag_b,
                          sum(count) FILTER (WHERE op IN {_RS_OPS}) AS rs_n,
                          sum(bytes) FILTER (WHERE op IN {_RS_OPS}) AS rs_b,
                          sum(blocked_s) AS fsdp_s, sum(count) AS fsdp_n, sum(bytes) AS fsdp_b
                   FROM collectives WHERE origin = 'fsdp' GROUP BY rank, step),
             j AS (SELECT k.rank, k.step, k.period_s, k.gpu_step_s, k.gpu_comm_blocked_s, c.* EXCLUDE (rank, step),
                          k.rank IN (SELECT unnest(?::INTEGER[])) AS reporting,
                          CASE WHEN k.gpu_step_s IS NOT NULL AND k.gpu_comm_blocked_s IS NOT NULL
                               THEN k.gpu_comm_blocked_s * greatest(0, 1 - coalesce(c.fsdp_s, 0)
                                    / nullif(k.comm_blocked_s, 0))
                               ELSE greatest(0, coalesce(k.comm_blocked_s, 0) - coalesce(c.fsdp_s, 0)) END AS other_s,
                          k.collectives - coalesce(c.fsdp_n, 0) AS other_n,
                          k.collective_bytes - coalesce(c.fsdp_b, 0) AS other_b
                   FROM kept k LEFT JOIN c ON c.rank = k.rank AND c.step = k.step)
        SELECT rank, sum(period_s) AS period,
               sum(coalesce(CASE WHEN gpu_step_s IS NOT NULL THEN coalesce(gpu_comm_blocked_s, 0) END, ag_s, 0)),
               sum(fwd_s) FILTER (WHERE gpu_step_s IS NULL) AS fwd_s,
               sum(bwd_s) FILTER (WHERE gpu_step_s IS NULL) AS bwd_s,
               sum(rs_s) FILTER (WHERE gpu_step_s IS NULL) AS rs_s,
               median(coalesce(ag_n, 0)) AS ag_n, sum(fwd_n) AS fwd_n, sum(bwd_n) AS bwd_n,
               median(coalesce(ag_b, 0)) AS ag_b, sum(ag_b) / nullif(sum(ag_n), 0) AS ag_call_b,
               median(coalesce(rs_n, 0)) AS rs_n, median(coalesce(rs_b, 0)) AS rs_b,
               bool_or(reporting), sum(other_s) / nullif(sum(period_s), 0), median(other_n), median(other_b)
        FROM j GROUP BY rank
        UNION ALL
        SELECT -1, avg(period_s), min(other_s), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               NULL, NULL, NULL, NULL
        FROM j WHERE reporting GROUP BY step HAVING count(*) = ?
    """
    rows = query(con, sql, [warmup_steps, warmup_steps, reporting, len(reporting)])[1]
    out: dict = {}
    per_step = [(r[2], r[1]) for r in rows if r[0] == -1 and r[1]]
    for row in rows:
        rank, period, ag, fwd, bwd, rs, ag_n, fwd_n, bwd_n, ag_b, ag_call_b, rs_n, rs_b = row[:13]
        if rank == -1:
            continue
        figures = {}
        if period:
            figures = {
                "fsdp_all_gather_share": ag / period,
                "fsdp_all_gather_forward_share": None if fwd is None else fwd / period,
                "fsdp_all_gather_backward_share": None if bwd is None else bwd / period,
                "fsdp_reduce_scatter_share": None if rs is None else rs / period,
                "fsdp_all_gathers_per_step": ag_n,
                "fsdp_all_gather_bytes_per_step": ag_b,
                "fsdp_all_gather_bytes_per_call": ag_call_b,
                "fsdp_reduce_scatters_per_step": rs_n,
                "fsdp_reduce_scatter_bytes_per_step": rs_b,
                "fsdp_backward_all_gather_ratio": (bwd_n or 0) / fwd_n if fwd_n else None,
            }
        if row[13]:  # a reporting rank
            figures.update(zip(("comm_blocked_share", "collectives_per_step", "collective_bytes_per_step"), row[14:]))
        if figures:
            out[rank] = figures
    if per_step:
        floor = share_and_noise([x for x, _ in per_step], [p for _, p in per_step])
        out["shared"] = dict(zip(("comm_blocked_floor_share", "comm_blocked_floor_share_noise"), floor))
    return out


def _floors(con, warmup_steps: int, since_ns: int | None, ranks: list[int]) -> dict:
    """Per-call floors across ranks (see the module docstring), over the steps every rank recorded."""
    source = steps_source(since_ns)
    sql = f"""
        WITH {kept_steps_sql(source)},
             k AS (SELECT rank, step, period_s, gpu_step_s IS NOT NULL AS on_gpu,
                          coalesce(gpu_comm_blocked_s, 0) AS gpu_blocked
                   FROM kept WHERE rank IN (SELECT unnest(?::INTEGER[]))),
             shared AS (SELECT step, avg(period_s) AS period_s, bool_or(on_gpu) AS on_gpu,
                               min(gpu_blocked) AS gpu_floor
                        FROM k GROUP BY step HAVING count(*) = ?),
             calls AS (SELECT c.step, c.op, c.process_group, c.rank, sum(c.blocked_s) AS held
                       FROM collectives c JOIN k ON k.rank = c.rank AND k.step = c.step
                       WHERE c.origin = 'fsdp' GROUP BY ALL),
             per_call AS (SELECT step, op, min(held) AS floor_s FROM calls GROUP BY step, op, process_group
                          HAVING count(*) = ?),
             per_step AS (SELECT step,
                                 sum(floor_s) FILTER (WHERE op IN {_AG_OPS}) AS ag,
                                 sum(floor_s) FILTER (WHERE op = 'all_gather_forward') AS fwd,
                                 sum(floor_s) FILTER (WHERE op = 'all_gather_backward') AS bwd,
                                 sum(floor_s) FILTER (WHERE op IN {_RS_OPS}) AS rs
                          FROM per_call GROUP BY step)
        SELECT s.step, s.period_s, s.on_gpu, s.gpu_floor, coalesce(p.ag, 0), coalesce(p.fwd, 0),
               coalesce(p.bwd, 0), coalesce(p.rs, 0)
        FROM shared s LEFT JOIN per_step p USING (step) ORDER BY s.step
    """
    n = len(ranks)
    rows = [r for r in query(con, sql, [warmup_steps, warmup_steps, ranks, n, n])[1] if r[1] and r[1] > 0]
    if not rows:
        return {}
    periods = [r[1] for r in rows]
    on_gpu = any(r[2] for r in rows)
    out = dict(zip(_AG_FLOOR, share_and_noise([(r[3] if on_gpu else r[4]) for r in rows], periods)))
    if not on_gpu:
        total = sum(periods)
        out["fsdp_all_gather_forward_floor_share"] = sum(r[5] for r in rows) / total
        out["fsdp_all_gather_backward_floor_share"] = sum(r[6] for r in rows) / total
        out.update(zip(_RS_FLOOR, share_and_noise([r[7] for r in rows], periods)))
    return out


_AG_FLOOR = ("fsdp_all_gather_floor_share", "fsdp_all_gather_floor_share_noise")
_RS_FLOOR = ("fsdp_reduce_scatter_floor_share", "fsdp_reduce_scatter_floor_share_noise")


def _transport(f: dict, meta: dict, link) -> dict:
    """The all-gathers' wire and latency time per step on the rank's transport (as ``transport_model``)."""
    n = f.get("fsdp_shard_size") or f.get("world_size") or 1
    found = link((meta.get("fsdp") or {}).get("backend"), f)
    if found is None or n < 2 or not f.get("fsdp_all_gather_bytes_per_step"):
        return {}
    bandwidth, latency = found
    calls = f.get("fsdp_all_gathers_per_step") or 1
    return {
        "fsdp_all_gather_wire_s": (n - 1) / n * f["fsdp_all_gather_bytes_per_step"] / bandwidth,
        "fsdp_all_gather_latency_s": calls * latency * max(1, math.ceil(math.log2(n))),
    }


__all__ = ["FSDP_CONTEXT", "FSDP_CONTEXT_DEFAULTS", "FSDP_FEATURES", "fsdp_context", "fsdp_features"]
