"""What the commands share: the parser (one-line errors, values that start with a minus sign,
defaults in ``--help``), the request every command parses its arguments into, and the flags of the
algorithms' hyper-parameters (one per field of their parameter dataclasses, :mod:`dpopt.algorithms.params`).

Nothing heavy is imported here: building the parser needs neither torch nor dp_accounting.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, NoReturn, TypeAlias, TypeVar

from .. import _validate, journal
from ..algorithms import registry
from .output import Output

#: A value that starts with a minus sign (``-5:5``, ``-1e-3``, ``-.5``), never an option: argparse
#: takes only plain negative numbers for values and reads ``--feature-bounds -5:5`` as two options.
_NEGATIVE_VALUE = re.compile(r"-[0-9.]")


class Formatter(argparse.HelpFormatter):
    """Help that ends every option's text with its default, where it has one, and keeps the lines of
    a description or an epilog (each line filled on its own)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(super(Formatter, self)._fill_text(line, width, indent) for line in text.splitlines())

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or default is None or default is False or default is argparse.SUPPRESS \
                or default == []:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2, whose option values may start with a minus
    sign followed by a digit or a point (no dpopt option does), and whose help shows defaults."""

    def _get_formatter(self) -> argparse.HelpFormatter:
        return Formatter(prog=self.prog)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"dpopt: error: {message}\n")
        sys.exit(2)

    def _parse_optional(self, arg_string: str) -> tuple[argparse.Action | None, str, str | None] | None:
        if _NEGATIVE_VALUE.match(arg_string):
            return None  # a value (argparse: "not an option")
        return super()._parse_optional(arg_string)


@dataclass(frozen=True, kw_only=True)
class Request:
    """A command's input, parsed once from its arguments and checked there (a bad value raises
    :class:`~dpopt._validate.DpoptError` naming it). ``json``: print one JSON document and nothing
    else on standard output."""

    json: bool = False

    def interrupted(self) -> str:
        """What an interrupted command kept, in words ("": nothing to say)."""
        return ""


R = TypeVar("R", bound=Request)


@dataclass(frozen=True)
class Command(Generic[R]):
    """A subcommand: ``parse`` turns its parsed arguments into its request, ``handle`` does the
    work and says what to show (None: a data-parallel rank other than 0, which shows nothing)."""

    parse: Callable[[argparse.Namespace], R]
    handle: Callable[[R], Output | None]


#: The subcommands of the top-level parser (what ``add_subparsers`` returns).
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def subcommand(commands: Subcommands, name: str, command: Command[R], help_text: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, which runs ``command``, with the ``--json`` flag."""
    sub: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text)
    sub.set_defaults(command=command)
    sub.add_argument("--json", action="store_true", help="print one JSON document on standard output and nothing "
                     "else (warnings and progress go to standard error)")
    return sub


def algorithm_help() -> str:
    return f"one of: {', '.join(registry.REGISTRY.names)}"


def add_data_dir(sub: argparse.ArgumentParser, *, existing: bool = True) -> None:
    """``--data-dir``; ``existing``: refused unless it names a directory (a mistyped path would
    otherwise surface only when a data set is read, after other work)."""
    sub.add_argument("--data-dir", type=existing_directory if existing else str,
                     help="data directory (default: $DPOPT_DATA or the user cache)")


def existing_directory(value: str) -> str:
    """``value`` if it names a directory, else argparse's error naming it."""
    if not Path(value).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"data_dir={value!r} must be an existing directory")
    return value


def add_knobs(sub: argparse.ArgumentParser, command: str, *, helps: Mapping[str, str] | None = None,
              defaults: Mapping[str, object] | None = None) -> None:
    """One flag, ``--name-with-dashes``, per hyper-parameter that ``command`` sets
    (:meth:`~dpopt.algorithms.registry.Registry.flags` of the registry in use), typed, defaulted and
    explained as its parameter dataclass declares it (:func:`~dpopt.algorithms.params.knob`);
    ``defaults`` and ``helps`` override (e.g. the audit's smaller batches)."""
    for name, field in registry.REGISTRY.flags(command).items():
        declared = field.metadata
        default = (defaults or {}).get(name, field.default)
        choices = declared["choices"]
        kind = str if choices else declared["kind"] or type(field.default)
        sub.add_argument(f"--{name.replace('_', '-')}", type=kind, choices=choices, default=default,
                         help=(helps or {}).get(name, declared["help"]))


def knobs_of(args: argparse.Namespace, command: str) -> dict[str, object]:
    """The hyper-parameters ``command`` sets, as the command line gave them, by their names; a value
    out of its declared range (None: off or the algorithm's default) is refused naming its flag."""
    flags = registry.REGISTRY.flags(command)
    given = {name: getattr(args, name) for name in flags}
    for name, value in given.items():
        check = flags[name].metadata["check"]
        if check is not None and value is not None:
            check(f"--{name.replace('_', '-')}", value)
    return given


def add_seed(sub: argparse.ArgumentParser, what: str) -> None:
    """``--seed N`` or ``--seed-file PATH``, one of them (both: argparse's one-line error, exit 2):
    ``what`` the seed does. A seed on the command line shows in ``ps`` and the shell's history; a
    file that only its owner may read keeps it out of both (:func:`seed_of` reads it)."""
    given = sub.add_mutually_exclusive_group()
    given.add_argument("--seed", type=int, help=f"{what}; a seed given here shows in `ps` and the shell's history: "
                       "prefer --seed-file")
    given.add_argument("--seed-file", metavar="PATH", help="the same as --seed, read from a file that holds one "
                       "integer >= 0 and that only its owner may read or write (chmod 600), so that the seed stays out "
                       "of `ps` and the shell's history")


def seed_of(args: argparse.Namespace) -> int | None:
    """The seed :func:`add_seed`'s flags give: ``--seed``, the integer held in ``--seed-file``, or None.
    The file is refused unless it is the user's own and neither group nor others may read or write it
    (:func:`dpopt.journal.owner_only`), or if it holds anything but one integer >= 0 (surrounding
    white space allowed); no error shows its content."""
    if args.seed_file is None:
        return args.seed
    path, name = Path(args.seed_file).expanduser(), f"seed_file={args.seed_file!r}"
    try:
        journal.owner_only(path, name, f"chmod 600 {str(path)!r}", risk="anyone who can read it knows the seed the "
                           "guarantee rests on, anyone who can write it can set a seed of their choosing")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        why = (err.strerror if isinstance(err, OSError) else None) or "not text"
        raise _validate.DpoptError(f"{name} cannot be read ({why}): give "
                                   "a file that holds the seed, one integer >= 0") from None
    if not re.fullmatch(r"\s*[0-9]{1,100}\s*", text):
        raise _validate.DpoptError(f"{name} must hold one integer >= 0 (at most 100 digits) and nothing else; its "
                                   "content is not shown here: it is secret")
    return int(text)


def add_delta(sub: argparse.ArgumentParser) -> None:
    """``--delta`` and ``--allow-large-delta`` (run, tune): the plan refuses δ >= 1/n unless allowed."""
    sub.add_argument("--delta", type=float, default=1e-5, help="the δ of the guarantee (below 1/n)")
    sub.add_argument("--allow-large-delta", action="store_true", help="accept --delta >= 1/n knowingly (refused "
                     "by default: with δ >= 1/n, publishing each record whole with probability δ meets the "
                     "guarantee)")
