"""The README's recommendation ("Which optimiser when") says only what the latest results show.

Every claim of that section is computed here from the results: the bench's ``docs/bench.json``
(each problem's cells: per ε, every method's metric as mean and std over the seeds, the winner and
its one-sided Welch p-value against the runner-up, or the methods that tie) and the mnist-sota
reproduction's ``results.json`` as REPRODUCTIONS.md publishes it (each row's test accuracy, mean and
standard deviation over its seeds). Each claim is a phrase the README
must contain, so a rerun that changes a count, a p-value or a winner fails this test until the
README says the new result. Every number the section shows must come from one of these phrases.
And ``docs/bench.json`` is what BENCH.md's tables show: each of their rows, rendered from it by
``dpopt.bench.tables``, is in BENCH.md, so neither can be updated without the other.

A method "wins" a cell when it is the cell's winner (the lowest mean, no other mean within 0.1 %
of it); "at most 5 % behind the best mean" compares its mean with the cell's lowest, the gap
rounded to 0.1 %. The published anchors are DPSUR's MNIST results (ScatterNet + linear, the mean
of 5 runs): 98.88 % at ε = 3, 98.70 % at ε = 2 and 97.93 % at ε = 1.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

from dpopt.bench import SIGNIFICANCE, TIE
from dpopt.bench.tables import _entry, _winner
from dpopt.experiments.mnist_sota import PUBLISHED, _compared
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCH = ROOT / "docs" / "bench.json"
MNIST_SOTA = ROOT / "docs" / "reproductions" / "mnist-sota" / "results.json"
BENCH_MD = ROOT / "BENCH.md"
SECTION = "## Which optimiser when"
DPSUR = {epsilon: 100 * accuracy for epsilon, accuracy in PUBLISHED.items()}  # percent
NAMES = {"dp-adambc": "DP-AdamBC", "dp-sgd": "DP-SGD", "dp-sgd-adaptive": "adaptive clipping", "dp-srm": "DP-SRM",
         "dp-bandmf": "BandMF", "aclip": "AClip", "o2nc-first": "DP-O2NC", "diff2-gd": "DIFF2-GD",
         "dp-gd": "DP-GD"}


def section(readme: str) -> str:
    """The README's recommendation, its lines joined (line breaks do not matter)."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    return " ".join(readme[start:end if end >= 0 else None].split())


def cells(bench: dict) -> list[tuple[str, dict]]:
    return [(problem["problem"], cell) for problem in bench["problems"] for cell in problem["cells"]]


def gap(cell: dict, method: str) -> float:
    """How far ``method``'s mean is behind the cell's lowest mean, in %, rounded to 0.1 %."""
    means = {name: entry["test_error"]["mean"] for name, entry in cell["methods"].items()}
    best = min(means.values())
    return round(100 * (means[method] - best) / abs(best), 1)


def listed(epsilons: list[float]) -> str:
    """``[1.0, 3.0, 8.0]`` → ``"1, 3 and 8"``."""
    shown = [f"{e:g}" for e in epsilons]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def bench_claims(bench: dict) -> list[str]:
    """The phrases of the recommendation that the bench's results support."""
    every = cells(bench)
    claims = [f"{len(bench['problems'])} problems, ε = {listed(sorted({c['epsilon'] for _, c in every}))}, "
              f"{min(p['seeds'] for p in bench['problems'])} seeds",
              f"no other is within {100 * TIE:g} % of it"]

    def record(method: str) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]], int]:
        present = [(name, cell) for name, cell in every if method in cell["methods"]]
        won = [(name, cell) for name, cell in present if cell["winner"] == method]
        return present, won, sum(gap(cell, method) <= 5.0 for _, cell in present)

    present, won, close = record("dp-adambc")
    significant = sum(cell["significant"] for _, cell in won)
    claims.append(f"wins {len(won)} of {len(present)} cells, {significant} significantly (p < {SIGNIFICANCE:g}); "
                  f"at most 5 % behind the best mean in {close} of {len(present)}")
    mnist = [cell for name, cell in every if name == "mnist-cnn"]
    behind = [gap(cell, "dp-adambc") for cell in mnist]
    claims.append(f"on the MNIST CNN DP-AdamBC is {min(behind):.0f}–{max(behind):.0f} % behind the best mean")
    winners = {cell["winner"]: [c["epsilon"] for c in mnist if c["winner"] == cell["winner"]] for cell in mnist}
    claims += [f"{NAMES[name]} wins at ε = {listed(epsilons)}" for name, epsilons in winners.items()]
    if not any(cell["significant"] for cell in mnist):
        claims.append(f"none significantly (p ≥ {min(cell['p_value'] for cell in mnist):.2f})")
    adult = [cell for name, cell in every if name == "adult-logistic"]
    won_adult = [cell for cell in adult if cell["winner"] == "dp-sgd-adaptive"]
    if won_adult:
        strong = [cell for cell in won_adult if cell["significant"]]
        where = "every ε" if len(won_adult) == len(adult) else f"ε = {listed([c['epsilon'] for c in won_adult])}"
        significance = (f", significantly at ε = {listed([c['epsilon'] for c in strong])} "
                        f"(p ≤ {max(c['p_value'] for c in strong):.3g})" if strong else ", none significantly")
        claims.append(f"wins Adult at {where}{significance}")
    present, won, close = record("dp-sgd")
    significant = sum(cell["significant"] for _, cell in won)
    claims.append(f"at most 5 % behind the best mean in {close} of {len(present)} cells; wins {len(won)}, "
                  f"{significant or 'none'} of them significantly")
    claims.append("cells won: " + ", ".join(f"{NAMES[m]} {len(record(m)[1])} of {len(record(m)[0])}"
                                            for m in ("dp-bandmf", "aclip", "o2nc-first", "diff2-gd")))
    winners_of_significant = sorted({cell["winner"] for _, cell in every if cell["significant"]})
    claims.append(f"{sum(cell['significant'] for _, cell in every)} of the {len(every)} cells have a significant "
                  f"winner ({', '.join(NAMES[m] for m in winners_of_significant)})")
    return claims


