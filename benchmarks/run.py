"""Run every benchmark in ``benchmarks/`` and rewrite ``BENCHMARKS.md``.

    python benchmarks/run.py [--quick] [--out PATH] [--strict] [--only bench_a.py ...]

Each ``benchmarks/bench_*.py`` exposes ``run(quick: bool) -> dict`` returning ``title``
(str), ``markdown`` (a Markdown section body) and ``checks`` (a list of ``{"name", "value",
"target", "passed"}``). The report is written atomically (temporary file, then rename). A
benchmark that raises is reported as FAIL and the others still run. The exit status is 1 if
a benchmark raised, or with ``--strict`` if any check failed; 0 otherwise. ``--only`` reruns the
named benchmarks and keeps the other benchmarks' rows and sections of the existing report as they
were (its header then says which were rerun, and when the others were measured).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def discover() -> list[Path]:
    """The benchmark modules, sorted by name."""
    return sorted(HERE.glob("bench_*.py"))


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmarks.{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        commit = out.stdout.strip() if out.returncode == 0 else "none"
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return commit + (" (uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> dict[str, str]:
    import torch

    return {
        "nproc": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "opacus": _version("opacus"),
        "dp-accounting": _version("dp-accounting"),
        "numpy": _version("numpy"),
        "dpopt": _version("dpopt"),
        "git": _git_commit(),
    }


def run_all(paths: list[Path], quick: bool) -> list[dict[str, Any]]:
    """Each benchmark's result; a benchmark that raises yields a failed result with the traceback."""
    results = []
    for path in paths:
        print(f"[bench] {path.name} ({'quick' if quick else 'full'}) …", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            result = dict(load_module(path).run(quick=quick))
            result.setdefault("checks", [])
            result["error"] = None
        except Exception:  # noqa: BLE001 - reported in the document, the other benchmarks still run
            error = traceback.format_exc()
            print(error, file=sys.stderr)
            result = {"title": path.stem, "markdown": "", "checks": [], "error": error}
        result["module"] = path.name
        result["seconds"] = time.perf_counter() - start
        print(f"[bench] {path.name} done in {result['seconds']:.1f} s", file=sys.stderr, flush=True)
        results.append(result)
    return results


def _value(check: dict[str, Any]) -> str:
    """A check's value with its unit (``check["unit"]``, default "×" for ratios)."""
    value = check["value"]
    return f"{value:.2f}{check.get('unit', '×')}" if isinstance(value, float) else str(value)


def kept_from(report: str, rerun: set[str]) -> tuple[list[dict[str, Any]], str]:
    """The benchmarks of an existing ``report`` not in ``rerun``, as results rendered verbatim
    (their Targets rows and their section), and the report's date and command line."""
    head, _, rest = report.partition("\n## Targets\n")
    targets, *chunks = rest.split("\n## ")
    kept: dict[str, dict[str, Any]] = {}
    for chunk in chunks:
        found = re.search(r"`benchmarks/(bench_\w+\.py)`", chunk)
        if found and found.group(1) not in rerun:
            kept[found.group(1)] = {"module": found.group(1), "rows": [], "section": "## " + chunk.rstrip()}
    for line in targets.splitlines():
        module = line[2:].split(" | ")[0] if line.startswith("| bench_") else None
        if module in kept:
            kept[module]["rows"].append(line)
    when = "; ".join(line[2:] for line in head.splitlines() if line.startswith(("- Date:", "- Command:")))
    partial = re.search(r"^- Only (.+?) rerun; .* previous report \((.*)\)$", head, re.MULTILINE)
    if partial and set(partial.group(1).split(", ")) <= rerun:  # the kept sections are older than that report
        when = partial.group(2)
    return list(kept.values()), when


def render(results: list[dict[str, Any]], command: str, quick: bool, started: dt.datetime,
           seconds: float, kept: str = "") -> str:
    """The report; ``results`` may hold verbatim ones (:func:`kept_from`), measured at ``kept``."""
    info = machine()
    lines = [
        "# Benchmarks",
        "",
        "Generated by `benchmarks/run.py`; do not edit by hand (rerun the command below).",
        "",
        f"- Date: {started.strftime('%Y-%m-%d %H:%M:%S %Z').strip()} (took {seconds:.0f} s)",
        f"- Command: `{command}`{' (quick mode: fewer repeats)' if quick else ''}",
        f"- Machine: {info['nproc']} CPUs ({info['cpu']}), {info['os']}",
        f"- Versions: Python {info['python']}, torch {info['torch']}, opacus {info['opacus']}, "
        f"dp-accounting {info['dp-accounting']}, numpy {info['numpy']}, dpopt {info['dpopt']} "
        f"(git {info['git']})",
        *([f"- Only {', '.join(r['module'] for r in results if 'section' not in r)} rerun; the other sections "
           f"are kept from the previous report ({kept})"] if kept else []),
        "",
        "## Targets",
        "",
        "| benchmark | check | value | target | result |",
        "|---|---|---:|---|---|",
    ]
    for result in results:
        if "section" in result:
            lines += result["rows"]
            continue
        if result["error"]:
            lines.append(f"| {result['module']} | benchmark raised | — | runs | **FAIL** |")
        for check in result["checks"]:
            verdict = "PASS" if check["passed"] else "FAIL"
            lines.append(f"| {result['module']} | {check['name']} | {_value(check)} | "
                         f"{check['target']} | **{verdict}** |")
    for result in results:
        if "section" in result:
            lines += ["", result["section"]]
            continue
        lines += ["", f"## {result['title']}", "", f"`benchmarks/{result['module']}`, {result['seconds']:.0f} s.", ""]
        if result["error"]:
            lines += ["The benchmark raised:", "", "```", result["error"].rstrip(), "```"]
        else:
            lines.append(result["markdown"].rstrip())
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    finally:
        Path(temp).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, no fp64 or profile (< 60 s)")
    parser.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md", help="report path (default: %(default)s)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if any target is missed")
    parser.add_argument("--only", nargs="+", metavar="BENCH", help="rerun only these bench_*.py files, keeping "
                        "the other sections of the existing report")
    args = parser.parse_args(argv)
    paths = discover()
    if args.only:
        unknown = sorted(set(args.only) - {path.name for path in paths})
        if unknown:
            parser.error(f"--only {' '.join(unknown)}: no such benchmark (choose from "
                         f"{', '.join(path.name for path in paths)})")
        paths = [path for path in paths if path.name in args.only]

    command = "python benchmarks/run.py" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
    started = dt.datetime.now().astimezone()
    start = time.perf_counter()
    results, kept = run_all(paths, args.quick), ""
    if args.only and args.out.exists():
        verbatim, kept = kept_from(args.out.read_text(encoding="utf-8"), set(args.only))
        order = {path.name: k for k, path in enumerate(discover())}
        results = sorted([*results, *verbatim], key=lambda result: order.get(result["module"], len(order)))
    text = render(results, command, args.quick, started, time.perf_counter() - start, kept)
    write_atomic(args.out, text)
    print(f"[bench] wrote {args.out}", file=sys.stderr)
    for result in results:
        for check in result.get("checks", ()):
            print(f"{result['module']}: {check['name']} = {_value(check)} "
                  f"(target {check['target']}): {'PASS' if check['passed'] else 'FAIL'}")
    raised = any(result.get("error") for result in results)
    missed = any(not check["passed"] for result in results for check in result.get("checks", ()))
    return 1 if raised or (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
