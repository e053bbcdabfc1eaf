"""The gate's limits and how an interval is judged against them.

Why this rule: a CI gate must not fail a healthy rerun because the machine was noisy, and must not pass a
real regression because one run was lucky. So it judges the *interval*, not the point estimate: B fails
when the whole interval of its slowdown lies above the limit (its lower bound is past it: at the chosen
confidence B is slower by more than the limit). An interval that reaches past the limit but not wholly is
"cannot tell" (exit 0, said in the output): the runs were too short or too noisy to settle it, and a
longer run would. The same limit is the margin for the other words: "no change" when the whole interval
lies within +-limit, "faster" when it lies wholly below -limit.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ranksight.format.phases import PHASES

DEFAULT_LIMIT = 0.03
"""The margin the verdict words use when no gate is set: a 3 % change in step time."""

DEFAULT_CONFIDENCE = 0.95
"""Two-sided confidence of the intervals; the gate's one-sided test is then at 97.5 %."""

_PHASE_NAMES = {p[:-2]: p for p in PHASES}


@dataclass(frozen=True)
class GateConfig:
    """What the gate checks (``--gate``, ``--gate-config``, or ``[tool.ranksight.gate]`` in pyproject.toml)."""

    step_time: float | None = None
    """Fail when B's step time is slower than A's by more than this share (0.03: 3 %) at ``confidence``."""
    phases: dict[str, float] = field(default_factory=dict)
    """Per phase (``data_wait_s`` ...): fail when the phase's part of the slowdown, in points of A's step time,
    is above this (0.02: 2 pp) at ``confidence``."""
    confidence: float = DEFAULT_CONFIDENCE
    """Two-sided confidence of every interval."""

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        for name, limit in [("step_time", self.step_time), *self.phases.items()]:
            if limit is not None and not 0 <= limit < 100:
                raise ValueError(f"gate limit {name} must be a share in [0, 100), got {limit}")
        unknown = sorted(set(self.phases) - set(PHASES))
        if unknown:
            raise ValueError(f"unknown phase(s) {unknown}; known: {sorted(_PHASE_NAMES)}")

    @property
    def active(self) -> bool:
        """Whether any limit is set (else the comparison only reports)."""
        return self.step_time is not None or bool(self.phases)


def parse_share(text, unit: str = "%") -> float:
    """'3%', '3 %', '3pp', '0.03' or 3 (a number above 1 is read as percent) -> 0.03."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
        return value / 100 if value >= 1 else value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%|pp|pt)?\s*", str(text))
    if not m:
        raise ValueError(f"not a share: {text!r} (write 3% or 0.03; a phase's limit 2pp)")
    value = float(m.group(1))
    return value / 100 if m.group(2) or value >= 1 else value


def phase_key(name: str) -> str:
    """A phase as a user writes it ('data_wait', 'data_wait_s', 'data-wait') -> its column name."""
    key = name.strip().lower().replace("-", "_").replace(" ", "_")
    return key if key in PHASES else _PHASE_NAMES.get(key, key)


def config_from_table(table: dict, where: str) -> GateConfig:
    """A gate config from a parsed table: ``step_time``, ``confidence`` and a ``phases`` table."""
    known = {"step_time", "confidence", "phases"}
    extra = sorted(set(table) - known)
    if extra:
        raise ValueError(f"{where}: unknown key(s) {extra}; known: {sorted(known)}")
    try:
        return GateConfig(
            step_time=None if table.get("step_time") is None else parse_share(table["step_time"]),
            phases={phase_key(k): parse_share(v) for k, v in (table.get("phases") or {}).items()},
            confidence=float(table.get("confidence", DEFAULT_CONFIDENCE)),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_config(path: str) -> GateConfig:
    """The gate config in a pyproject.toml (its ``[tool.ranksight.gate]`` table) or a YAML file (its ``gate``
    mapping, or the whole file)."""
    if os.path.basename(path).endswith(".toml"):
        try:
            import tomllib
        except ImportError:  # Python < 3.11
            import tomli as tomllib  # type: ignore[no-redef]
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        table = doc.get("tool", {}).get("ranksight", {}).get("gate")
        if table is None:
            raise ValueError(f"{path}: no [tool.ranksight.gate] table")
        return config_from_table(table, f"{path} [tool.ranksight.gate]")
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping")
    return config_from_table(doc.get("gate", doc), path)


def verdict(interval: dict, limit: float) -> str:
    """'slower' (wholly above +limit), 'faster' (wholly below -limit), 'no change' (wholly within +-limit),
    else 'cannot tell'."""
    if interval["low"] > limit:
        return "slower"
    if interval["high"] < -limit:
        return "faster"
    if interval["low"] >= -limit and interval["high"] <= limit:
        return "no change"
    return "cannot tell"
