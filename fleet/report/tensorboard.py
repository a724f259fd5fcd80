"""TensorBoard scalars of a run, written by rank 0 from the epoch reports it already gets.

One folder per model under ``RUN_DIR/tensorboard/`` (TensorBoard shows each as a run), tags
``loss/train``, ``loss/val``, ``accuracy/val``, ``lr`` and ``samples_per_s`` at step = epoch:
``tensorboard --logdir runs/NAME`` shows the ensemble, while it trains too (each epoch's
record is on disk when the epoch is reported). A resumed job adds a new events file beside
the old one; TensorBoard reads both.

The files are TensorBoard's own format, written here without TensorFlow or tensorboard: a
sequence of records (length, masked CRC-32C of the length, a serialized ``Event`` protocol
buffer, masked CRC-32C of it), the first record holding the file version.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

FILE_VERSION = b"brain.Event:2"
TAGS = (("loss/train", "train_loss"), ("loss/val", "val_loss"), ("accuracy/val", "val_accuracy"),
        ("lr", "lr"), ("samples_per_s", "samples_per_s"))


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord files use it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def event_bytes(wall_time: float, step: int, scalars: dict[str, float] | None = None,
                file_version: bytes | None = None) -> bytes:
    """A serialized ``tensorflow.Event``: wall time, step, and a file version or a summary of
    simple scalar values."""
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if file_version is not None:
        out += _length_delimited(3, file_version)
    if scalars:
        values = b"".join(
            _length_delimited(1, _length_delimited(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _length_delimited(5, values)
    return out


def record(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


class ScalarBoard:
    """Appends each model's epoch scalars to its events file (opened per write: a run of a
    thousand models holds no file open)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._files: dict[str, Path] = {}
        self._suffix = f"{int(time.time())}.{socket.gethostname()}.{os.getpid()}"

    def _file(self, model: str) -> Path:
        path = self._files.get(model)
        if path is None:
            folder = self.root / model
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"events.out.tfevents.{self._suffix}"
            if not path.exists():  # a writer of this second and process appends to it
                path.write_bytes(record(event_bytes(time.time(), 0, file_version=FILE_VERSION)))
            self._files[model] = path
        return path

    def add(self, model: str, step: int, scalars: dict[str, float]) -> None:
        """Write `scalars` (tag -> value) of `model` at `step`; OSError is the caller's."""
        with self._file(model).open("ab") as out:
            out.write(record(event_bytes(time.time(), step, scalars)))

    def epoch(self, report) -> None:
        """An `EpochReport`'s scalars at step = its epoch."""
        self.add(report.model, report.epoch, {tag: float(getattr(report, name)) for tag, name in TAGS})
