"""Layers that dpopt's per-record engines handle where torch's own do not.

``dpopt.nn.LSTM``, ``GRU``, ``RNN`` and their cells ``LSTMCell``, ``GRUCell``, ``RNNCell``:
drop-in replacements of torch's recurrent modules (the same arguments, parameter names, state
dict, outputs and numerics), written as a loop over time of ``nn.Linear`` maps so that each
record's gradient is computed on that record alone (:mod:`dpopt.nn.recurrent`). Records of their
own lengths: pass ``lengths=`` (each record's number of real steps, padding on the right, or
``padding_side="left"``), and each record's outputs and final state are torch's on its packed
sequence, whatever the padding; on chunks a DataLoader's own ``collate_fn`` collated (which may
pad them) the layers refuse to run without it.
``from_torch(module)`` converts one of torch's; :func:`dpopt.fix` converts every one in a model.
"""

from .recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell, from_torch

__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNCell", "from_torch"]
