"""A job for a reproduction's worker processes that warns as dpopt does: importing it in a worker costs
little (no test module, no pytest)."""

from __future__ import annotations

import warnings

from dpopt import _validate


def problem(key: object) -> str:
    """The problem every job runs on (a worker's ``make_problem``)."""
    return "the problem"


class Warning_:
    """A job that warns (a :class:`~dpopt._validate.DpoptWarning`) and gives 1."""

    def run(self, problem: str) -> int:
        warnings.warn(_validate.DpoptWarning(f"a setting of {problem} means little"), stacklevel=1)
        return 1

    def described(self, problem: str) -> dict[str, str]:
        return {"job": "warning"}
