"""The names of noise sources and accountants, for the command line's choices and the checks of
:mod:`dpopt.accounting` and :mod:`dpopt.algorithms.registry` (which holds the algorithms' names).

Plain strings in a module that imports nothing, so that building the parser (``dpopt --help``)
needs neither torch nor dp_accounting.
"""

#: Noise by name: "torch" (the run's seeded generator), "secure" (the OS CSPRNG), "discrete" (the
#: exact discrete Gaussian, unsampled releases only).
NOISES = ("torch", "secure", "discrete")
#: Accountants by name: privacy loss distributions (the default, tightest) or Rényi DP.
ACCOUNTANTS = ("pld", "rdp")

#: The generalised linear models (:mod:`dpopt.oracles.glm`), each with the metric its ``error``
#: computes: a misclassification rate for the logistic models, the mean squared error for ridge.
GLMS = {"logistic": "test_error", "nonconvex-logistic": "test_error", "ridge": "test_mse"}
#: The DIFF2 paper's one-hidden-layer network (:func:`dpopt.models.mlp`).
MLP = "mlp"
#: The named networks, in the order of :data:`dpopt.models.NETWORKS`, which builds them.
NETWORKS = ("mnist-cnn", "cnn5", "cnn6", "resnet18", "scatternet-linear", "linear")
#: Every model an oracle is built for by name (:func:`dpopt.building.oracle_for`).
MODELS = (*GLMS, MLP, *NETWORKS)
#: The models of a table of features: the GLMs and the MLP (``dpopt run``'s ``--model``).
TABULAR = (*GLMS, MLP)
