"""Checkpoint bytes of the torch engine: its state codec, and checkpoints of older fleet versions.

The codec stores a `TorchEngine.state()` snapshot as a `fleet.safetree` archive: every tensor
as a ``.npy`` array of its dtype and shape, given back as a CPU tensor. Nothing is unpickled.

Older checkpoints (fleet up to commit 99f14b6) are one `torch.save` of the whole
``ModelCheckpoint.to_dict()``: a zip holding ``<name>/data.pkl``. They are read with
``torch.load(weights_only=True)``, torch's restricted unpickler, which rebuilds tensors and
plain containers and refuses every other global: a file that would run code is refused, naming
the global it asked for.
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile
from typing import Any

import numpy as np
import torch

from fleet.engines.tree_codec import TreeStateCodec


def tensor_to_array(value: Any) -> np.ndarray | None:
    """A tensor's values as a host numpy array (None for anything that is not a tensor).

    Raises:
        TypeError: a dtype numpy has no equivalent of (e.g. bfloat16); engines keep float32.
    """
    if not isinstance(value, torch.Tensor):
        return None
    host = value.detach().cpu()
    try:
        return host.numpy()
    except TypeError:
        raise TypeError(f"cannot store a {host.dtype} tensor in a checkpoint (no numpy dtype)") from None


CODEC = TreeStateCodec(tensor_to_array, torch.from_numpy)


def is_torch_archive(data: bytes) -> bool:
    """Whether `data` is a `torch.save` zip (it holds a ``data.pkl``)."""
    if not data.startswith(b"PK\x03\x04"):
        return False
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return any(name.endswith("/data.pkl") or name == "data.pkl" for name in archive.namelist())
    except zipfile.BadZipFile:
        return False


def read_legacy_checkpoint(data: bytes) -> dict[str, Any] | None:
    """An old checkpoint file as ``ModelCheckpoint.to_dict()``, its engine state re-encoded by
    `CODEC`; None when `data` is no `torch.save` archive.

    Raises:
        ValueError: the archive would need code to load (refused), is damaged, or is not a
            fleet checkpoint.
    """
    if not is_torch_archive(data):
        return None
    try:
        found = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise ValueError(f"refused: loading it would call {_refused_global(exc)}, and a checkpoint never "
                         "needs code to load") from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"damaged torch checkpoint: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(found, dict) or not isinstance(found.get("engine_state"), dict):
        raise ValueError("a torch file, but not a fleet checkpoint")
    return {**found, "engine_state": CODEC.encode(found["engine_state"])}


def _refused_global(exc: BaseException) -> str:
    """What torch's restricted unpickler refused, from its message (paragraphs of advice)."""
    found = re.search(r"GLOBAL (\S+)", str(exc))
    return found.group(1) if found else "something torch's safe loader does not allow"
