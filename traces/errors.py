"""Errors raised when user input breaks a data contract.

Every error names the source (usually a file), the key and the rule that was broken, so the CLI
can print one line such as ``plan.json: tp=3 does not divide num_heads=32`` and exit with code 2.
"""

from __future__ import annotations

import re

# Characters that would break the one-line message (line breaks, other controls); shown escaped.
_BREAKS = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters written as escapes (``\\n``), so that
    a value or key taken from the input cannot split the error line."""
    return _BREAKS.sub(lambda m: repr(m.group())[1:-1], text)


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
        # One line whatever the input held (a key or file name with a newline in it).
        super().__init__(one_line(f"{where}{what}{rule}"))
