"""`FusedTorchEngine`: K models of one architecture trained as one fused model on one device.

The members (which may fuse: `fleet.engines.fusion`) are built and seeded exactly as the torch
engine builds each (same initial weights, same dropout generator), then stacked
(`fleet.engines.torch.stacked`): one ``torch.func.vmap`` forward and one backward over the batch
they share give every member its own loss and gradients; one vectorised optimizer step
(`StackedUpdate`) applies each member's own learning rate (from its own schedule and epoch),
momentum and weight decay to its row. Batch norm keeps running statistics per member; dropout
draws each member's masks from its own generator. A member's weights after N steps are those
its own `TorchEngine` reaches on the same batches, within float tolerance (the vectorised
convolutions sum in another order; tests/test_fused_engine.py).

Checkpoints stay per model: `member_state(model_id)` is the state a `TorchEngine` of that model
writes (its `LAYOUT`, loadable by `TorchEngine.load_state`, encoded by the same codec), and a
model's state (from a `TorchEngine` or from a bundle) goes back in with `join` or the
constructor. A member leaves (`leave`) without disturbing the others: their rows, optimizer
state, generators, epochs and step counts are untouched.

Not thread-safe: one trainer thread owns a bundle, as it owns an engine.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fleet.engines._base import check_evaluate, check_predict, check_state
from fleet.engines.fusion import bundle_refusal
from fleet.engines.options import EngineOptions
from fleet.engines.schedule import epoch_lr
from fleet.engines.torch.codec import CODEC
from fleet.engines.torch.engine import (
    LAYOUT,
    batch_tensors,
    configure_torch,
    derived_seed,
    resolve_device,
    restore_generator,
)
from fleet.engines.torch.fused_optim import StackedUpdate
from fleet.engines.torch.optim import ParamUpdate
from fleet.engines.torch.stacked import StackedNet, StackedWeights
from fleet.engines.torch.zoo import build_model
from fleet.errors import UserError
from fleet.rows import Rows


@dataclass
class Member:
    """One model of a bundle: what it was built from and its own counters and generator."""

    options: EngineOptions
    generator: torch.Generator
    num_parameters: int
    epoch: int = 0
    steps: int = 0

    @property
    def model_id(self) -> str:
        return self.options.model.id


@dataclass
class Admitted:
    """A model about to join a bundle: its module and single-model optimizer, with their values."""

    member: Member
    net: torch.nn.Module
    update: ParamUpdate


class FusedTorchEngine:
    """K models of one architecture on one device, trained as one fused model.

    Args:
        members: each member's options (the same input shape, classes, device, threads and
            determinism; models that may fuse: `fleet.engines.fusion.bundle_refusal`).
        states: model id -> a torch engine state (`TorchEngine.state()` or `member_state`) to
            start that member from; the others start from their seeded initial weights.

    Raises:
        UserError: the models may not fuse (the reason), a bad device, or a state that is not
            the model's.
        ValueError: the members' options disagree on shape, classes, device or threads.
    """

    codec = CODEC
    layout = LAYOUT

    def __init__(self, members: Sequence[EngineOptions], states: Mapping[str, dict[str, Any]] | None = None):
        reason = bundle_refusal([options.model for options in members])
        if reason:
            raise UserError(f"cannot fuse: {reason}")
        first = members[0]
        self.options = first
        self.input_shape = first.input_shape
        self.device = resolve_device(first.device)
        configure_torch(self.device, first.threads, first.deterministic)
        self._members: list[Member] = []
        admitted = [self._admit(options, (states or {}).get(options.model.id)) for options in members]
        self._net = StackedNet(admitted[0].net, self.input_shape)
        self._weights = StackedWeights(admitted[0].net, self.device)
        self._update = StackedUpdate(first.model.train.optimizer, admitted[0].member.num_parameters, self.device)
        self._append(admitted)

    # -- members --------------------------------------------------------------------------------

    @property
    def model_ids(self) -> list[str]:
        """The members' ids, in their row order."""
        return [member.model_id for member in self._members]

    def join(self, options: EngineOptions, state: dict[str, Any] | None = None) -> None:
        """Add a model (from its seeded initial weights, or from `state`) as the last member.

        Raises:
            UserError: it may not fuse with the members (the reason), or `state` is not its own.
            ValueError: its options disagree with the bundle's (shape, classes, device, threads).
        """
        reason = bundle_refusal([*(m.options.model for m in self._members), options.model])
        if reason:
            raise UserError(f"model {options.model.id!r} cannot join the bundle: {reason}")
        self._append([self._admit(options, state)])

    def leave(self, model_id: str) -> dict[str, Any]:
        """Take a member out: its state (`member_state`); the others go on as they were.

        Raises:
            KeyError: no such member.
            ValueError: it is the last member (keep its `member_state` and drop the bundle).
        """
        index = self._index(model_id)
        if len(self._members) == 1:
            raise ValueError(f"model {model_id!r} is the bundle's last member: take its member_state instead")
        state = self.member_state(model_id)
        self._weights.remove(index)
        self._update.remove(index)
        del self._members[index]
        return state

    def member_state(self, model_id: str) -> dict[str, Any]:
        """The member's state as its own `TorchEngine.state()` would give it (host tensors)."""
        index, member = self._index(model_id), self._member(model_id)
        optimizer = self._update.member_state(index, self._weights.shapes)
        return {"format": LAYOUT.format, "model_id": model_id, "family": member.options.model.family,
                "num_parameters": member.num_parameters, "model": self._weights.member_state_dict(index),
                "optimizer": optimizer, "epoch": member.epoch, "steps": member.steps,
                "rng": {"device_type": self.device.type, "generator": member.generator.get_state()}}

    def member_state_bytes(self, model_id: str) -> bytes:
        """`member_state` encoded as a torch engine's checkpoint (`TorchEngine.load_state_bytes` reads it)."""
        return self.codec.encode(self.member_state(model_id))

    def member_parameters(self, model_id: str) -> np.ndarray:
        """The member's trainable parameters as a new flat float32 host array
        (`TorchEngine.flat_parameters`'s layout)."""
        return self._weights.member_row(self._index(model_id)).detach().cpu().numpy().copy()

    def epoch(self, model_id: str) -> int:
        """Epochs the member completed."""
        return self._member(model_id).epoch

    def steps(self, model_id: str) -> int:
        """Optimizer steps the member took."""
        return self._member(model_id).steps

    def lr(self, model_id: str) -> float:
        """The learning rate of the member's next step."""
        return self._update.lrs[self._index(model_id)]

    # -- training -------------------------------------------------------------------------------

    def train_step(self, x: Rows, y: np.ndarray) -> dict[str, float]:
        """Forward, backward and optimizer step of every member on the shared batch; each
        member's mean loss, by model id."""
        inputs, targets = batch_tensors(x, y, self.input_shape, self._who(), self.device)
        masks = self._net.draw_masks([m.generator for m in self._members], len(inputs), self.device)
        self._weights.grads.zero_()
        logits = self._net.logits(self._weights, masks, inputs, training=True)
        losses = member_losses(logits, targets, "mean")
        with warnings.catch_warnings():  # the gradients are views of a member's row, by design
            warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")
            losses.sum().backward()
        self._update.step(self._weights.params, self._weights.grads)
        for member in self._members:
            member.steps += 1
        return dict(zip(self.model_ids, losses.detach().tolist()))

    def end_epoch(self, model_id: str) -> None:
        """Count one more epoch of the member and set its next learning rate from its schedule."""
        member = self._member(model_id)
        member.epoch += 1
        self._update.set_lr(self._index(model_id), epoch_lr(member.options.model.train, member.epoch))

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> dict[str, dict[str, float]]:
        """Each member's ``{"loss", "accuracy"}`` in eval mode, without gradients, by model id."""
        return {model_id: metrics for model_id, (metrics, _) in self._evaluated(x, y, batch_size, False).items()}

    def evaluate_with_probabilities(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256
                                    ) -> dict[str, tuple[dict[str, float], np.ndarray]]:
        """`evaluate`'s metrics and, from the same forward passes, each sample's class
        probabilities (float32 ``(N, classes)``, the softmax of the member's outputs), by model id."""
        return self._evaluated(x, y, batch_size, True)

    def predict(self, x: np.ndarray, batch_size: int = 256) -> dict[str, np.ndarray]:
        """Each member's class probabilities of `x` (float32 ``(N, classes)``) in eval mode, by model id."""
        check_predict(len(x), batch_size)
        parts = []
        with torch.no_grad():
            for start in range(0, len(x), batch_size):
                rows = x[start:start + batch_size]
                inputs, _ = batch_tensors(rows, np.zeros(len(rows), np.int64), self.input_shape, self._who(),
                                          self.device)
                parts.append(torch.softmax(self._net.logits(self._weights, {}, inputs, training=False).float(), dim=2))
        stacked = torch.cat(parts, dim=1).cpu().numpy()
        return {model_id: stacked[k] for k, model_id in enumerate(self.model_ids)}

    def parameter_count(self, model_id: str) -> int:
        """The member's trainable parameters (its `TorchEngine.num_parameters`)."""
        return self._member(model_id).num_parameters

    def _evaluated(self, x: np.ndarray, y: np.ndarray, batch_size: int, keep: bool) -> dict[str, tuple]:
        """Each member's metrics and, where `keep`, its probabilities from the same passes."""
        count = len(x)
        check_evaluate(count, len(y), batch_size)
        sums = torch.zeros((2, len(self._members)), device=self.device)
        kept = []
        with torch.no_grad():
            for start in range(0, count, batch_size):
                inputs, targets = batch_tensors(x[start:start + batch_size], y[start:start + batch_size],
                                                self.input_shape, self._who(), self.device)
                logits = self._net.logits(self._weights, {}, inputs, training=False)
                correct = (logits.argmax(dim=2) == targets).sum(dim=1).to(sums.dtype)
                sums += torch.stack([member_losses(logits, targets, "sum"), correct])
                if keep:
                    kept.append(torch.softmax(logits.float(), dim=2))
        loss, correct = (sums / count).tolist()
        probabilities = torch.cat(kept, dim=1).cpu().numpy() if keep else None
        return {model_id: ({"loss": l, "accuracy": c}, None if probabilities is None else probabilities[k])
                for k, (model_id, l, c) in enumerate(zip(self.model_ids, loss, correct))}

    # -- helpers --------------------------------------------------------------------------------

    def _admit(self, options: EngineOptions, state: dict[str, Any] | None) -> Admitted:
        """A model's module, optimizer and counters, seeded as its `TorchEngine` seeds them and
        loaded from `state` where given."""
        self._check_options(options)
        model = options.model
        net = build_model(model.family, model.params, self.input_shape, options.num_classes, seed=model.seed)
        params = [p for p in net.parameters() if p.requires_grad]
        update = ParamUpdate(params, model.train)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(derived_seed(model.seed, "dropout"))
        member = Member(options, generator, sum(p.numel() for p in params))
        if state is not None:
            load_member(member, net, update, state)
        return Admitted(member, net, update)

    def _append(self, admitted: Sequence[Admitted]) -> None:
        self._weights.extend([entry.net for entry in admitted])
        for entry in admitted:
            model = entry.member.options.model
            self._update.append(model.train, epoch_lr(model.train, entry.member.epoch), entry.update)
            self._members.append(entry.member)

    def _check_options(self, options: EngineOptions) -> None:
        """The options agree with the bundle's in what one fused model shares."""
        ours = self.options
        for field in ("input_shape", "num_classes", "device", "threads", "deterministic"):
            if getattr(options, field) != getattr(ours, field):
                raise ValueError(f"model {options.model.id!r}: its {field} {getattr(options, field)!r} is not the "
                                 f"bundle's {getattr(ours, field)!r}")

    def _index(self, model_id: str) -> int:
        for index, member in enumerate(self._members):
            if member.model_id == model_id:
                return index
        raise KeyError(f"model {model_id!r} is not in the bundle ({', '.join(self.model_ids)})")

    def _member(self, model_id: str) -> Member:
        return self._members[self._index(model_id)]

    def _who(self) -> str:
        return f"bundle of {', '.join(self.model_ids)}"


