"""Read rule files (YAML) and check them against the rule schema, reporting every error at once.

The YAML is composed into nodes (not plain objects) so that each error can say ``file:line``, the
way promtool does for Prometheus rule files. Loading does file I/O; everything after it is pure.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import string
from dataclasses import dataclass, field

import yaml

from ranksight.collectors import CONTEXT, FEATURES

from ._expr import Expr, ExprError, parse

AXES = ("data_pipeline", "sync", "parallelism")
SEVERITIES = ("info", "warning", "critical")
GROUPS = ("graph capture", "memory planning", "kernels")
COMPARES = (">=", "<=")
FRAMEWORKS = ("plain", "lightning", "transformers", "accelerate", "run")
COST_BASES = ("measured", "estimate", "unmeasured")
"""How a cost was reached; ``unmeasured`` is time no phase explains, ranked after every measured finding
of the same severity."""
LOUD_FLOORS = (("warning", 0.03), ("critical", 0.20))
"""The least cost (share of the step) at which any finding may be a warning or critical, whatever its rule
says: below 3 % it is hygiene (info, still listed with its fix), below 20 % at most a warning. A rule with
no time cost may be loud only as a ``risk`` (an OOM ahead, say), whose text says why."""
COST_LEVELS = (("info", 0.03), ("warning", 0.10), ("critical", 0.25))
"""Severity bands of a rule's cost (share of step time a fix gives back) when the rule gives no levels:
3 % is worth a line, 10 % (1.11x faster) is worth fixing, 25 % (1.33x) comes first."""
TEMPLATE_NAMES = ("ranks", "value", "cost_share", "speedup")
"""Names every template may use beside features, context and the rule's ``suggest`` values."""
_ID = re.compile(r"^[a-z][a-z0-9-]*$")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_DURATION = re.compile(r"^[0-9]+[smhd]$")
_RULE_KEYS = {
    "id", "axis", "title", "when", "value", "compare", "levels", "severity", "confidence", "evidence",
    "summary", "fix", "explains", "priority", "prometheus", "cost", "noise", "cost_basis", "suggest", "symptom",
    "risk", "agree",
}  # fmt: skip
_FIX_KEYS = ("text", "snippet", "cases", "frameworks")
_CASE_KEYS = ("when", "text", "snippet", "frameworks")
_ITEM_KEYS = {"item", "group", "value", "compare", "warn", "fail", "when"}


class RuleError(ValueError):
    """One or more rule files are invalid; the message lists every error as ``file:line: what``."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__(f"{len(errors)} error(s) in rule files:\n" + "\n".join(f"  {e}" for e in errors))


@dataclass(frozen=True)
class FixVariant:
    """Fix text and snippet for one situation: a case (``when``) or a framework; None keeps the default."""

    text: str | None = None
    snippet: str | None = None
    when: Expr | None = None
    frameworks: dict = field(default_factory=dict)  # framework -> FixVariant (text/snippet only)


@dataclass(frozen=True)
class Rule:
    """One diagnosis rule: when it fires, how bad it is, what to say and what to change."""

    id: str
    axis: str
    title: str
    summary: str
    fix_text: str
    fix_snippet: str
    when: Expr | None = None
    value: Expr | None = None
    compare: str = ">="
    levels: tuple = ()  # ((severity, threshold), ...) from the least to the most severe
    severity: str | None = None  # fixed severity, for rules without levels
    confidence: float = 1.0
    evidence: tuple = ()
    explains: tuple = ()
    explains_when: dict = field(default_factory=dict)  # rule id -> Expr: explains it only where this holds
    priority: int = 0
    prometheus: dict | None = None
    source: str = ""
    cost: Expr | None = None  # share of step time a fix gives back (0-1)
    noise: Expr | None = None  # uncertainty of the value compared with the levels
    cost_basis: str = "measured"
    suggest: tuple = ()  # ((name, Expr), ...): values fix templates are filled with
    fix_cases: tuple = ()  # FixVariant with `when`, first that holds wins
    fix_frameworks: dict = field(default_factory=dict)  # framework -> FixVariant
    symptom: bool = False  # names an effect: a cause that explains it ranks ahead but keeps its own cost
    risk: str | None = None  # why a finding with no time cost may be loud (appended to its summary)
    agree: tuple = ()  # ((check Expr, says template), ...): other measures of the figure the rule rests on


@dataclass(frozen=True)
class ChecklistItem:
    """One line of the tuning checklist: pass, warn, fail or n/a."""

    item: str
    group: str
    value: Expr
    compare: str
    warn: float
    fail: float
    when: Expr | None = None
    source: str = ""


@dataclass
class RuleSet:
    """Rules and checklist items from one or more files."""

    rules: list[Rule] = field(default_factory=list)
    checklist: list[ChecklistItem] = field(default_factory=list)


def builtin_dir() -> str:
    """The folder of rule files shipped with ranksight."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin")


