"""Diagnosis rules: rule files as data plus a small pure evaluator (features in, findings out)."""

from ._diagnose import diagnose, diagnose_features
from ._evaluate import evaluate, rank_findings, run_checklist
from ._expr import ExprError, parse
from ._load import ChecklistItem, Rule, RuleError, RuleSet, builtin_dir, load_rules, parse_rules
from ._prometheus import export_prometheus, prometheus_rules
from ._provisional import PROVISIONAL_BELOW_STEPS, provisional, provisional_text

__all__ = [
    "diagnose", "diagnose_features", "evaluate", "rank_findings", "run_checklist", "ExprError", "parse",
    "ChecklistItem", "Rule", "RuleError", "RuleSet", "builtin_dir", "load_rules", "parse_rules",
    "export_prometheus", "prometheus_rules", "PROVISIONAL_BELOW_STEPS", "provisional", "provisional_text",
]  # fmt: skip
