"""The names the command line offers: algorithms, noise sources, accountants.

Plain strings in a module that imports nothing, so that building the parser (``dpopt --help``)
needs neither torch nor dp_accounting. What each name builds is in
:mod:`dpopt.algorithms.by_name` (algorithms, noise sources) and :mod:`dpopt.accounting`
(accountants), which validate against these tuples.
"""

ALGORITHMS = ("dp-sgd", "dp-gd", "dp-srm", "rrpsgd", "dp-agd", "aclip", "storm", "o2nc-zeroth", "o2nc-first",
              "o2nc-multi", "diff2-gd", "diff2-bvr")
#: The methods with no privacy (nothing to calibrate).
NON_PRIVATE = ("storm",)
#: Noise by name: "torch" (the run's seeded generator), "secure" (the OS CSPRNG), "discrete" (the
#: exact discrete Gaussian, unsampled releases only).
NOISES = ("torch", "secure", "discrete")
#: Accountants by name: privacy loss distributions (the default, tightest) or Rényi DP.
ACCOUNTANTS = ("pld", "rdp")
