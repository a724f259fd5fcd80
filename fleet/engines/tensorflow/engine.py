"""`TensorFlowEngine`: the engine interface (see `fleet/engines/_base.py`) for Keras models, on the
CPU or on one GPU per trainer."""

from __future__ import annotations

from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from fleet.engines._base import Engine, EnginePhase, StateLayout, check_evaluate
from fleet.engines.options import EngineOptions
from fleet.engines.schedule import epoch_lr
from fleet.engines.tensorflow.flat import FlatAssigner, flatten
from fleet.engines.tensorflow.gradients import Gradients
from fleet.engines.tensorflow.optim import GraphOptimizer
from fleet.engines.tensorflow.zoo import KerasZoo
from fleet.engines.tree_codec import TreeStateCodec
from fleet.errors import UserError
from fleet.rows import Rows, joined

LAYOUT = StateLayout(
    format="fleet.tensorflow_engine/1",
    kind="a tensorflow engine state",
    keys=frozenset({"model_id", "num_parameters", "parameters", "buffers", "optimizer", "epoch", "steps", "rng"}),
    misfits=(ValueError, KeyError, TypeError),
)
CODEC = TreeStateCodec()
ZOO = KerasZoo()


def check_device(device: str) -> str:
    """``cpu``, or ``cuda:<i>`` made this process's only GPU (`bind_gpu`); anything else is a
    `UserError`."""
    device = str(device)
    if device == "cpu":
        return "cpu"
    if device == "cuda" or device.startswith("cuda:"):
        bind_gpu(device)
        return device
    raise UserError(f"device {device!r}: expected 'cpu' or 'cuda:<index>'")


