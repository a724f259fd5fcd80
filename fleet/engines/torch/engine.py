"""`TorchEngine`: the engine interface (see `fleet/engines/_base.py`) for PyTorch models on a CPU or a CUDA GPU."""

from __future__ import annotations

import os
import zlib
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from fleet.engines._base import Engine, EnginePhase, StateLayout, check_evaluate, check_flat
from fleet.engines.options import EngineOptions
from fleet.engines.torch._tensors import (
    bind_flat_gradients,
    copy_flat_into,
    flatten_to_host,
    host_tensor,
    is_same_memory,
    rows_to_device,
    to_device,
    to_host,
    total_numel,
)
from fleet.engines.schedule import epoch_lr
from fleet.engines.torch.codec import CODEC
from fleet.engines.torch.optim import ParamUpdate
from fleet.engines.torch.zoo import build_model, set_dropout_generator
from fleet.errors import UserError
from fleet.rows import Rows
from fleet.spec.families import is_user_family

LAYOUT = StateLayout(
    format="fleet.torch_engine/1",
    kind="a torch engine state",
    keys=frozenset({"model_id", "num_parameters", "model", "optimizer", "epoch", "steps", "rng"}),
    misfits=(RuntimeError, ValueError, KeyError),
)


def resolve_device(device: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:<i>`` as a concrete torch device (raises `UserError`)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:<index>'") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise UserError(f"device {device!r}: the torch engine runs on 'cpu' or 'cuda[:<index>]'")
    if not torch.cuda.is_available():
        raise UserError(f"device {device!r}: CUDA is not available on this node")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise UserError(f"device {device!r}: this node has {torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


def configure_torch(device: torch.device, threads: int | None, deterministic: bool) -> None:
    """Process-wide torch settings for a trainer: CPU threads, current GPU, cuDNN/cuBLAS modes."""
    if threads is not None:
        torch.set_num_threads(threads)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
        torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.deterministic = deterministic
        torch.backends.cudnn.benchmark = not deterministic


def derived_seed(seed: int, purpose: str) -> int:
    """A seed for one purpose (``dropout``, ...) derived from the model's seed."""
    return zlib.crc32(f"{seed}:{purpose}".encode()) & 0x7FFFFFFF


def restore_generator(generator: torch.Generator, rng: Mapping[str, Any], seed: int, steps: int) -> None:
    """Restore a model's dropout generator from its checkpoint's ``rng`` entry; saved on another
    device type, reseed it deterministically from the model's seed and step count instead."""
    if rng["device_type"] == generator.device.type:
        generator.set_state(rng["generator"])
    else:
        generator.manual_seed(derived_seed(seed, f"dropout:{steps}"))


def batch_tensors(x: Rows, y: np.ndarray, input_shape: tuple[int, ...], who: str,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's images and labels on `device`, after checking their shapes (`who` names the
    model or bundle in the `ValueError`)."""
    if tuple(x.shape[1:]) != tuple(input_shape) or x.ndim != 4 or len(y) != len(x):
        raise ValueError(
            f"{who}: expected x of shape (N, {', '.join(map(str, input_shape))}) "
            f"and N labels, got x {tuple(x.shape)} and y {tuple(np.shape(y))}"
        )
    return rows_to_device(x, device), to_device(host_tensor(y, np.int64), device)


class TorchEngine(Engine):
    """One replica of a `ModelSpec`'s network, its optimizer and LR schedule, on one device.

    Args:
        options: the model (its seed seeds the initial weights, built on the CPU so that every
            process and device type starts from the same weights, and the dropout RNG), the
            sample shape, the classes; the device (``cpu``, ``cuda`` or ``cuda:<index>``);
            ``threads``: `torch.set_num_threads` for this trainer slot (process-wide), None
            leaves it; ``deterministic``: on CUDA, deterministic cuDNN/cuBLAS algorithms
            (slower); off, cuDNN autotuning. On the CPU, runs are bit-reproducible for a fixed
            seed, data order and thread count either way.

    Raises:
        UserError: bad device, unknown family, bad params, or an unbuildable user model.
    """

    codec = CODEC
    layout = LAYOUT

    def __init__(self, options: EngineOptions):
        super().__init__(options)
        model = options.model
        self.device = resolve_device(options.device)
        configure_torch(self.device, options.threads, options.deterministic)
        self.net = build_model(model.family, model.params, self.input_shape, options.num_classes, seed=model.seed)
        self.net.to(device=self.device, dtype=torch.float32)
        self._params = [p for p in self.net.parameters() if p.requires_grad]
        if not self._params:
            raise UserError(f"family {model.family!r}: the model has no trainable parameters")
        self.num_parameters = total_numel(self._params)
        self._buffers = [b for b in self.net.buffers() if b.is_floating_point()]
        self._grads = bind_flat_gradients(self._params, self.device)
        self._host_grads = self._pinned_like(self._grads)
        self._optimizer = ParamUpdate(self._params, model.train)
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(derived_seed(model.seed, "dropout"))
        set_dropout_generator(self.net, self._generator)
        self._schedule_lr()

    # -- training ---------------------------------------------------------------------------

    def compute_gradients(self, x: np.ndarray, y: np.ndarray) -> float:
        inputs, targets = self._batch(x, y)
        self.net.train()
        self._grads.zero_()
        loss = F.cross_entropy(self.net(inputs), targets)
        loss.backward()
        self._phase = EnginePhase.TRAINING
        return float(loss.detach())

    def flat_gradients(self) -> np.ndarray:
        if self._host_grads is None:
            return self._grads.numpy()
        self._host_grads.copy_(self._grads)
        return self._host_grads.numpy()

    def gradient_buffer(self) -> torch.Tensor:
        """The gradient buffer itself, a tensor on the engine's device (for torch.distributed / NCCL)."""
        return self._grads

    def scale_gradients(self, factor: float) -> None:
        self._grads.mul_(factor)

    def load_flat_gradients(self, flat: np.ndarray | torch.Tensor) -> None:
        check_flat(flat, self.num_parameters, "load_flat_gradients")
        if isinstance(flat, torch.Tensor):
            if flat.device == self.device and flat.data_ptr() == self._grads.data_ptr():
                return
            self._grads.copy_(flat.detach())
            return
        if is_same_memory(flat, self._grads):
            return
        self._grads.copy_(host_tensor(flat, np.float32))

    def apply_gradients(self) -> None:
        self._optimizer.step()
        self._grads.zero_()
        self._steps += 1

    # -- replica synchronisation ------------------------------------------------------------

    def flat_parameters(self) -> np.ndarray:
        return flatten_to_host(self._params)

    def load_flat_parameters(self, flat: np.ndarray) -> None:
        copy_flat_into(self._params, flat, "load_flat_parameters")

    def flat_buffers(self) -> np.ndarray:
        return flatten_to_host(self._buffers)

    def load_flat_buffers(self, flat: np.ndarray) -> None:
        copy_flat_into(self._buffers, flat, "load_flat_buffers")

    # -- evaluation -------------------------------------------------------------------------

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> dict[str, float]:
        check_evaluate(len(x), len(y), batch_size)
        return self._evaluated(x, y, batch_size, keep=False)[0]

    def _predicted(self, x: np.ndarray, batch_size: int) -> np.ndarray:
        self.net.eval()
        with torch.inference_mode():
            parts = [self._probabilities(self.net(self._inputs(x[i : i + batch_size])))
                     for i in range(0, len(x), batch_size)]
        return np.concatenate(parts)

    def _evaluated(self, x: np.ndarray, y: np.ndarray, batch_size: int, keep: bool):
        """`evaluate`'s metrics and, where `keep`, the probabilities of the same forward passes."""
        count = len(x)
        self.net.eval()
        sums, probabilities = [], []
        with torch.inference_mode():
            for i in range(0, count, batch_size):
                loss, correct, logits = self._eval_sums(x[i : i + batch_size], y[i : i + batch_size])
                sums.append(torch.stack((loss, correct)))
                if keep:
                    probabilities.append(self._probabilities(logits))
            loss, correct = torch.stack(sums).sum(dim=0).tolist()
        return {"loss": loss / count, "accuracy": correct / count}, np.concatenate(probabilities) if keep else None

    @staticmethod
    def _probabilities(logits: torch.Tensor) -> np.ndarray:
        """The softmax of a batch's outputs, as float32 host rows."""
        return torch.softmax(logits.float(), dim=1).cpu().numpy()

    # -- the base's primitives (epochs and checkpoints) -------------------------------------

    def _schedule_lr(self) -> None:
        self._lr = self._optimizer.lr = epoch_lr(self.spec.train, self._epoch)

    def _model_state(self) -> dict[str, Any]:
        return {"model": to_host(self.net.state_dict()), "optimizer": to_host(self._optimizer.state_dict())}

    def _load_model_state(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["model"])
        self._optimizer.load_state_dict(to_host(state["optimizer"]))

    def _extra_state(self) -> dict[str, Any]:
        return {"rng": self._rng_state()}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self._load_rng_state(state["rng"])  # after the steps: across device types it reseeds from them

    # -- helpers ----------------------------------------------------------------------------

    def _pinned_like(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """A pinned host twin of a device tensor (None on the CPU, where none is needed)."""
        if self.device.type == "cpu":
            return None
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)

    def _batch(self, x: Rows, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Check a batch's shapes and move it to the device."""
        return batch_tensors(x, y, self.input_shape, f"model {self.model_id!r}", self.device)

    def _inputs(self, x: Rows) -> torch.Tensor:
        """Check samples' shape and move them to the device."""
        if tuple(x.shape[1:]) != self.input_shape or x.ndim != 4:
            raise ValueError(
                f"model {self.model_id!r}: expected x of shape (N, {', '.join(map(str, self.input_shape))}), "
                f"got {tuple(x.shape)}"
            )
        return rows_to_device(x, self.device)

    def _eval_sums(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Summed loss and number of correct predictions of one batch, and its outputs (device
        tensors, no sync)."""
        inputs, targets = self._batch(x, y)
        logits = self.net(inputs)
        loss = F.cross_entropy(logits, targets, reduction="sum")
        correct = (logits.argmax(dim=1) == targets).sum().to(loss.dtype)
        return loss, correct, logits

    def _uses_global_rng(self) -> bool:
        """User models may draw from torch's global RNG (e.g. `nn.Dropout`); zoo models do not."""
        return is_user_family(self.spec.family)

    def _rng_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"device_type": self.device.type, "generator": self._generator.get_state()}
        if self._uses_global_rng():
            state["torch_cpu"] = torch.get_rng_state()
            if self.device.type == "cuda":
                state["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def _load_rng_state(self, rng: Mapping[str, Any]) -> None:
        """Restore the RNGs; across device types, reseed deterministically from the step count."""
        restore_generator(self._generator, rng, self.spec.seed, self._steps)
        if self._uses_global_rng() and "torch_cpu" in rng:
            torch.set_rng_state(rng["torch_cpu"])
            if self.device.type == "cuda" and "torch_cuda" in rng:
                torch.cuda.set_rng_state(rng["torch_cuda"], self.device)

