"""``dpopt data list | info NAME | fetch NAME``: the registered data sets."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import _validate
from .common import Command, Request, add_data_dir, Subcommands, subcommand
from .output import Output

ACTIONS = ("list", "info", "fetch")
#: The facts of a data set ``list`` and ``info`` show in their tables.
FACTS = ("name", "task", "n_train", "n_test", "dim", "bundled")


@dataclass(frozen=True, kw_only=True)
class ListRequest(Request):
    """The registered data sets, and the folder their files are looked for in (``data_dir``; None:
    the default folder)."""

    data_dir: str | None


@dataclass(frozen=True, kw_only=True)
class NamedRequest(Request):
    """``info`` or ``fetch`` (into ``data_dir``; None: the default folder) of the data set ``name``."""

    action: str
    name: str
    data_dir: str | None


def parse(args: argparse.Namespace) -> ListRequest | NamedRequest:
    from .. import data

    if args.action == "list":
        return ListRequest(data_dir=args.data_dir, json=args.json)
    if args.name is None:
        raise _validate.DpoptError(f"`dpopt data {args.action}` needs a data set name: one of "
                                   f"{', '.join(data.names())}")
    return NamedRequest(action=args.action, name=args.name, data_dir=args.data_dir, json=args.json)


def handle(request: ListRequest | NamedRequest) -> Output:
    from .. import data

    if isinstance(request, ListRequest):
        folder = str(Path(request.data_dir) if request.data_dir else data.default_data_dir())
        table = [_facts(data.info(name)) for name in data.names()]
        return Output({"datasets": data.names(), "data_dir": folder}, table=table, lines=[f"data folder: {folder}"])
    if request.action == "info":
        info = data.info(request.name)
        lines = [f"description: {info['description']}", f"licence: {info['licence']}", f"source: {info['source']}",
                 f"preparation: {info['preparation']}"]
        lines += [f"file {file['name']}: {file['size']:,} bytes, sha256 {file['sha256']}, "
                  f"{file['url'] or 'no download URL'}" for file in info["files"]]
        return Output(info, table=[_facts(info)], lines=lines)
    fetched = [str(path) for path in data.fetch(request.name, request.data_dir)]
    return Output({"fetched": fetched}, lines=[f"{request.name}: {len(fetched)} files in place, each checked against "
                                               "its sha256"], written=fetched)


def _facts(info: Mapping[str, object]) -> dict[str, object]:
    return {fact: info[fact] for fact in FACTS}


def add_parser(commands: Subcommands) -> None:
    sub = subcommand(commands, "data", Command(parse, handle), "list, describe or download data sets")
    sub.add_argument("action", choices=ACTIONS, help="list the data sets, describe one, or download one")
    sub.add_argument("name", nargs="?", help="the data set (info, fetch)")
    add_data_dir(sub, existing=False)  # fetch makes it