def bind_gpu(device: str) -> None:
    """Make GPU `i` of ``cuda:<i>`` (CUDA_VISIBLE_DEVICES numbering, as torch's) the only GPU
    TensorFlow uses in this process, with memory growth on, so that the trainers of a node
    share no GPU and none takes all of its GPU's memory at start. TF accepts this only before
    its runtime starts; afterwards the same GPU alone must already be the visible one."""
    index_text = device.partition(":")[2] or "0"
    if not index_text.isdigit():
        raise UserError(f"device {device!r}: expected 'cuda:<index>'")
    gpus = tf.config.list_physical_devices("GPU")
    if int(index_text) >= len(gpus):
        raise UserError(f"device {device!r}: TensorFlow sees {len(gpus)} GPU(s) here (is the tensorflow-cpu "
                        "wheel installed? a CUDA machine needs the tensorflow wheel, see docs/cluster.md)")
    gpu = gpus[int(index_text)]
    try:
        tf.config.set_visible_devices(gpu, "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:  # TF's runtime has started: its devices are fixed for the process
        if tf.config.get_visible_devices("GPU") != [gpu]:
            raise UserError(f"device {device!r}: TensorFlow already started in this process with other GPUs "
                            "visible") from None


def configure_tensorflow(threads: int | None, deterministic: bool) -> None:
    """Process-wide TF settings: CPU threads (only before TF starts its runtime; later calls
    are ignored, as TF refuses them) and deterministic kernels."""
    if threads is not None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # TF has started: its thread pools are fixed for the process
            pass
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def is_float(variable: Any) -> bool:
    return keras.backend.standardize_dtype(variable.dtype).startswith(("float", "bfloat"))


def mean_loss(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


class TensorFlowEngine(Engine):
    """One replica of a `ModelSpec`'s Keras network, its optimizer and LR schedule, on the CPU
    or on the trainer's GPU (the only one TensorFlow sees in its process).

    Gradients stay TF tensors until something asks for the flat float32 numpy array
    (`gradient_buffer`, `flat_gradients`, `scale_gradients`) that fleet's host collectives
    reduce in place (`Gradients`); a lone trainer's `train_step` is one compiled call
    (forward, backward and the update) and no host copy. The optimizer (`GraphOptimizer`)
    updates the variables in the graph with torch's SGD/Adam/AdamW semantics. Dropout masks
    come from the model's seeded Keras dropout layers, whose RNG states (integer variables)
    are part of `state()`.

    Args:
        options: the model (its seed seeds the initial weights and dropout), the sample shape,
            the classes; the device (``cpu`` or ``cuda:<i>``); ``threads``: TensorFlow's intra-
            and inter-op thread counts, if TF has not started yet; ``deterministic``:
            TensorFlow's deterministic kernels (process-wide).

    Raises:
        UserError: an unusable device, unknown family, bad params, or an unbuildable user model.
    """

    codec = CODEC
    layout = LAYOUT

    def __init__(self, options: EngineOptions):
        super().__init__(options)
        model = options.model
        self.device = check_device(options.device)
        configure_tensorflow(options.threads, options.deterministic)
        self.net = ZOO.build(model.family, model.params, self.input_shape, options.num_classes, seed=model.seed)
        self._params = list(self.net.trainable_variables)
        if not self._params:
            raise UserError(f"family {model.family!r}: the model has no trainable parameters")
        frozen = self.net.non_trainable_variables
        self._buffers = [v for v in frozen if is_float(v)]
        self._rng = [v for v in frozen if not is_float(v)]  # dropout layers' seed-generator states
        self.num_parameters = sum(int(np.prod(v.shape)) for v in self._params)
        self._assign_params, self._assign_buffers = FlatAssigner(self._params), FlatAssigner(self._buffers)
        self._grads = Gradients(int(np.prod(v.shape)) for v in self._params)
        self._optimizer = GraphOptimizer(model.train, self._params)
        batch = [tf.TensorSpec((None, *self.input_shape), tf.float32), tf.TensorSpec((None,), tf.int64)]
        # traced for the first batch size, then once more for any: static shapes make the lstm's loop faster
        self._gradients_fn = tf.function(self._gradients, reduce_retracing=True)
        self._train_fn = tf.function(self._train, reduce_retracing=True)
        self._eval_fn = tf.function(self._eval_sums, input_signature=batch)
        self._probs_fn = tf.function(self._probabilities, input_signature=batch[:1])
        self._schedule_lr()

    # -- properties -------------------------------------------------------------------------

    @property
    def traces(self) -> int:
        """How often its training step's compiled functions were traced: a few at the start
        (per first batch size, then any), none per step or per learning rate."""
        functions = (self._gradients_fn, self._train_fn)
        return sum(f.experimental_get_tracing_count() for f in functions) + self._optimizer.traces

    # -- training ---------------------------------------------------------------------------

    def train_step(self, x: Rows, y: np.ndarray) -> float:
        """`compute_gradients` and `apply_gradients` in one compiled call (no collective between)."""
        inputs, labels = self._batch(x, y)
        loss = self._train_fn(inputs, labels)
        self._grads.zero()
        self._phase, self._steps = EnginePhase.TRAINING, self._steps + 1
        return float(loss)

    def compute_gradients(self, x: Rows, y: np.ndarray) -> float:
        inputs, labels = self._batch(x, y)
        loss, grads = self._gradients_fn(inputs, labels)
        self._grads.hold(grads)
        self._phase = EnginePhase.TRAINING
        return float(loss)

    def flat_gradients(self) -> np.ndarray:
        return self._grads.host()

    def gradient_buffer(self) -> np.ndarray:
        """The gradient buffer itself: a host numpy array (fleet's host collectives reduce it),
        filled with the last computed gradients when this is called."""
        return self._grads.host()

    def scale_gradients(self, factor: float) -> None:
        self._grads.scale(factor)

    def load_flat_gradients(self, flat: Any) -> None:
        self._grads.load(flat)

    def apply_gradients(self) -> None:
        tensors = self._grads.tensors
        if tensors is None:
            self._optimizer.apply_flat(self._grads.buffer)
        else:
            self._optimizer.apply(tensors)
        self._grads.zero()
        self._steps += 1

    # -- replica synchronisation ------------------------------------------------------------

    def flat_parameters(self) -> np.ndarray:
        return flatten(self._params)

    def load_flat_parameters(self, flat: np.ndarray) -> None:
        self._assign_params(flat, "load_flat_parameters")

    def flat_buffers(self) -> np.ndarray:
        return flatten(self._buffers)

    def load_flat_buffers(self, flat: np.ndarray) -> None:
        self._assign_buffers(flat, "load_flat_buffers")

    # -- evaluation -------------------------------------------------------------------------

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> dict[str, float]:
        check_evaluate(len(x), len(y), batch_size)
        return self._evaluated(x, y, batch_size, keep=False)[0]

    def _predicted(self, x: np.ndarray, batch_size: int) -> np.ndarray:
        parts = [self._probs_fn(self._inputs(x[i : i + batch_size])).numpy() for i in range(0, len(x), batch_size)]
        return np.concatenate(parts).astype(np.float32, copy=False)

    def _evaluated(self, x: np.ndarray, y: np.ndarray, batch_size: int, keep: bool):
        """`evaluate`'s metrics and, where `keep`, the probabilities of the same forward passes."""
        count = len(x)
        loss, correct, probabilities = 0.0, 0.0, []
        for i in range(0, count, batch_size):
            batch_loss, batch_correct, probs = self._eval_fn(*self._batch(x[i : i + batch_size], y[i : i + batch_size]))
            loss, correct = loss + float(batch_loss), correct + float(batch_correct)
            if keep:
                probabilities.append(probs.numpy())
        kept = np.concatenate(probabilities).astype(np.float32, copy=False) if keep else None
        return {"loss": loss / count, "accuracy": correct / count}, kept

    # -- the base's primitives (epochs and checkpoints) -------------------------------------

    def _schedule_lr(self) -> None:
        self._lr = epoch_lr(self.spec.train, self._epoch)
        self._optimizer.set_lr(self._lr)

    def _model_state(self) -> dict[str, Any]:
        return {"parameters": self.flat_parameters(), "buffers": self.flat_buffers(),
                "optimizer": self._optimizer.state()}

    def _load_model_state(self, state: dict[str, Any]) -> None:
        self.load_flat_parameters(state["parameters"])
        self.load_flat_buffers(state["buffers"])
        self._optimizer.load_state(state["optimizer"], self.num_parameters)
        self._load_rng(state["rng"])  # written after the counters, checked here: a misfit is a UserError

    def _extra_state(self) -> dict[str, Any]:
        return {"rng": [np.array(v.numpy()) for v in self._rng]}

    # -- helpers ----------------------------------------------------------------------------

    def _gradients(self, inputs: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """Mean loss and the gradient of each parameter (zeros for one the loss does not use)."""
        with tf.GradientTape() as tape:
            loss = mean_loss(self.net(inputs, training=True), labels)
        grads = tape.gradient(loss, self._params)
        return loss, [tf.zeros(p.shape) if g is None else tf.convert_to_tensor(g) for p, g in zip(self._params, grads)]

    def _train(self, inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        loss, grads = self._gradients(inputs, labels)
        self._optimizer.update(grads)
        return loss

    def _eval_sums(self, inputs: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Summed loss and number of correct predictions of one batch, in inference mode, and
        its class probabilities (left on the device unless asked for)."""
        logits = self.net(inputs, training=False)
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32))
        return loss, correct, tf.nn.softmax(tf.cast(logits, tf.float32))

    def _probabilities(self, inputs: tf.Tensor) -> tf.Tensor:
        """Class probabilities of one batch, in inference mode."""
        return tf.nn.softmax(tf.cast(self.net(inputs, training=False), tf.float32))

    def _batch(self, x: Rows, y: np.ndarray) -> tuple[tf.Tensor, tf.Tensor]:
        """Check a batch's shapes and make it tensors (float32 NCHW images, int64 labels)."""
        if len(y) != len(x):
            raise ValueError(f"model {self.model_id!r}: expected N labels for x of {len(x)} samples, got y "
                             f"{tuple(np.shape(y))}")
        return self._inputs(x), tf.convert_to_tensor(np.asarray(y, dtype=np.int64))

    def _inputs(self, x: Rows) -> tf.Tensor:
        """Check samples' shape and make them a float32 NCHW tensor."""
        if tuple(x.shape[1:]) != self.input_shape or len(x.shape) != 4:
            raise ValueError(
                f"model {self.model_id!r}: expected x of shape (N, {', '.join(map(str, self.input_shape))}), "
                f"got {tuple(x.shape)}"
            )
        return tf.convert_to_tensor(np.ascontiguousarray(joined(x), dtype=np.float32))

    def _load_rng(self, arrays: Sequence[np.ndarray]) -> None:
        if len(arrays) != len(self._rng):
            raise ValueError(f"{len(arrays)} RNG states, the network has {len(self._rng)}")
        for variable, array in zip(self._rng, arrays):
            variable.assign(np.asarray(array).astype(keras.backend.standardize_dtype(variable.dtype)))

