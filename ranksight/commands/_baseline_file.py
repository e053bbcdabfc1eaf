"""A baseline file: what the gate needs of a run, kept so CI can compare against last week's run.

Why a file and not the run folder: a CI job keeps a few hundred kilobytes as an artifact or in the
repository far more easily than a run's spool, and the gate needs only this. The format is JSON:

    {"format": "ranksight-baseline", "version": 1, "run": ..., "world_size": 2, "warmup_steps": 5,
     "saved_utc": "...", "columns": ["period_s", "data_wait_s", ...],
     "ranks": {"0": {"step": [5, 6, ...], "period_s": [...], "data_wait_s": [...], ..., "cpu_s": [...],
                     "on_gpu": [0, ...]}, ...},
     "diagnosis": {"run": ..., "breakdown": {"ranks": [...]}, "findings": [...]}}

Per rank, every step after the warm-up with its period and phase seconds (null: not measured), and the
training thread's CPU seconds (``cpu_s``) and whether the period is the GPU's (``on_gpu``); the
diagnosis's per-rank breakdown and findings, so the side-by-side table and the findings' changes work too.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np

from ._gate_samples import COLUMNS, HOST_COLUMNS, Samples

FORMAT, VERSION = "ranksight-baseline", 1


def _plain(values: np.ndarray) -> list:
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values.tolist()]


def write_baseline(path: str, samples: Samples, diagnosis: dict, warmup_steps: int) -> dict:
    """Write the baseline of one run to ``path``; returns what it wrote."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "run": samples.run,
        "world_size": samples.world_size,
        "warmup_steps": warmup_steps,
        "saved_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "columns": list(COLUMNS),
        "ranks": {str(r): {k: _plain(v) for k, v in cols.items()} for r, cols in sorted(samples.ranks.items())},
        "diagnosis": {
            "run": diagnosis.get("run"),
            "breakdown": {"ranks": diagnosis.get("breakdown", {}).get("ranks", [])},
            "findings": diagnosis.get("findings", []),
        },
    }
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"), default=str)
    return doc


def read_baseline(path: str) -> tuple[Samples, dict, int]:
    """A baseline file's samples, diagnosis and warm-up; ValueError naming what is wrong with it."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read baseline {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a baseline file (not JSON: {exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f'{path} is not a baseline file (no "format": "{FORMAT}")')
    if doc.get("version") != VERSION:
        raise ValueError(f"{path}: baseline version {doc.get('version')}, this ranksight reads {VERSION}")
    samples = Samples(run=doc.get("run") or path, world_size=doc.get("world_size"))
    for rank, cols in doc.get("ranks", {}).items():
        missing = [c for c in ("step", *COLUMNS) if c not in cols]
        if missing:
            raise ValueError(f"{path}: rank {rank} lacks {missing}")
        samples.ranks[int(rank)] = {
            "step": np.array(cols["step"], dtype=int),
            **{
                c: np.array([np.nan if v is None else v for v in cols[c]], dtype=float)
                for c in (*COLUMNS, *HOST_COLUMNS)
                if c in cols  # the host columns are optional
            },
        }
    return samples, doc.get("diagnosis") or {}, int(doc.get("warmup_steps", 0))