#: A row of the mnist-sota reproduction: (mean, standard deviation) of its test accuracy in %, and its seeds.
Summary = tuple[float, float, int]


def mnist_sota_rows(results: dict) -> dict[tuple[str, float], Summary]:
    """The mnist-sota reproduction's ScatterNet + linear rows (``results.json``): (method, ε) → its
    test accuracy's summary (the 5-view problem's methods name ``multiplicity``; the tanh CNN's row
    left out)."""
    return {(row["algorithm"], row["epsilon"]): (100 * row["metrics"]["test_accuracy"]["mean"],
                                                 100 * row["metrics"]["test_accuracy"]["std"], row["seeds"])
            for row in results["rows"] if row["problem"].startswith("scatternet")}


def above_p(theirs: Summary, ours: Summary) -> float:
    """One-sided Welch p-value of "ours is above theirs", from the two summaries."""
    return float(stats.ttest_ind_from_stats(ours[0], ours[1], ours[2], theirs[0], theirs[1], theirs[2],
                                            equal_var=False, alternative="greater").pvalue)


def compared(mean: float, std: float, anchor: float) -> str:
    """The reproduction's own rule (``level with`` the anchor within one standard deviation of
    ``mean``, else above or behind), without its bold."""
    return _compared({"mean": mean, "std": std}, anchor).strip("*")


def mnist_claims(rows: dict[tuple[str, float], Summary]) -> list[str]:
    """The phrases of the recommendation that the mnist-sota reproduction supports."""

    def shown(row: Summary) -> str:
        return f"{row[0]:.2f} % ± {row[1]:.2f} %"

    sgd = rows["DP-SGD", 3.0]
    views = next(row for (method, e), row in rows.items() if method.endswith("multiplicity") and e == 3.0)
    others = [row for (method, e), row in rows.items()
              if e == 3.0 and method != "DP-SGD" and "multiplicity" not in method]
    weakest = min(above_p(sgd, row) for row in others)
    claims = [f"{shown(views)} over {views[2]} seeds, against DP-SGD's {shown(sgd)} "
              f"(one-sided Welch p = {above_p(sgd, views):.3f})",
              f"{compared(views[0], views[1], DPSUR[3.0])} DPSUR's {DPSUR[3.0]:.2f} %",
              f"{len(others)} other variants of the recipe: not above DP-SGD "
              f"(p ≥ {math.floor(100 * weakest) / 100:.2f})"]
    for epsilon in sorted({e for _, e in rows} - {3.0}, reverse=True):  # each other ε's best row against DP-SGD's
        low = rows["DP-SGD", epsilon]
        best = max((row for (_, e), row in rows.items() if e == epsilon), key=lambda row: row[0])
        claims.append(f"{shown(best)} over {best[2]} seeds, against DP-SGD's {shown(low)} "
                      f"(one-sided Welch p = {above_p(low, best):.2g})")
        if epsilon in DPSUR:  # and DPSUR's, where it published one
            claims.append(f"{compared(best[0], best[1], DPSUR[epsilon])} DPSUR's {DPSUR[epsilon]:.2f} %")
    return claims


def mnist_sota() -> dict[tuple[str, float], Summary]:
    return mnist_sota_rows(json.loads(MNIST_SOTA.read_text()))


def claims() -> list[str]:
    return [*bench_claims(json.loads(BENCH.read_text())), *mnist_claims(mnist_sota())]


