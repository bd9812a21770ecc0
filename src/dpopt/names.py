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
