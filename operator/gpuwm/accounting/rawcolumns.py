"""Columns of doubles in the saved engine state: base64 inside the JSON, or raw bytes beside it.

The window segments and GPU histories are most of the controller's state file, as doubles. Base64 in
the JSON would cost more bytes and an encoding pass each save, so the controller's state file carries
them as raw little-endian bytes after its JSON (`gpuwm.controller.state.persistence`), and the JSON
names where each one lies. Anything else that saves the engine (tests, a state encoded in one piece)
gets base64 text.
"""

from __future__ import annotations

import base64
import sys
from array import array


class RawDoubles:
    """Doubles to be saved as their little-endian bytes (see the module docstring): a column, or the bytes
    of several one after the other. It holds the array itself, not a copy: write it before the engine
    changes again, as the lazily built state that holds it."""

    __slots__ = ("data", "nbytes")

    def __init__(self, data: array[float] | bytes) -> None:
        if sys.byteorder != "little":
            column = array("d", data)  # bytes too: array() reads them as frombytes does
            column.byteswap()
            data = column
        self.data = data
        self.nbytes = len(data) * data.itemsize if isinstance(data, array) else len(data)

    def base64(self) -> str:
        """The doubles as the base64 text that states saved in one piece hold."""
        return base64.b64encode(self.data).decode("ascii")


class RawJson:
    """A value already serialised as JSON (a model's `to_json`), for a raw state's encoder to splice in as it is.

    The controller's state saves each device's latest sample and each pod event: serialised once by
    pydantic-core rather than dumped to Python dicts and encoded again, the same JSON comes out
    (tests/unit/controller/test_persistence.py).
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def doubles_from_saved(saved: str | bytes | bytearray | memoryview) -> array[float]:
    """A saved column: base64 text (inside the JSON) or its raw little-endian bytes (beside it).

    Raises ValueError (binascii.Error is one) when it is not whole doubles.
    """
    column = array("d")
    if isinstance(saved, str):
        column.frombytes(base64.b64decode(saved, validate=True))
    elif isinstance(saved, bytes | bytearray | memoryview):
        column.frombytes(saved)
    else:
        raise ValueError(f"a saved column is base64 text or bytes, not {type(saved).__name__}")
    if sys.byteorder != "little":
        column.byteswap()
    return column