def member_losses(logits: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    """Each member's cross-entropy (`reduction` over the batch: ``mean`` or ``sum``) from
    ``(K, N, classes)`` logits and the shared ``(N,)`` targets: a ``(K,)`` tensor."""
    count, batch = logits.shape[:2]
    losses = F.cross_entropy(logits.flatten(0, 1), targets.repeat(count), reduction="none").view(count, batch)
    return losses.mean(dim=1) if reduction == "mean" else losses.sum(dim=1)


def load_member(member: Member, net: torch.nn.Module, update: ParamUpdate, state: dict[str, Any]) -> None:
    """Load a torch engine state of the member's model into its module, optimizer, counters and
    generator (as `TorchEngine.load_state` does).

    Raises:
        UserError: the state is not a torch engine state of this model, or does not fit it.
    """
    check_state(member, state, LAYOUT)  # type: ignore[arg-type]  # a member has the model_id and size it reads
    try:
        net.load_state_dict(state["model"])
        update.load_state_dict(state["optimizer"])
    except LAYOUT.misfits as exc:
        problem = " ".join(str(exc).split())[:300]
        raise UserError(f"checkpoint of model {member.model_id!r}: does not fit its network: {problem}") from None
    member.epoch, member.steps = int(state["epoch"]), int(state["steps"])
    restore_generator(member.generator, state["rng"], member.options.model.seed, member.steps)
