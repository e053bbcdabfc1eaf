"""``ranksight rules check|export``: validate rule files; export them as Prometheus alerting rules."""

from __future__ import annotations

import sys

from ._errors import UserError


def add_parser(sub):
    p = sub.add_parser(
        "rules",
        help="check rule files, or export the rules as Prometheus alerting rules",
        description="Check rule files (every error with file:line) or export them as Prometheus alerting rules.",
    )
    actions = p.add_subparsers(dest="rules_action", metavar="ACTION")
    check = actions.add_parser("check", help="validate the built-in rules plus DIR's rule files")
    check.add_argument("rules_dir", nargs="?", default=None, help="folder of *.yaml rule files (default: built-in)")
    export = actions.add_parser("export", help="print the rules in another system's format")
    export.add_argument("--prometheus", action="store_true", required=True, help="Prometheus alerting rules (YAML)")
    export.add_argument("--rules", metavar="DIR", default=None, help="extra rule files to include")
    export.add_argument("-o", "--output", default="-", help="write to this file instead of stdout")
    return p


def run(args) -> int:
    from ranksight.rules import RuleError, export_prometheus, load_rules

    action = getattr(args, "rules_action", None)
    if action is None:
        raise UserError("choose an action: check or export (see ranksight rules -h)")
    rules_dir = args.rules_dir if action == "check" else args.rules
    try:
        ruleset = load_rules(rules_dir)
    except RuleError as exc:
        if action == "check":
            print(str(exc), file=sys.stderr)
            return 1
        raise UserError(str(exc)) from None
    if action == "check":
        print(f"ok: {len(ruleset.rules)} rules, {len(ruleset.checklist)} checklist items")
        return 0
    text = export_prometheus(ruleset.rules)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise UserError(f"cannot write {args.output}: {exc.strerror}") from None
    return 0