def load_rules(rules_dir: str | None = None, include_builtin: bool = True) -> RuleSet:
    """Load the built-in rules plus every ``*.yaml``/``*.yml`` in ``rules_dir``; raise RuleError listing all errors.

    A user rule with the id of a built-in one replaces it (so thresholds can be tuned per cluster).
    """
    paths = sorted(glob.glob(os.path.join(builtin_dir(), "*.yaml"))) if include_builtin else []
    if rules_dir is not None:
        if not os.path.isdir(rules_dir):
            raise RuleError([f"{rules_dir}: not a directory"])
        user = sorted(glob.glob(os.path.join(rules_dir, "*.yaml")) + glob.glob(os.path.join(rules_dir, "*.yml")))
        if not user:
            raise RuleError([f"{rules_dir}: no *.yaml rule files"])
        paths += user
    errors: list[str] = []
    merged, by_id = RuleSet(), {}  # a later rule of the same id takes the earlier one's place
    for path in paths:
        part, part_errors = _read_rules(path, builtin=path.startswith(builtin_dir() + os.sep))
        errors += part_errors
        by_id.update((rule.id, rule) for rule in part.rules)
        merged.checklist.extend(part.checklist)
    merged.rules = list(by_id.values())
    unknown = [(rule, other) for rule in merged.rules for other in rule.explains if other not in by_id]
    errors += [f"{rule.source}: rule {rule.id!r} explains unknown rule {other!r}" for rule, other in unknown]
    if errors:
        raise RuleError(errors)
    return merged


_READ: dict[str, tuple] = {}
"""path -> (stamp, rules, errors) of each rule file read: a diagnosis runs on every dashboard refresh, and
parsing the YAML again was a seventh of it. Built-in files are read once per process; a user's file again
when its modification time or size changes."""


def _read_rules(path: str, builtin: bool) -> tuple[RuleSet, list[str]]:
    """One rule file's rules and errors (``path[:line]: what``), from ``_READ`` while the file is unchanged."""
    try:
        stamp = "built-in" if builtin else ((st := os.stat(path)).st_mtime_ns, st.st_size)
    except OSError:
        stamp = None  # unreadable: read to say why, and not kept
    if stamp is not None and _READ.get(path, (None,))[0] == stamp:
        return _READ[path][1:]
    errors: list[str] = []
    text, part = _read_text(path, errors), None
    if text is not None and builtin and hasattr(yaml, "CSafeLoader"):
        # libyaml's composer makes the same nodes ~10x faster (0.4 s of a first diagnosis); on any problem (a
        # RuleError included) the pure-Python reading below says what is wrong, as it does for any other file.
        with contextlib.suppress(Exception):
            part = parse_rules(text, path, loader=yaml.CSafeLoader)
    if part is None:
        part = RuleSet() if text is None else parse_rules(text, path, errors)
    if stamp is not None:
        _READ[path] = (stamp, part, errors)
    return part, errors


