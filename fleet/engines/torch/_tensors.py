"""Tensor plumbing of the torch engine: flat buffers, host snapshots, batch transfer."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from fleet.engines._base import check_flat
from fleet.rows import Pieces, Rows, joined


def total_numel(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors)


def bind_flat_gradients(params: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Allocate one zeroed float32 buffer and make every parameter's `.grad` a view of it.

    Backward accumulates in place into an existing `.grad`, so after it the buffer holds all
    gradients in parameter order; it must be zeroed in place (never `set_to_none`).
    """
    flat = torch.zeros(total_numel(params), dtype=torch.float32, device=device)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def flatten_to_host(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """The tensors' values, concatenated into a new 1-D float32 host array."""
    if not tensors:
        return np.zeros(0, dtype=np.float32)
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors]).cpu().numpy()


def copy_flat_into(tensors: Sequence[torch.Tensor], flat: np.ndarray, what: str) -> None:
    """Overwrite the tensors, in order, from a 1-D host array of their total size."""
    check_flat(flat, total_numel(tensors), what)
    if not tensors:
        return
    source = torch.from_numpy(np.array(flat, dtype=np.float32)).to(tensors[0].device)
    with torch.no_grad():
        for tensor, chunk in zip(tensors, source.split([t.numel() for t in tensors])):
            tensor.copy_(chunk.view_as(tensor))


def is_same_memory(array: np.ndarray, buffer: torch.Tensor) -> bool:
    """True when `array` is exactly `buffer`'s host memory (same start, size and dtype)."""
    return (
        buffer.device.type == "cpu"
        and array.dtype == np.float32
        and array.flags.c_contiguous
        and array.size == buffer.numel()
        and array.__array_interface__["data"][0] == buffer.data_ptr()
    )


def to_host(value: Any) -> Any:
    """A deep copy of nested dicts/lists/tuples with every tensor detached and copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value


def host_tensor(array: np.ndarray, dtype: np.dtype) -> torch.Tensor:
    """A CPU tensor over `array` (no copy when it is already contiguous, writable and of `dtype`)."""
    array = np.ascontiguousarray(array, dtype=dtype)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def rows_to_device(x: Rows, device: torch.device) -> torch.Tensor:
    """A batch's rows as a float32 tensor on `device`: on the CPU over the joined rows (no copy
    for one contiguous float32 piece); on CUDA the pieces are joined straight into pinned memory,
    the one host copy the asynchronous transfer needs."""
    if device.type != "cuda":
        return host_tensor(joined(x), np.float32)
    staging = torch.empty(tuple(x.shape), dtype=torch.float32, pin_memory=True)
    parts = x.parts if isinstance(x, Pieces) else (x,)
    np.concatenate(parts, out=staging.numpy(), casting="same_kind")
    return staging.to(device, non_blocking=True)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a host tensor to `device`: through pinned memory, asynchronously, on CUDA."""
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
