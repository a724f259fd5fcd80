"""Trees of plain values and numpy arrays as bytes that load without running code.

Checkpoints are made of these bytes (an engine's state, and the checkpoint file around it),
so a checkpoint planted in a shared run directory can at worst hold wrong numbers.

Format
    A NumPy ``.npz`` archive (a zip of ``.npy`` files, stored uncompressed): ``tree.npy`` is
    the tree as UTF-8 JSON in a ``uint8`` array, ``a<k>.npy`` the k-th array of the tree. In
    the JSON, a value is a JSON scalar, list or object, or one of these tagged objects::

        {"$array": k}                   the k-th array
        {"$bytes": k}                   the k-th array (uint8) as bytes
        {"$tuple": [v, ...]}            a tuple
        {"$dict": [[key, value], ...]}  a dict with a key that is not a plain string
                                        (an int, or a string starting with "$")

    Floats keep NaN and the infinities (JSON's ``NaN``/``Infinity`` extension). numpy
    scalars are stored as the Python numbers they equal.

Safety
    `loads` reads the archive with ``np.load(..., allow_pickle=False)``, which refuses object
    arrays (the only ``.npy`` content that pickles), and parses the tree with `json`; nothing
    in the format can name a type or a function, so loading never imports or calls anything.
    Anything that is not such an archive raises `TreeError`.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.npyio import NpzFile

TREE = "tree"
_TAGS = ("$array", "$bytes", "$tuple", "$dict")


class TreeError(ValueError):
    """The bytes are not a tree this module wrote (corrupt, foreign, or would need unpickling)."""


def dumps(tree: Any, to_array: Callable[[Any], np.ndarray | None] | None = None) -> bytes:
    """Encode `tree` (dicts, lists, tuples, str, int, float, bool, None, bytes, numpy arrays).

    Args:
        tree: the value to encode.
        to_array: turns any other leaf (e.g. a framework's tensor) into a numpy array, or
            returns None when it cannot; the array is what `loads` gives back (through its
            `from_array`).

    Raises:
        TypeError: a leaf that is none of the above (names its type), or an object array.
    """
    arrays: list[np.ndarray] = []
    encoded = _encode(tree, arrays, to_array)
    text = json.dumps(encoded, separators=(",", ":")).encode("utf-8")
    members = {TREE: np.frombuffer(text, dtype=np.uint8)}
    members.update({f"a{k}": array for k, array in enumerate(arrays)})
    buffer = io.BytesIO()
    np.savez(buffer, **members)
    return buffer.getvalue()


def loads(data: bytes, from_array: Callable[[np.ndarray], Any] | None = None) -> Any:
    """Decode what `dumps` wrote; `from_array` turns each array into what the caller wants.

    Raises:
        TreeError: not such an archive, damaged, or it holds pickled (object) arrays.
    """
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(archive, NpzFile):
            raise TreeError("a bare .npy array, not an .npz archive")
        with archive:
            text = archive[TREE].tobytes().decode("utf-8")
            return _decode(json.loads(text), archive, from_array or (lambda array: array))
    except (ValueError, TypeError, KeyError, OSError, EOFError, RecursionError, zipfile.BadZipFile) as exc:
        raise TreeError(_problem(exc)) from None


def _problem(exc: BaseException) -> str:
    """One line for why bytes did not load (numpy's advice to unpickle is not passed on)."""
    text = " ".join(str(exc).split())
    if "pickle" in text and not isinstance(exc, TreeError):
        return "holds pickled data, which fleet never loads (unpickling can run code)"
    return text[:200] or type(exc).__name__


def _encode(value: Any, arrays: list[np.ndarray], to_array: Callable[[Any], np.ndarray | None] | None) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": _keep(np.frombuffer(bytes(value), dtype=np.uint8), arrays)}
    if isinstance(value, np.ndarray):
        return {"$array": _keep(value, arrays)}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, arrays, to_array) for v in value]
        return items if isinstance(value, list) else {"$tuple": items}
    if isinstance(value, dict):
        return _encode_dict(value, arrays, to_array)
    array = to_array(value) if to_array is not None else None
    if array is None:
        raise TypeError(f"cannot store a {type(value).__module__}.{type(value).__qualname__} in a checkpoint")
    return {"$array": _keep(np.asarray(array), arrays)}


def _encode_dict(value: dict, arrays: list[np.ndarray], to_array: Any) -> Any:
    if all(isinstance(k, str) and not k.startswith("$") for k in value):
        return {k: _encode(v, arrays, to_array) for k, v in value.items()}
    return {"$dict": [[_encode(k, arrays, to_array), _encode(v, arrays, to_array)] for k, v in value.items()]}


def _keep(array: np.ndarray, arrays: list[np.ndarray]) -> int:
    if array.dtype.hasobject:
        raise TypeError("cannot store an array of Python objects in a checkpoint")
    arrays.append(array)
    return len(arrays) - 1


def _decode(value: Any, archive: Any, from_array: Callable[[np.ndarray], Any]) -> Any:
    if isinstance(value, list):
        return [_decode(v, archive, from_array) for v in value]
    if not isinstance(value, dict):
        return value
    tag = next((t for t in _TAGS if t in value), None)
    if tag is None:
        return {k: _decode(v, archive, from_array) for k, v in value.items()}
    if len(value) != 1:
        raise TreeError(f"a {tag} entry with other keys")
    inner = value[tag]
    if tag == "$tuple":
        return tuple(_decode(v, archive, from_array) for v in inner)
    if tag == "$dict":
        return {_hashable(_decode(k, archive, from_array)): _decode(v, archive, from_array) for k, v in inner}
    array = archive[f"a{int(inner)}"]
    return array.tobytes() if tag == "$bytes" else from_array(array)


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, dict)):
        raise TreeError(f"a dict key that is a {type(key).__name__}")
    return key
