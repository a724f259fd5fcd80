"""Preprocessor ranks: decode each stream's chunks once and send them to the stream's masters.

Chunk k of a stream is decoded by preprocessor `k % P` of the stream and sent (a
synchronous send, so it completes only when the master has taken it: natural flow
control) to the paired master, which broadcasts it to the other masters. A preprocessor
may serve several streams (Baseline runs one stream per model) and produces round robin
for every stream whose window has room: its share of this rank's Qp, and no more than its share
of the stream's Qp among the stream's preprocessors, so that a stream is decoded about one
Qp ahead of its masters' Qp, however many preprocessors it has. Preprocessors never create
communicators, so they never block on another rank.

Where the node has a chunk pool (`fleet.runtime.data.shm`), a chunk is decoded into one of this
rank's shared-memory slots and its root master, when on this node, is sent only a
descriptor; the slot is free again once the node's masters of the chunk have released it.

Membership changes at a chunk boundary chosen by the coordinator: `Pause` stops new chunks
and reports the next index; `Regroup` gives the switch chunk and the new layout. Every chunk
decoded after the regroup carries the notice in its header, so each master learns the
switch from the data before it has to act on it. No chunk at or past the newest layout's
`end` is decoded: the stream waits there, still open, for the regroup that ends it (its
last members leave) or moves its end (a join). Once the newest layout has no master, every
member has left or is leaving, so the chunks still owed before its switch go out hollow (a
header with the notice, nothing decoded): the masters take them in order, as they must, and
the preprocessors' time goes to the next round's streams.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleet.runtime.data.chunks import HEADER_WORDS, ChunkLayout, Flag, StreamOrder, chunk_tag, write_header
from fleet.runtime.context import RunContext
from fleet.runtime.protocol import KeepAlive, Pause, Paused, Regroup, Shutdown, StartStream, StreamDone, StreamLayout, Tag
from fleet.runtime import waiting
from fleet.runtime.data.shm import Slots, describe
from fleet.runtime.launch.signals import EXIT_CHECKPOINTED
from fleet.runtime.data.stream import wait_thread
from fleet.runtime.waiting import IDLE, WaitTimeout, abort_job, send_object


@dataclass
class InFlight:
    chunk: int
    buffer: Any  # a private buffer to reuse once sent, or None (a slot, or a descriptor)
    request: Any
    dest: int
    slot: int | None = None  # a slot whose bytes were sent: free once the send completes


@dataclass
class StreamProducer:
    """This preprocessor's part of one stream."""

    ctx: RunContext
    layouts: list[tuple[int, StreamLayout]]  # (first chunk, layout), ascending
    order: StreamOrder
    chunks: ChunkLayout
    window: int
    slots: Slots | None = None  # this rank's shared-memory slots (shared by its streams)
    next_chunk: int = 0
    paused: bool = False
    in_flight: deque = field(default_factory=deque)
    free: list = field(default_factory=list)
    decoded: int = 0
    shared: int = 0  # chunks whose root took them from shared memory
    hollow: int = 0  # chunks sent without their samples (see `ending`)
    last_progress: float = field(default_factory=time.monotonic)
    read_from: Counter = field(default_factory=Counter)  # partitioned data: samples read per part file

    def __post_init__(self) -> None:
        self.j = self.layout_at(0).preprocessors.index(self.ctx.rank)
        self.stride = len(self.layout_at(0).preprocessors)
        self.next_chunk = self.j

    @property
    def stream(self) -> int:
        return self.layouts[0][1].stream

    def layout_at(self, chunk: int) -> StreamLayout:
        return [layout for first, layout in self.layouts if first <= chunk][-1]

    def regroup(self, message: Regroup) -> None:
        self.layouts.append((message.switch_chunk, message.layout))
        self.paused = False

    @property
    def finished(self) -> bool:
        return not self.layout_at(self.next_chunk).masters and not self.in_flight

    def can_produce(self) -> bool:
        end = self.layouts[-1][1].end  # the newest layout's: ends only move forward
        return (not self.paused and len(self.in_flight) < self.window and (end is None or self.next_chunk < end)
                and bool(self.layout_at(self.next_chunk).masters))

    @property
    def ending(self) -> bool:
        """The newest layout has no master: no member trains on this stream's chunks any more."""
        return not self.layouts[-1][1].masters

    def produce(self) -> None:
        chunk = self.next_chunk
        layout = self.layout_at(chunk)
        dest = layout.owner(chunk)
        if self.ending:
            self._send_hollow(chunk, layout, dest)
            return
        slot = self.slots.take() if self.slots is not None else None
        buffer = self.slots.buffers[slot] if slot is not None else (self.free.pop() if self.free else self.chunks.new_buffer())
        self.decoded += self._decode(chunk, buffer)
        tag = chunk_tag(layout.stream, chunk)
        if slot is not None and self.ctx.pool.is_local(dest):
            readers = tuple(self.ctx.pool.local[m] for m in layout.masters if self.ctx.pool.is_local(m))
            ticket = self.slots.hold(slot, readers, f"chunk {chunk} of stream {layout.stream}")
            message = describe(self.chunks.header(buffer), self.ctx.rank, slot, ticket)
            self.ctx.pool.sync()  # the slot's bytes come before the descriptor
            self.shared += 1
            request = self.ctx.data_parent.Issend(message, dest=dest, tag=tag)
            self.in_flight.append(InFlight(chunk, None, request, dest))
        else:
            request = self.ctx.data_parent.Issend(buffer, dest=dest, tag=tag)
            self.in_flight.append(InFlight(chunk, None if slot is not None else buffer, request, dest, slot))
        self._sent(chunk)

    def _send_hollow(self, chunk: int, layout: StreamLayout, dest: int) -> None:
        header = np.empty(HEADER_WORDS, np.int64)
        write_header(header, chunk, self.order.epoch_of(chunk), 0, Flag.HOLLOW, regroup=self._notice(chunk))
        request = self.ctx.data_parent.Issend(header, dest=dest, tag=chunk_tag(layout.stream, chunk))
        self.in_flight.append(InFlight(chunk, None, request, dest))
        self.hollow += 1
        self._sent(chunk)

    def _sent(self, chunk: int) -> None:
        self.next_chunk = chunk + self.stride
        self.last_progress = time.monotonic()

    def _decode(self, chunk: int, buffer) -> int:
        indices = self.order.indices(chunk)
        count = len(indices)
        raw = self.ctx.reader.read(indices)
        if self.ctx.partition is not None:  # partitioned data: which part files this node read (HDF5 names)
            self.read_from.update(name.rpartition("[")[0] or name for name in raw.names)
        self.ctx.pipeline(raw, self.order.rng(chunk), train=True, out=self.chunks.images(buffer)[:count])
        self.chunks.labels(buffer)[:count] = raw.labels
        write_header(self.chunks.header(buffer), chunk, self.order.epoch_of(chunk), count, regroup=self._notice(chunk))
        return count

    def _notice(self, chunk: int) -> tuple[int, int]:
        """The newest regroup, for a chunk before its switch: the masters learn it from the data."""
        newest_first, newest = self.layouts[-1]
        return (newest.version, newest_first) if newest_first > chunk else (0, 0)

    def progress(self) -> bool:
        """Recycle the buffers of chunks their masters have taken."""
        moved = False
        while self.in_flight and self.in_flight[0].request.Test():
            sent = self.in_flight.popleft()
            if sent.buffer is not None:
                self.free.append(sent.buffer)
            elif sent.slot is not None:
                self.slots.give_back(sent.slot)
            moved = True
        if moved:
            self.last_progress = time.monotonic()
        return moved

    def check_stuck(self, timeout_s: float) -> None:
        if self.in_flight and time.monotonic() - self.last_progress > timeout_s:
            item = self.in_flight[0]
            raise WaitTimeout(
                f"timed out after {timeout_s:g} s waiting for master rank {item.dest} "
                f"to take chunk {item.chunk} of stream {self.stream}"
            )


