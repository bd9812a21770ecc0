"""The ``dpopt`` command line: ``account | calibrate | run | audit | reproduce | tune | bench | data``.

One module per command (:mod:`~dpopt.cli.account` holds ``account`` and ``calibrate``), each with
its parser section, a typed request parsed once from the arguments and checked there, and a
handler taking the request (:class:`~dpopt.cli.common.Command`); :mod:`~dpopt.cli.common` holds
the parser and the shared flags, :mod:`~dpopt.cli.output` the one output convention: a short
summary for a person (a small table of the key numbers and the paths written), or with ``--json``
one strict-JSON document and nothing else on standard output. Warnings and progress go to
standard error. ``--help`` shows every option's default.

Exit codes: 0 done; 2 invalid input or a failure, with one line ``dpopt: error: <argument>=<value>
must be …`` and no traceback; 3 a ``run`` that diverged (θ or its objective not finite), after
writing what it has; 130 interrupted (Ctrl-C), saying what was kept.

Each command imports what it needs when it runs: the parser, ``account`` and ``calibrate`` start
without torch (``tests/test_cli_start.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import sys
import warnings
from collections.abc import Iterator, Sequence

from .. import _validate
from . import account, audit, bench, data, reproduce, run, tune
from .common import Command, Parser, Request
from .output import EXIT_DIVERGED, Output

__all__ = ["EXIT_DIVERGED", "main", "parser"]


def parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    top = Parser(prog="dpopt", description=__doc__.splitlines()[0].replace("``", ""))
    top.add_argument("--version", action="version", version=f"dpopt {importlib.metadata.version('dpopt')}")
    commands = top.add_subparsers(dest="name", required=True, parser_class=Parser, metavar="COMMAND")
    for module in (account, run, audit, reproduce, tune, bench, data):
        module.add_parser(commands)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpopt`` console script."""
    args = parser().parse_args(argv)
    command: Command[Request] = args.command
    request: Request | None = None
    try:
        with _warnings_in_one_line():
            request = command.parse(args)
            output: Output | None = command.handle(request)
    except _validate.DpoptError as err:
        sys.stderr.write(f"dpopt: error: {err}\n")
        return 2
    except KeyboardInterrupt as err:
        kept = str(err) or ("" if request is None else request.interrupted())
        sys.stderr.write(f"dpopt: interrupted{'; ' + kept if kept else ''}\n")
        return 130
    if output is None:  # a data-parallel rank other than 0 (torchrun): rank 0 prints
        return 0
    return output.show(request.json)


@contextlib.contextmanager
def _warnings_in_one_line() -> Iterator[None]:
    """dpopt's own warnings as one line ``dpopt: warning: …`` (:func:`dpopt._validate.warnings_in_one_line`)
    while a command runs; the warning settings as they were after."""
    with warnings.catch_warnings():
        _validate.warnings_in_one_line()
        yield
