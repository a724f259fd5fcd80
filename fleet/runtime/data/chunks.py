"""Sample chunks: the unit that preprocessors decode and broadcast.

A chunk is one contiguous uint8 buffer (so it travels through MPI's buffer interface, never
pickled): a header of 8 int64s, then `capacity` int64 labels, then `capacity` float32
samples (C, H, W). Only the first `count` rows are valid.

A stream's samples are the concatenation of per-epoch permutations of the training set;
chunk k holds positions [i*C, (i+1)*C) of epoch k // K, where K = ceil(n / C) chunks make
one epoch (the last one may be short). Every rank computes the same order from the
stream's `StreamSource`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum, IntFlag

import numpy as np

from fleet.runtime.protocol import StreamSource
from preprocess.split import epoch_order

HEADER_WORDS = 8
HEADER_BYTES = HEADER_WORDS * 8


class Field(IntEnum):
    INDEX = 0  # chunk index in the stream
    EPOCH = 1  # stream epoch the chunk belongs to
    COUNT = 2  # valid samples
    FLAGS = 3
    REGROUP_VERSION = 4  # in-band notice: the stream's layout changes ...
    REGROUP_SWITCH = 5  # ... to this version from this chunk on (0, 0: none known)
    SHM_PLACE = 6  # (descriptors) owner rank * SLOT_LIMIT + slot of the chunk in shared memory
    SHM_TICKET = 7  # (descriptors) the slot's ticket, which its readers write back to release it
    SHARE_START = 5  # (shares read in shared memory) the share's first row in its chunk


class Flag(IntFlag):
    NONE = 0
    EPOCH_END = 1  # (shares) the member's epoch ends after this share
    LEAVE = 2  # (shares) no more data: the member leaves the stream
    IN_SHM = 4  # (chunks) a descriptor: the chunk is in a preprocessor's shared-memory slot
    HOLLOW = 8  # (chunks) a header only, nothing decoded: every member of the stream is leaving


def is_hollow(header: np.ndarray) -> bool:
    """A chunk sent without samples, once every member of its stream had left (see preprocessor.py)."""
    return bool(int(header[Field.FLAGS]) & Flag.HOLLOW)


@dataclass(frozen=True)
class ChunkLayout:
    """Byte layout of a chunk of `capacity` samples of shape `sample_shape` (C, H, W)."""

    capacity: int
    sample_shape: tuple[int, int, int]

    @property
    def sample_floats(self) -> int:
        return math.prod(self.sample_shape)

    @property
    def nbytes(self) -> int:
        return HEADER_BYTES + self.capacity * (8 + 4 * self.sample_floats)

    def new_buffer(self) -> np.ndarray:
        """An uninitialised buffer: the header and the first `count` rows are always written."""
        return np.empty(self.nbytes, dtype=np.uint8)

    def header(self, buf: np.ndarray) -> np.ndarray:
        return buf[:HEADER_BYTES].view(np.int64)

    def labels(self, buf: np.ndarray) -> np.ndarray:
        return buf[HEADER_BYTES : HEADER_BYTES + 8 * self.capacity].view(np.int64)

    def images(self, buf: np.ndarray) -> np.ndarray:
        start = HEADER_BYTES + 8 * self.capacity
        return buf[start:].view(np.float32).reshape(self.capacity, *self.sample_shape)

    def used_bytes(self, count: int) -> int:
        """Bytes that hold `count` samples when the rows are packed (see `pack_rows`)."""
        return HEADER_BYTES + count * (8 + 4 * self.sample_floats)


def write_header(
    header: np.ndarray, index: int, epoch: int, count: int, flags: int = 0, regroup: tuple[int, int] = (0, 0)
) -> None:
    header[:] = 0
    header[Field.INDEX], header[Field.EPOCH], header[Field.COUNT], header[Field.FLAGS] = index, epoch, count, flags
    header[Field.REGROUP_VERSION], header[Field.REGROUP_SWITCH] = regroup


def chunk_tag(stream: int, chunk: int) -> int:
    """Tag of chunk `chunk` of `stream` on its way from a preprocessor to its paired master."""
    return 100_000 + (stream % 4096) * 4096 + chunk % 4096


def share_tag(chunk: int) -> int:
    """Tag of a master's share message to a worker of its group."""
    return 200 + chunk % 4096


def share_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """Split `count` rows into `parts` contiguous blocks whose sizes differ by at most one."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def samples_before(chunk: int, n: int, chunk_samples: int) -> int:
    """Samples in chunks [0, chunk) of a stream over `n` training samples."""
    per_epoch = math.ceil(n / chunk_samples)
    epochs, i = divmod(chunk, per_epoch)
    return epochs * n + min(n, i * chunk_samples)


def member_end_chunk(first: int, epochs: int, n: int, chunk_samples: int, done: int = 0) -> int:
    """The chunk after the one that ends a member's `epochs`-th epoch, for a member that takes
    the stream from chunk `first`, `done` samples into its current epoch.

    A member's epoch is exactly `n` samples of the stream, the first one the `n - done` it
    lacks (`MemberClock`), so its last epoch ends at sample ``n - done + (epochs - 1) * n``
    from the start of chunk `first`; chunk k of an epoch holds min(C, n - k*C). `done` may be
    `n` or more (a checkpoint of an older fleet, whose epochs ended only at chunk
    boundaries): that epoch then ends with the next sample."""
    per_epoch = math.ceil(n / chunk_samples)
    target = samples_before(first, n, chunk_samples) + max(1, n - done) + (epochs - 1) * n
    whole, rest = divmod(target, n)
    return whole * per_epoch + -(-rest // chunk_samples)


def resumed_end_chunk(first: int, max_epochs: int, epochs_done: int, epoch_samples: int, n: int,
                      chunk_samples: int) -> int:
    """`member_end_chunk` for a member that resumes `epoch_samples` into epoch `epochs_done` + 1
    and trains to `max_epochs` (at least one more epoch): the coordinator's stream end and the
    master's own claim are both this count."""
    return member_end_chunk(first, max(1, max_epochs - epochs_done), n, chunk_samples, epoch_samples)


class StreamOrder:
    """Which training samples chunk k of a stream holds, and how to augment them."""

    def __init__(self, train_idx: np.ndarray, source: StreamSource):
        self.train_idx = np.asarray(train_idx)
        self.source = source
        self.n = len(self.train_idx)
        self.chunks_per_epoch = math.ceil(self.n / source.chunk_samples)
        self._epoch = -1
        self._order = self.train_idx

    def epoch_of(self, chunk: int) -> int:
        return chunk // self.chunks_per_epoch

    def epoch_key(self, epoch: int) -> int:
        return self.source.base_epoch + epoch

    def indices(self, chunk: int) -> np.ndarray:
        """Data-set indices of chunk `chunk`, in stream order."""
        epoch, i = divmod(chunk, self.chunks_per_epoch)
        if epoch != self._epoch:
            self._order = epoch_order(self.train_idx, self._seed(), self.epoch_key(epoch))
            self._epoch = epoch
        c = self.source.chunk_samples
        return self._order[i * c : (i + 1) * c]

    def rng(self, chunk: int) -> np.random.Generator:
        """The augmentation generator of one chunk (same on every rank and every resume)."""
        epoch, i = divmod(chunk, self.chunks_per_epoch)
        return np.random.default_rng([self.source.seed, self.source.salt, self.epoch_key(epoch), i])

    def _seed(self) -> int:
        return (self.source.seed * 1_000_003 + self.source.salt) % (1 << 31)
