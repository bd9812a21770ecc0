"""The AClip paper's published numbers (seed 002: Jin, Zhou, Han, Cheng, Zeng), keyed like our rows."""

from __future__ import annotations

from typing import Any

#: Tables 2 (logistic) and 4 (ridge): per data set and ε, the "estimation error divided by
#: initial error" (the paper's code: test loss ratio) and the wall time in s per run, for
#: CC thm, UC thm, DP-SGD, DP-GD (300 runs; 400 epochs synthetic, 30 real).
_TABLES = {
    "logistic": """
diabetes 0.5 0.8772 0.9174 0.9195 0.9724 6.18E-4 5.87E-4 7.14E-4 5.32E-3
diabetes 0.75 0.8718 0.9021 0.9070 0.9706 5.91E-4 5.87E-4 7.00E-4 5.27E-3
diabetes 1.0 0.8693 0.9017 0.9051 0.9702 5.63E-4 5.69E-4 6.98E-4 5.61E-3
diabetes 2.0 0.8691 0.9012 0.9012 0.9632 6.06E-4 5.05E-4 7.49E-4 5.49E-3
adult 0.5 0.8103 0.8791 0.9051 0.9813 0.128 0.129 0.138 8.388
adult 0.75 0.7993 0.8718 0.8875 0.9811 0.125 0.126 0.133 8.297
adult 1.0 0.7992 0.8689 0.8859 0.9809 0.585 0.599 0.605 9.264
adult 2.0 0.7986 0.8679 0.8805 0.9806 0.126 0.125 0.134 8.317
student-t 0.5 0.8517 0.8672 0.8796 0.9058 1.380 1.381 1.580 32.071
student-t 0.75 0.8443 0.8526 0.8765 0.9055 1.396 1.384 1.610 32.011
student-t 1.0 0.8428 0.8505 0.8754 0.9053 1.396 1.396 1.611 33.011
student-t 2.0 0.8420 0.8496 0.8752 0.9049 1.395 1.396 1.613 33.015
laplace 0.5 0.5767 0.6128 0.6980 0.7742 1.415 1.398 1.631 36.645
laplace 0.75 0.5709 0.6098 0.6965 0.7720 1.290 1.289 1.506 31.339
laplace 1.0 0.5702 0.6056 0.6960 0.7715 1.434 1.390 1.727 32.231
laplace 2.0 0.5679 0.6042 0.6957 0.7711 1.687 1.673 2.024 32.501
chi2 0.5 0.6270 0.6521 0.7245 0.7926 1.411 1.418 1.561 32.011
chi2 0.75 0.6165 0.6448 0.7230 0.7920 1.419 1.428 1.567 32.384
chi2 1.0 0.6118 0.6432 0.7226 0.7916 1.382 1.392 1.646 32.805
chi2 2.0 0.6113 0.6421 0.7221 0.7911 1.390 1.401 1.582 32.443
""",
    "ridge": """
diabetes 0.5 0.7550 0.7913 0.8211 0.8987 3.67E-4 3.58E-4 4.62E-4 5.51E-3
diabetes 0.75 0.7481 0.7782 0.8179 0.8951 4.34E-4 3.76E-4 4.56E-4 5.63E-3
diabetes 1.0 0.7479 0.7752 0.8074 0.8844 3.97E-4 3.56E-4 4.44E-4 5.60E-3
diabetes 2.0 0.7459 0.7824 0.8059 0.8834 3.66E-4 3.97E-4 4.79E-4 5.33E-3
adult 0.5 0.6381 0.6884 0.8183 0.9087 0.117 0.117 0.122 8.382
adult 0.75 0.6113 0.6794 0.7359 0.9085 0.123 0.120 0.129 8.347
adult 1.0 0.6094 0.6784 0.7352 0.9082 0.118 0.117 0.123 8.318
adult 2.0 0.6078 0.6778 0.7340 0.9081 0.117 0.116 0.121 8.211
student-t 0.5 0.7998 0.8059 0.8101 0.8153 0.903 0.909 1.019 30.523
student-t 0.75 0.7971 0.7990 0.8018 0.8141 0.962 0.977 1.096 32.314
student-t 1.0 0.7967 0.7985 0.7974 0.8139 0.952 0.961 1.085 32.720
student-t 2.0 0.7963 0.7991 0.7968 0.8142 0.912 0.961 1.043 32.210
laplace 0.5 0.5141 0.5286 0.5371 0.5568 1.002 0.989 1.164 32.112
laplace 0.75 0.5113 0.5234 0.5290 0.5565 0.936 0.931 1.054 31.065
laplace 1.0 0.5102 0.5206 0.5285 0.5560 0.912 0.917 1.048 32.162
laplace 2.0 0.5100 0.5201 0.5274 0.5558 0.987 0.979 1.135 32.728
chi2 0.5 0.5541 0.5701 0.5766 0.5937 0.919 0.909 1.043 30.613
chi2 0.75 0.5522 0.5621 0.5669 0.5935 0.961 0.951 1.160 32.147
chi2 1.0 0.5515 0.5619 0.5653 0.5933 0.918 0.902 1.025 30.685
chi2 2.0 0.5513 0.5606 0.5651 0.5930 0.911 0.910 1.034 30.723
""",
}


def convex_rows(datasets: tuple[str, ...]) -> list[dict[str, Any]]:
    """The paper's rows for ``datasets``, keyed like ours (the paper's columns are its settings)."""
    rows = []
    for model, table in _TABLES.items():
        for line in table.strip().splitlines():
            data, eps, *numbers = line.split()
            if data not in datasets:
                continue
            values = [float(x) for x in numbers]
            for i, name in enumerate(("CC", "UC", "DP-SGD", "DP-GD")):
                rows.append({"problem": f"{model}:{data}", "algorithm": f"{name} (paper)", "epsilon": float(eps),
                             "loss_ratio": values[i], "wall_time_s": values[4 + i]})
    return rows

