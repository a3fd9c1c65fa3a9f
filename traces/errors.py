"""Errors raised when user input breaks a data contract.

Every error names the source (usually a file), the key and the rule that was broken, so the CLI
can print one line such as ``plan.json: tp=3 does not divide num_heads=32`` and exit with code 2.
"""

from __future__ import annotations


class ContractError(ValueError):
    """Input that violates a MindPipe data contract.

    Attributes:
        source: Where the input came from (a file path, a built-in name, or ``"<dict>"``).
        key: The offending key (dotted for nested keys), or ``None`` for whole-document errors.
        rule: Human-readable statement of the rule that was broken.
    """

    def __init__(self, source: str, key: str | None, rule: str) -> None:
        self.source = source
        self.key = key
        self.rule = rule
        where = f"{source}: " if source else ""
        what = f"{key}: " if key and not rule.startswith(key) else ""
        super().__init__(f"{where}{what}{rule}")
