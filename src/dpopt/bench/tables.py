"""The bench's results as a Markdown table per problem and one figure per problem: each method's
test error (mean ± std over seeds) against ε, the winner of every ε marked."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from .. import checkpoint
from ..report import markdown_table


def markdown(result: dict[str, Any], command: str) -> str:
    """One table per problem: rows are methods, one column per ε (test error mean (std)), then the
    winner, its p-value against the runner-up, and the ε of tuning and training."""
    lines = [f"Command: `{command}`; total wall time (NOT PRIVATE: it reveals the number of trials) "
             f"{result['diagnostics']['wall_time_s']:.0f} s.", ""]
    for problem in result["problems"]:
        cells = problem["cells"]
        columns = ["method"] + [f"ε = {cell['epsilon']:g}" for cell in cells]
        rows = [{"method": name} | {f"ε = {cell['epsilon']:g}": _entry(cell, name) for cell in cells}
                for name in cells[0]["methods"]]
        rows.append({"method": "winner (p vs runner-up)"} | {
            f"ε = {cell['epsilon']:g}": f"{cell['winner']} (p = {cell['p_value']:.2g}"
                                        f"{', significant' if cell['significant'] else ''})" for cell in cells})
        spent = max(entry["epsilon_tuning_and_training"] for cell in cells for entry in cell["methods"].values()
                    ) if cells else 0.0
        lines += [f"## {problem['problem']}: {problem['model']} on {problem['dataset']}", "",
                  f"{problem.get('metric', 'test_error')} of the privately selected θ, mean (std) over "
                  f"{problem['seeds']} seeds; δ = "
                  f"{problem['delta']:g}; trials per tuning: {problem['trials']}; steps {problem['steps']}; "
                  f"grids {problem['grids']}. Each ε is the total for tuning and training (RDP accountant); the largest "
                  f"ε any tuning claimed: {spent:.4g}. Bold: the lowest mean.", "",
                  markdown_table(rows, columns), ""]
    return "\n".join(lines)


def _entry(cell: dict[str, Any], name: str) -> str:
    error = cell["methods"][name]["test_error"]
    text = f"{error['mean']:.4f} ({error['std']:.4f})"
    return f"**{text}**" if name == cell["winner"] else text


def figure(path: Path, problem: dict[str, Any]) -> None:
    """Test error (mean ± std) against ε, one line per method, the winner of each ε circled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = problem["cells"]
    epsilons = [cell["epsilon"] for cell in cells]
    names = list(cells[0]["methods"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for j, name in enumerate(names):  # ε on a categorical axis, the methods side by side at each ε
        x = [i + 0.6 * (j - (len(names) - 1) / 2) / max(1, len(names)) for i in range(len(cells))]
        means = [cell["methods"][name]["test_error"]["mean"] for cell in cells]
        stds = [cell["methods"][name]["test_error"]["std"] for cell in cells]
        ax.errorbar(x, means, yerr=stds, marker="o", capsize=3, label=name)
        for xi, cell, mean in zip(x, cells, means):
            if cell["winner"] == name:
                ax.scatter([xi], [mean], s=160, facecolors="none", edgecolors="black", zorder=3)
    ax.set_xticks(range(len(cells)), [f"{e:g}" for e in epsilons])
    ax.set_xlim(-0.6, len(cells) - 0.4)
    ax.set_xlabel("ε (tuning and training)")
    ax.set_ylabel(f"{problem.get('metric', 'test_error')} (mean ± std, {problem['seeds']} seeds)")
    ax.set_title(f"{problem['problem']}, δ = {problem['delta']:g}, privately tuned (circled: best)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    checkpoint.write_bytes(path, buffer.getvalue())
