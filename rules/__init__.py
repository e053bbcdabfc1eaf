"""Diagnosis rules: rule files as data plus a small pure evaluator (features in, findings out)."""

__all__: list[str] = []