def _read_text(path: str, errors: list[str]) -> str | None:
    """A rule file's text, or None with a ``path[:line]: what`` error (unreadable, or not UTF-8)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        errors.append(f"{path}: cannot read ({exc.strerror})")
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        errors.append(f"{path}:{line}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it as UTF-8")
        return None


def parse_rules(
    text: str, path: str = "<string>", errors: list[str] | None = None, *, loader=yaml.SafeLoader
) -> RuleSet:
    """Parse one rule file's text; append errors (``path:line: message``) to ``errors`` or raise RuleError."""
    own = errors is None
    errors = [] if own else errors
    out, root = RuleSet(), None
    try:
        root = yaml.compose(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        errors.append(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}")
    except RecursionError:  # the composer recurses once per nested list or mapping
        errors.append(f"{path}: YAML nested too deeply to read")
    if root is not None:
        start = len(errors)
        _Checker(path, errors, out).file(root)
        errors[start:] = sorted(errors[start:], key=_line_of)
    if own and errors:
        raise RuleError(errors)
    return out


MAX_FORMAT_NUMBER = 200
"""Largest width or precision a template's format spec may ask for (``{x:>12}``, ``{x:.3f}``): a
summary is one line, and ``{x:>300000000}`` would print 300 MB."""
_SPEC_NUMBER = re.compile(r"\d+")


def format_spec_problem(spec: str) -> str | None:
    """What is wrong with a template field's format spec, or None: a nested ``{field}`` (its width would
    come from the run's data) or a width or precision over ``MAX_FORMAT_NUMBER``."""
    if "{" in spec or "}" in spec:
        return "takes its format from another field; write the width and precision as numbers"
    # int() of a very long digit string is refused by Python itself: cap what is converted.
    largest = max((int(n[-12:]) if len(n.lstrip("0")) <= 12 else 10**12 for n in _SPEC_NUMBER.findall(spec)), default=0)
    if largest > MAX_FORMAT_NUMBER:
        shown = f"{largest:,}" if largest < 10**12 else "over a trillion"
        return f"asks for a width or precision of {shown}; the limit is {MAX_FORMAT_NUMBER}"
    return None


def _line_of(error: str) -> int:
    """The line number of a ``path:line: message`` error (0 when it has none)."""
    tail = error.split(": ", 1)[0].rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class _Checker:
    """Walk the composed YAML nodes, collecting errors with line numbers and building rules."""

    def __init__(self, path: str, errors: list[str], out: RuleSet) -> None:
        self.path, self.errors, self.out = path, errors, out
        self._constructor = yaml.SafeLoader("")  # one per file: making one per value was a third of it

    def err(self, node, message: str) -> None:
        """Record an error at the node's line; None, so ``return self.err(...)`` drops what was being read."""
        self.errors.append(f"{self.path}:{node.start_mark.line + 1}: {message}")

    def unknown_keys(self, m: dict, allowed, say) -> bool:
        """Report each key of ``m`` not in ``allowed`` (``say(key)`` is its message); True when there was one."""
        bad = [(key, knode) for key, (knode, _) in m.items() if key not in allowed]
        for key, knode in bad:
            self.err(knode, say(key))
        return bool(bad)

    def mapping(self, node, what: str) -> dict | None:
        if not isinstance(node, yaml.MappingNode):
            return self.err(node, f"{what} must be a mapping")
        items = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                self.err(key, f"{what}: keys must be plain names")
                continue
            if key.value in items:
                self.err(key, f"{what}: duplicate key {key.value!r}")
            items[key.value] = (key, value)
        return items

    def scalar(self, node, what: str, kinds=(str,)):
        if not isinstance(node, yaml.ScalarNode):
            return self.err(node, f"{what} must be a single value")
        try:
            value = self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError:
            value = None
        if isinstance(value, bool) and bool not in kinds:
            value = None
        if value is None or not isinstance(value, kinds):
            names = "/".join("number" if k in (int, float) else k.__name__ for k in kinds)
            return self.err(node, f"{what} must be a {names}, got {node.value!r}")
        return value

    def opt(self, m: dict, key: str, what: str, default=None, kinds=(str,)):
        """An optional key's single value, ``default`` when it is absent."""
        return self.scalar(m[key][1], what, kinds) if key in m else default

    def number(self, node, what: str):
        value = self.scalar(node, what, (int, float))
        return float(value) if value is not None else None

    def expr(self, node, what: str, extra=frozenset()) -> Expr | None:
        text = self.scalar(node, what, (str, int, float))
        if text is None:
            return None
        try:
            expr = parse(text)
        except ExprError as exc:
            return self.err(node, f"{what}: {exc}")
        unknown = sorted(n for n in expr.names if n not in FEATURES and n not in extra)
        if unknown:
            return self.err(node, f"{what}: unknown feature(s) {', '.join(unknown)} (see docs/rules.md for the list)")
        return expr

    def file(self, root) -> None:
        top = self.mapping(root, "a rule file")
        if top is None:
            return
        self.unknown_keys(
            top, ("rules", "checklist"), lambda k: f"unknown top-level key {k!r} (expected rules, checklist)"
        )
        if "rules" not in top and "checklist" not in top:
            self.err(root, "a rule file needs a 'rules' or a 'checklist' list")
        for key, handler, out in (("rules", self.rule, self.out.rules), ("checklist", self.item, self.out.checklist)):
            seq = top[key][1] if key in top else None
            if seq is not None and not isinstance(seq, yaml.SequenceNode):
                self.err(seq, f"{key} must be a list")
            elif seq is not None:
                out.extend(built for built in map(handler, seq.value) if built is not None)

    def rule(self, node) -> Rule | None:
        m = self.mapping(node, "a rule")
        if m is None:
            return None
        start = len(self.errors)  # a rule with any error is not built
        self.unknown_keys(m, _RULE_KEYS, lambda k: f"unknown rule key {k!r}")
        for key in ("id", "axis", "title", "summary", "fix"):
            if key not in m:
                self.err(node, f"rule is missing {key!r}")
        rid = self.opt(m, "id", "id")
        if rid is not None and not _ID.match(rid):
            rid = self.err(m["id"][1], f"id {rid!r} must be lower-case letters, digits and dashes")
        where = f"rule {rid!r}" if rid else "rule"
        axis = self.opt(m, "axis", f"{where}: axis")
        if axis is not None and axis not in AXES:
            axis = self.err(m["axis"][1], f"{where}: axis must be one of {', '.join(AXES)}, got {axis!r}")
        title = self.opt(m, "title", f"{where}: title")
        exprs = {k: self.expr(m[k][1], f"{where}: {k}") for k in ("when", "value", "cost", "noise") if k in m}
        when, value, cost, noise = (exprs.get(k) for k in ("when", "value", "cost", "noise"))
        compare = self.opt(m, "compare", f"{where}: compare", ">=")
        if compare not in COMPARES:
            self.err(m["compare"][1], f"{where}: compare must be '>=' or '<='")
        levels, severity = self.rule_severity(m, node, where, compare)
        if "noise" in m and levels is None:
            self.err(m["noise"][1], f"{where}: noise needs levels (it widens the value compared with them)")
        cost_basis = self.opt(m, "cost_basis", f"{where}: cost_basis", "measured")
        if cost_basis not in COST_BASES or ("cost_basis" in m and "cost" not in m):
            cost_basis = self.err(
                m["cost_basis"][1], f"{where}: cost_basis must be one of {', '.join(COST_BASES)}, beside a 'cost'"
            )
        confidence = self.number(m["confidence"][1], f"{where}: confidence") if "confidence" in m else 1.0
        if confidence is not None and not 0 < confidence <= 1:
            confidence = self.err(m["confidence"][1], f"{where}: confidence must be in (0, 1]")
        evidence = self.evidence(m["evidence"][1], where) if "evidence" in m else ()
        explains, explains_when = self.explains(m["explains"][1], where) if "explains" in m else ((), {})
        priority = self.opt(m, "priority", f"{where}: priority", 0, (int,))
        symptom = self.opt(m, "symptom", f"{where}: symptom", False, (bool,))
        risk = self.opt(m, "risk", f"{where}: risk")
        if "risk" in m and "cost" in m:
            self.err(m["risk"][1], f"{where}: 'risk' is for a rule with no time cost; this one has a 'cost'")
        suggest = self.suggest(m["suggest"][1], where) if "suggest" in m else ()
        names = {n for n, _ in suggest}
        agree = self.agree(m["agree"][1], where, names) if "agree" in m else ()
        summary = self.template(m, "summary", where, "summary", names)
        fix = self.fix(m["fix"][1], where, names) if "fix" in m else None
        prometheus = self.prometheus(m["prometheus"][1], where, levels) if "prometheus" in m else None
        if len(self.errors) > start:  # what is None (missing, not valid, no levels nor severity) was said too
            return None
        base, cases = fix
        return Rule(
            id=rid, axis=axis, title=title, summary=summary, fix_text=base.text, fix_snippet=base.snippet or "",
            when=when, value=value if value is not None else (cost if levels else None), compare=compare,
            levels=levels or (), severity=severity, confidence=confidence, evidence=evidence, explains=explains,
            explains_when=explains_when, priority=priority, prometheus=prometheus, cost=cost, noise=noise,
            cost_basis=cost_basis, suggest=suggest, fix_cases=cases, fix_frameworks=base.frameworks,
            symptom=symptom, risk=risk, agree=agree, source=f"{self.path}:{node.start_mark.line + 1}",
        )  # fmt: skip

    def agree(self, node, where: str, names: set) -> tuple:
        """``agree``: a list of ``{check: expr, says: template}``, each an independent measure of the figure the
        rule rests on; where a check is known and false, the finding says so and drops a level."""
        if not isinstance(node, yaml.SequenceNode):
            return self.err(node, f"{where}: agree must be a list of {{check, says}}")
        out = []
        for item in node.value:
            m = self.mapping(item, f"{where}: an agree entry")
            if m is None:
                continue
            self.unknown_keys(
                m, ("check", "says"), lambda k: f"{where}: unknown agree key {k!r} (expected check, says)"
            )
            if "check" not in m or "says" not in m:
                self.err(item, f"{where}: an agree entry needs a 'check' and a 'says'")
                continue
            check = self.expr(m["check"][1], f"{where}: agree check")
            says = self.template(m, "says", where, "agree says", names)
            if check is not None and says is not None:
                out.append((check, says))
        return tuple(out)

    def rule_severity(self, m: dict, node, where: str, compare: str):
        if "levels" in m and "severity" in m:
            self.err(node, f"{where}: give either 'levels' (with 'value' or 'cost') or a fixed 'severity', not both")
            return None, None
        if "severity" in m:
            sev = self.scalar(m["severity"][1], f"{where}: severity")
            if sev not in SEVERITIES:
                return self.err(m["severity"][1], f"{where}: severity must be one of {', '.join(SEVERITIES)}"), None
            return None, sev
        if "levels" not in m:
            if "cost" in m and "value" not in m:
                return COST_LEVELS, None  # the cost's default bands
            self.err(node, f"{where}: give 'levels' (with 'value'), a 'cost' (default levels) or a fixed 'severity'")
            return None, None
        if "value" not in m and "cost" not in m:
            self.err(node, f"{where}: 'levels' needs a 'value' (or a 'cost') expression to compare")
        return self.levels(m["levels"][1], f"{where}: levels", compare), None

    def levels(self, node, what: str, compare: str):
        """``{info: x, warning: y, critical: z}`` -> ((severity, threshold), ...) from least to most severe."""
        lm = self.mapping(node, what)
        if not lm:  # not a mapping (said), or an empty one
            return None if lm is None else self.err(node, f"{what} must name at least one severity")
        levels = []
        for sev, (knode, vnode) in lm.items():
            if sev not in SEVERITIES:
                return self.err(knode, f"{what}: unknown severity {sev!r} (info, warning, critical)")
            threshold = self.number(vnode, f"{what}.{sev}")
            if threshold is None:
                return None
            levels.append((sev, threshold))
        levels.sort(key=lambda lv: SEVERITIES.index(lv[0]))
        thresholds = [t for _, t in levels]
        if thresholds != sorted(thresholds, reverse=compare != ">="):
            return self.err(node, f"{what}: thresholds must get stricter from info to critical (compare {compare})")
        return tuple(levels)

    def evidence(self, node, where: str):
        """The feature names a finding shows as its evidence; None when one is not a feature."""
        if not isinstance(node, yaml.SequenceNode):
            return self.err(node, f"{where}: evidence must be a list")
        names = []
        for item in node.value:
            name = self.scalar(item, f"{where}: evidence entry")
            if name is None:
                return None
            if name not in FEATURES:
                return self.err(item, f"{where}: unknown feature {name!r} in evidence")
            names.append(name)
        return tuple(names)

    def explains(self, node, where: str):
        """``explains: [rule-id, {rule-id: condition}, ...]`` -> (ids, {id: condition}); (None, {}) when malformed.
        A condition (over the cause's features) limits the claim to the jobs where the causal link holds."""
        if not isinstance(node, yaml.SequenceNode):
            return self.err(node, f"{where}: explains must be a list"), {}
        ids, conditions = [], {}
        for item in node.value:
            if isinstance(item, yaml.MappingNode) and len(item.value) == 1:
                knode, cnode = item.value[0]
                name = self.scalar(knode, f"{where}: explains entry")
                cond = self.expr(cnode, f"{where}: explains.{name}")
                if name is None or cond is None:
                    return None, {}
                conditions[name] = cond
            else:
                name = self.scalar(item, f"{where}: explains entry (a rule id, or {{rule-id: condition}})")
                if name is None:
                    return None, {}
            ids.append(name)
        return tuple(ids), conditions

    def suggest(self, node, where: str):
        """``suggest: {name: expression}`` (values for the fix templates) -> the valid entries, which still check
        the templates, so one bad entry does not hide the rule's other errors."""
        out = []
        for name, (knode, vnode) in (self.mapping(node, f"{where}: suggest") or {}).items():
            if not _NAME.match(name) or name in FEATURES or name in CONTEXT or name in TEMPLATE_NAMES:
                self.err(knode, f"{where}: suggest name {name!r} must be a new lower_case name (not a feature)")
                continue
            expr = self.expr(vnode, f"{where}: suggest.{name}", extra={n for n, _ in out})
            out += [(name, expr)] if expr is not None else []
        return tuple(out)

    def template(self, m: dict, key: str, where: str, what: str, names) -> str | None:
        """The template under ``key``, or None (absent, or wrong: said)."""
        text = self.opt(m, key, f"{where}: {what}")
        if text is None:
            return None
        node = m[key][1]
        try:
            parsed = [(f, spec) for _, f, spec, _ in string.Formatter().parse(text) if f is not None]
        except ValueError as exc:
            return self.err(node, f"{where}: {what} template: {exc}")
        bad_specs = [(f, spec, problem) for f, spec in parsed if (problem := format_spec_problem(spec))]
        for f, spec, problem in bad_specs:
            shown = spec if len(spec) <= 30 else spec[:27] + "..."
            self.err(node, f"{where}: {what} template: {{{f}:{shown}}} {problem}")
        if bad_specs:
            return None
        unknown = [f for f, _ in parsed if f not in TEMPLATE_NAMES and f not in FEATURES and f not in CONTEXT]
        unknown = [n for n in dict.fromkeys(unknown) if n not in names]
        if unknown:
            shown = ", ".join(f"{{{n}}}" for n in unknown)
            self.err(
                node,
                f"{where}: {what} names {shown}, which is not a feature, a context name, a suggest value, "
                "'value', 'ranks', 'cost_share' or 'speedup' (write {{ and }} for literal braces)",
            )
            return None
        return text

    def fix(self, node, where: str, names):
        """``fix: {text, snippet, cases: [{when, text, snippet, frameworks}], frameworks: {name: {text, snippet}}}``
        -> (base FixVariant, cases), or None; every part is checked, errors or not."""
        start = len(self.errors)
        base, fm = self.fix_variant(node, where, "fix", names, required_text=True, allow=_FIX_KEYS)
        seq = fm["cases"][1] if fm is not None and "cases" in fm else None
        if seq is not None and not isinstance(seq, yaml.SequenceNode):
            return self.err(seq, f"{where}: fix.cases must be a list")
        cases = []
        for i, case in enumerate(seq.value if seq is not None else ()):
            cases.append(self.fix_variant(case, where, f"fix.cases[{i}]", names, allow=_CASE_KEYS)[0])
        return (base, tuple(cases)) if len(self.errors) == start else None

    def fix_variant(self, node, where: str, what: str, names, required_text=False, allow=("text", "snippet")):
        """A fix, one of its cases or a framework's variant: (its FixVariant, None when any part is wrong; its
        key -> (key node, value node) mapping, None when it is not a mapping)."""
        start, fm = len(self.errors), self.mapping(node, f"{where}: {what}")
        if fm is None:
            return None, None
        self.unknown_keys(fm, allow, lambda k: f"{where}: {what} has unknown key {k!r} ({', '.join(allow)})")
        if required_text and "text" not in fm:
            self.err(node, f"{where}: {what} needs a 'text'")
        text, snippet = (self.template(fm, key, where, f"{what}.{key}", names) for key in ("text", "snippet"))
        frameworks = {}
        if "frameworks" in fm and "frameworks" in allow:
            variants = self.mapping(fm["frameworks"][1], f"{where}: {what}.frameworks") or {}
            for name, (knode, vnode) in variants.items():
                if name not in FRAMEWORKS:
                    self.err(knode, f"{where}: {what}.frameworks: unknown framework {name!r} ({', '.join(FRAMEWORKS)})")
                    continue
                frameworks[name] = self.fix_variant(vnode, where, f"{what}.frameworks.{name}", names)[0]
        when = None
        if "when" in allow and "when" not in fm:
            self.err(node, f"{where}: {what} needs a 'when'")
        elif "when" in allow:
            when = self.expr(fm["when"][1], f"{where}: {what}.when", extra=names)
        ok = len(self.errors) == start
        return FixVariant(text, snippet, when, frameworks) if ok else None, fm

    def prometheus(self, node, where: str, levels):
        pm = self.mapping(node, f"{where}: prometheus")
        if pm is None:
            return None
        if self.unknown_keys(
            pm, ("expr", "for", "levels"), lambda k: f"{where}: prometheus has unknown key {k!r} (expr, for, levels)"
        ):
            return None
        if "levels" in pm:  # thresholds in the series' own units, where the series is not the rule's value
            levels = self.levels(pm["levels"][1], f"{where}: prometheus.levels", ">=")
            if levels is None:
                return None
        if "expr" not in pm:
            return self.err(node, f"{where}: prometheus needs an 'expr' (PromQL with {{threshold}})")
        expr = self.scalar(pm["expr"][1], f"{where}: prometheus.expr")
        duration = self.opt(pm, "for", f"{where}: prometheus.for", "5m")
        if expr is None or duration is None:
            return None
        if not _DURATION.match(duration):
            return self.err(pm["for"][1], f"{where}: prometheus.for must look like 5m, 30s, 1h")
        if levels and "{threshold}" not in expr:
            return self.err(pm["expr"][1], f"{where}: prometheus.expr must contain {{threshold}} (filled per level)")
        return {"expr": expr, "for": duration, "levels": levels if "levels" in pm else None}

    def item(self, node) -> ChecklistItem | None:
        m = self.mapping(node, "a checklist item")
        if m is None:
            return None
        if self.unknown_keys(m, _ITEM_KEYS, lambda k: f"unknown checklist key {k!r}"):
            return None
        missing = [k for k in ("item", "group", "value", "warn", "fail") if k not in m]
        if missing:
            return self.err(node, f"checklist item is missing {', '.join(missing)}")
        name = self.scalar(m["item"][1], "checklist item")
        where = f"checklist item {name!r}"
        group = self.scalar(m["group"][1], f"{where}: group")
        if group is not None and group not in GROUPS:
            group = self.err(m["group"][1], f"{where}: group must be one of {', '.join(GROUPS)}")
        value = self.expr(m["value"][1], f"{where}: value")
        when = self.expr(m["when"][1], f"{where}: when") if "when" in m else None
        compare = self.opt(m, "compare", f"{where}: compare", ">=")
        if compare not in COMPARES:
            return self.err(m["compare"][1], f"{where}: compare must be '>=' or '<='")
        warn, fail = self.number(m["warn"][1], f"{where}: warn"), self.number(m["fail"][1], f"{where}: fail")
        if warn is not None and fail is not None and (fail < warn if compare == ">=" else fail > warn):
            return self.err(m["fail"][1], f"{where}: fail must be stricter than warn (compare {compare})")
        if None in (name, group, value, warn, fail) or ("when" in m and when is None):
            return None
        return ChecklistItem(name, group, value, compare, warn, fail, when, f"{self.path}:{node.start_mark.line + 1}")