def unsupported(readme: str, supported: list[str]) -> list[str]:
    """The claims the README's section lacks, and the numbers it shows that no claim holds."""
    text = section(readme)
    numbers = re.compile(r"\d+(?:\.\d+)?")
    held = {number for claim in supported for number in numbers.findall(claim)}
    return ([claim for claim in supported if claim not in text]
            + [f"number {n} not from the results" for n in numbers.findall(text) if n not in held])


def test_every_claim_of_the_recommendation_is_what_the_results_show():
    assert not unsupported(README.read_text(), claims())


def test_the_recommendation_check_catches_a_changed_bench_result():
    """Mutants of the results: a cell whose winner changes, a p-value that moves past 0.05, a
    method one seed worse on MNIST; each leaves a README claim unsupported."""
    bench = json.loads(BENCH.read_text())
    readme = README.read_text()
    runs = mnist_sota()
    assert not unsupported(readme, [*bench_claims(bench), *mnist_claims(runs)])

    won = copy.deepcopy(bench)
    cell = won["problems"][1]["cells"][0]  # ijcnn1 at ε = 0.5: DP-AdamBC's
    cell["winner"], cell["methods"]["dp-sgd"]["test_error"]["mean"] = "dp-sgd", 0.08
    weaker = copy.deepcopy(bench)
    weaker["problems"][1]["cells"][1].update(p_value=0.06, significant=False)  # ijcnn1 at ε = 1: DP-AdamBC's lead
    worse = dict(runs)
    views = next(key for key in runs if key[0].endswith("multiplicity"))
    worse[views] = (runs[views][0] - 0.1, *runs[views][1:])
    for mutant in ([*bench_claims(won), *mnist_claims(runs)], [*bench_claims(weaker), *mnist_claims(runs)],
                   [*bench_claims(bench), *mnist_claims(worse)]):
        assert unsupported(readme, mutant)


def test_the_recommendation_check_catches_a_number_no_result_holds():
    readme = README.read_text().replace(SECTION + "\n", SECTION + "\nDP-AdamBC is 7.5 % better.\n")
    assert unsupported(readme, claims()) == ["number 7.5 not from the results"]


def test_the_mnist_sota_reader_finds_every_scatternet_row():
    rows = mnist_sota()
    assert len(rows) == 14 and all(seeds == 3 for _, _, seeds in rows.values())
    assert sorted(method for method, _ in rows) == sorted(
        ["DP-SGD"] * 5 + ["DP-SGD + EMA", "DP-SGD + banded noise", "DP-SGD + quantile clipping", "DP-AdamBC"]
        + ["DP-SGD + augmentation multiplicity"] * 5)


def table_rows(bench: dict) -> list[str]:
    """Each problem's metric table, one row per method and the winner's row, as ``dpopt.bench.tables``
    writes them into bench.md."""
    rows = []
    for problem in bench["problems"]:
        methods = list(dict.fromkeys(name for cell in problem["cells"] for name in cell["methods"]))
        entries = {name: [_entry(cell, name, problem["metric"]) for cell in problem["cells"]] for name in methods}
        entries["winner (p vs runner-up)"] = [_winner(cell) for cell in problem["cells"]]
        rows += [f"| {label} | {' | '.join(values)} |" for label, values in entries.items()]
    return rows


def test_the_bench_results_are_the_tables_of_bench_md():
    lines = set(BENCH_MD.read_text().splitlines())
    rows = table_rows(json.loads(BENCH.read_text()))
    assert len(rows) == 7 * 2 + 5 + 3 * 6 + 6 and not [row for row in rows if row not in lines]


def test_the_table_check_catches_a_result_bench_md_does_not_show():
    bench = json.loads(BENCH.read_text())
    bench["problems"][2]["cells"][3]["methods"]["dp-srm"]["test_error"]["mean"] = 0.0695  # MNIST, ε = 8
    lines = set(BENCH_MD.read_text().splitlines())
    missing = [row for row in table_rows(bench) if row not in lines]
    assert len(missing) == 1 and missing[0].startswith("| dp-srm |") and "0.0695 (" in missing[0]


def test_the_bench_report_names_steps_and_grids_in_words_not_python_reprs():
    """Finding: bench.md showed ``steps {'dp-sgd': 400, …}; grids {'dp-sgd': {'lr': [0.1, …]}}``."""
    from dpopt.bench.tables import markdown

    text = markdown(json.loads(BENCH.read_text()), "dpopt bench")
    assert "{'" not in text and "['" not in text
    assert ("steps: dp-sgd 400, dp-bandmf 400, dp-sgd-adaptive 400, dp-adambc 400, dp-srm 400, aclip 400, dp-gd 100; "
            "grids: dp-sgd: lr ∈ {0.1, 0.3, 1, 3} × clip ∈ {0.3, 1, 3}; dp-bandmf: bands ∈ {1, 4, 16} × lr ∈ "
            "{0.1, 0.3, 1, 3} × clip ∈ {0.3, 1, 3};") in text