class PreprocessorLoop:
    """The main loop of a preprocessor rank; with `own`, of a trainer's `OwnDecoder`: then
    the loop has no shared-memory slots (its chunks go to its own rank), ends when told to
    (`stopping`: the trainer got `Shutdown`) and may go without streams for any time."""

    def __init__(self, ctx: RunContext, own: bool = False):
        self.ctx, self.own = ctx, own
        self.streams: dict[int, StreamProducer] = {}
        self.turn = 0
        self.decoded = 0
        self.window_total = ctx.qp_chunks
        self.slots = ctx.pool.slots_of(ctx.rank) if ctx.pool is not None and not own else None
        self.stopping = threading.Event()
        self.cpu_started = 0.0  # this loop's thread's CPU seconds when it began serving
        self.idle = [0.0, 0.0]  # its rounds with streams and nothing to do: seconds, CPU seconds

    def run(self) -> None:
        self.cpu_started = time.thread_time()
        quiet_since = time.monotonic()
        sleeps = IDLE.sleeps()
        while True:
            began, cpu_began, serving = time.monotonic(), time.thread_time(), bool(self.streams)
            handled = self._commands()
            if handled is None:
                return
            busy = handled | self._reclaim() | self._progress_all() | self._produce_one()
            for producer in self.streams.values():
                producer.check_stuck(self.ctx.timeout_s)
            if self.slots is not None:
                self.slots.check_stuck(self.ctx.timeout_s, rank_of=self.ctx.pool.node_ranks.__getitem__)
            if handled:
                quiet_since = time.monotonic()
            elif not self.own and not self.streams and time.monotonic() - quiet_since > self.ctx.timeout_s:
                raise WaitTimeout(f"timed out after {self.ctx.timeout_s:g} s waiting for a command from the coordinator")
            if busy:
                sleeps = waiting.HOT.sleeps()
            else:
                time.sleep(next(sleeps))
                if serving:  # waiting for room in its streams' windows: what its polling costs
                    self.idle[0] += time.monotonic() - began
                    self.idle[1] += time.thread_time() - cpu_began

    def _commands(self) -> bool | None:
        """Handle pending commands; None means shut down."""
        if self.stopping.is_set():
            return None
        handled = False
        while (message := self.ctx.ctrl.improbe(source=0, tag=Tag.PREPROCESSOR)) is not None:
            command = message.recv()
            handled = True
            if isinstance(command, Shutdown):
                if command.reason == "checkpointed":
                    self.ctx.exit_code = EXIT_CHECKPOINTED
                return None
            if not isinstance(command, KeepAlive):
                self._handle(command)
        return handled

    def _handle(self, command: Any) -> None:
        if isinstance(command, StartStream):
            self.streams[command.layout.stream] = self._producer(command)
        elif isinstance(command, Pause):
            producer = self._stream(command)
            producer.paused = True
            reply = Paused(command.stream, command.version, self.ctx.rank, producer.next_chunk)
            send_object(self.ctx.ctrl, reply, 0, Tag.REPORT, "the coordinator to take a pause reply", self.ctx.timeout_s)
        elif isinstance(command, Regroup):
            self._stream(command).regroup(command)
        else:
            raise TypeError(f"preprocessor got an unexpected command {command!r}")

    def _stream(self, command: Pause | Regroup) -> StreamProducer:
        stream = command.stream if isinstance(command, Pause) else command.layout.stream
        if stream not in self.streams:
            raise RuntimeError(f"the coordinator sent {type(command).__name__} for stream {stream}, which this "
                               "preprocessor has ended (its last layout had no master)")
        return self.streams[stream]

    def _producer(self, command: StartStream) -> StreamProducer:
        if command.source.partition != self.ctx.partition:
            raise RuntimeError(f"stream {command.layout.stream} visits partition {command.source.partition}, and this "
                               f"preprocessor's node holds partition {self.ctx.partition}")
        order = StreamOrder(self.ctx.train_idx_of(command.source.group), command.source)
        chunks = ChunkLayout(command.source.chunk_samples, self.ctx.input_shape)
        window = max(1, min(self.window_total // max(1, len(self.streams) + 1),  # this rank's Qp, shared
                            -(-self.window_total // len(command.layout.preprocessors))))  # the stream's Qp, shared
        return StreamProducer(self.ctx, [(0, command.layout)], order, chunks, window, self.slots)

    def _reclaim(self) -> bool:
        return self.slots is not None and self.slots.reclaim()

    def _progress_all(self) -> bool:
        moved = False
        for stream_id in list(self.streams):
            producer = self.streams[stream_id]
            moved |= producer.progress()
            if producer.finished:
                del self.streams[stream_id]
                self.decoded += producer.decoded
                done = StreamDone(stream_id, self.ctx.rank, producer.decoded, producer.shared, producer.hollow,
                                  tuple(sorted(producer.read_from.items())),
                                  cpu_s=time.thread_time() - self.cpu_started, idle=(self.idle[0], self.idle[1]))
                send_object(self.ctx.ctrl, done, 0, Tag.REPORT, "the coordinator to take a stream report", self.ctx.timeout_s)
                moved = True
        return moved

    def _produce_one(self) -> bool:
        ready = [p for p in self.streams.values() if p.can_produce()]
        if not ready:
            return False
        self.turn += 1
        ready[self.turn % len(ready)].produce()
        return True



class OwnDecoder(threading.Thread):
    """A trainer's decoder of the streams its own members decode (`StreamPlan.own_decoding`,
    Baseline's), in a thread beside training: the coordinator names the trainer the stream's
    only preprocessor, and this thread takes its commands and sends the chunks to the
    trainer's own stream thread, as a script's DataLoader decodes between steps. A failure
    ends the job, as the coordinator's thread does."""

    def __init__(self, ctx: RunContext):
        super().__init__(name="own-decoder", daemon=True)
        self.ctx = ctx
        self.loop = PreprocessorLoop(ctx, own=True)

    def run(self) -> None:
        try:
            self.loop.run()
        except BaseException as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip().replace("\n", " ")
            abort_job(self.ctx.world, self.ctx.who, f"own decoder: {detail}", code=3)

    def stop(self) -> None:
        self.loop.stopping.set()
        wait_thread(self, "the trainer's own decoder to stop", self.ctx.timeout_s)
