"""Checkpoints that load without running code, written atomically (:mod:`dpopt.atomic`).

Checkpoint format, one file, in two versions::

    b"dpopt-checkpoint 1\n"  sha256 of the body, 64 hex digits, b"\n"  body = payload
    b"dpopt-checkpoint 2\n"  sha256 of the body, 64 hex digits, b"\n"  body = tag + b"\n" + payload
    payload = JSON length (8 bytes, little-endian) + JSON (UTF-8) + safetensors

The JSON is the checkpointed value encoded by :mod:`dpopt.codec`, referring to the tensors of
the safetensors part by name. :func:`load` checks the digest before parsing anything, so a
flipped bit or a truncated file is refused with one line, and parsing never runs code (no
pickle). The digest detects corruption, not forgery: whoever can write the file can recompute
it. Version 2, every training checkpoint's, adds the tag: HMAC-SHA256 of the payload under the
user's secret key (:mod:`dpopt.journal`, kept outside ``--out``), which only a holder of the key
can compute; :func:`load` given the key refuses a file whose tag does not verify, or that has
none. Version 1 holds saved results (``dpopt reproduce``'s runs), read without a key.

:func:`save` and :func:`load` import torch and the tensor codec when called: importing this
module needs no torch (``dpopt calibrate --json`` starts without it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

from . import _validate
from .atomic import write_bytes


@dataclasses.dataclass(frozen=True)
class Key:
    """The checkpoint key (``secret``, kept in the file ``path``: :func:`dpopt.journal.key` makes and reads it)."""

    secret: bytes = dataclasses.field(repr=False)
    path: Path

    def tag(self, payload: bytes | memoryview) -> bytes:
        """HMAC-SHA256 of ``payload`` under the key, 64 hex digits."""
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest().encode()


MAGIC = b"dpopt-checkpoint 1\n"  #: digest only
TAGGED = b"dpopt-checkpoint 2\n"  #: digest and tag


def save(path: Path, obj: object, key: Key | None = None) -> None:
    """Atomically write ``obj`` (a value :mod:`dpopt.codec` can encode) to ``path`` as a checkpoint,
    tagged under ``key`` if given (version 2), else with its digest only (version 1)."""
    import safetensors.torch

    from . import codec

    data, tensors = codec.encode(obj)
    text = json.dumps(data, allow_nan=False, separators=(",", ":")).encode()
    payload = len(text).to_bytes(8, "little") + text + safetensors.torch.save(tensors)
    body = payload if key is None else key.tag(payload) + b"\n" + payload
    write_bytes(path, (MAGIC if key is None else TAGGED) + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


def load(path: Path, key: Key | None = None) -> Any:
    """The value :func:`save` wrote to ``path``; a one-line :class:`~dpopt._validate.DpoptError` if
    the file is not such a checkpoint, is corrupt or truncated, or cannot be read, and with ``key``
    if it does not carry a tag that verifies under ``key`` (without, a tag is not checked: reading
    a checkpoint to look into it)."""
    import safetensors
    import safetensors.torch

    from . import codec

    name = f"checkpoint={str(path)!r}"
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise _validate.DpoptError(f"{name} cannot be read ({err.strerror})") from None
    magic = data[:len(MAGIC)]
    if magic not in (MAGIC, TAGGED):
        raise _validate.DpoptError(f"{name} is not a dpopt checkpoint of format 1 or 2 (checkpoints of earlier "
                                   "versions were pickles, which are not loaded: loading one can run code)")
    # slices of a memoryview share the file's bytes: a large checkpoint (cached features) is held
    # once, plus its tensors, instead of once per slice
    digest, body = data[len(MAGIC):len(MAGIC) + 64], memoryview(data)[len(MAGIC) + 65:]
    if data[len(MAGIC) + 64:len(MAGIC) + 65] != b"\n" or hashlib.sha256(body).hexdigest().encode() != digest:
        raise _validate.DpoptError(f"{name} is corrupt or truncated (its sha256 does not match its contents); "
                                   "it was not used")
    tag, payload = (None, body) if magic == MAGIC else (bytes(body[:64]), body[65:])
    if key is not None and tag is None:
        raise _validate.DpoptError(f"{name} is not authenticated: it carries no tag (format 1: saved results, or a "
                                   "file rewritten without the checkpoint key), and a run resumes only a checkpoint "
                                   "tagged under the user's key; it was not used")
    if key is not None and tag is not None and not hmac.compare_digest(key.tag(payload), tag):
        raise _validate.DpoptError(f"{name} is not authenticated: its tag does not verify under the checkpoint key "
                                   f"{str(key.path)!r}, so it was edited after it was written, or written under "
                                   "another key (another user, machine or DPOPT_STATE); it was not used")
    size = int.from_bytes(payload[:8], "little")
    try:
        tensors = safetensors.torch.load(bytes(payload[8 + size:]))
        return codec.decode(json.loads(bytes(payload[8:8 + size])), tensors)
    except (ValueError, TypeError, RecursionError, safetensors.SafetensorError) as err:
        reason = str(err).partition("\n")[0][:200]
        raise _validate.DpoptError(f"{name} is malformed ({reason}); it was not used") from None
