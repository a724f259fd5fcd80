// fleet's patch to Horovod's background loop (tools/build-horovod.sh includes this file in
// horovod/common/operations.cc and horovod/common/tensor_queue.cc).
//
// Horovod's background thread runs a cycle every HOROVOD_CYCLE_TIME (1 ms by default): it
// sleeps out the rest of the cycle, then negotiates with the other ranks which of the queued
// operations every rank has asked for, and runs those. An operation therefore waits for the
// next cycle of every member: on 2 ranks (2-core VM) a 1 MB allreduce took 6-11x its raw
// MPI_Allreduce time, a 16 MB one about 2x; with HOROVOD_CYCLE_TIME=5, 1 MB took 5.0 ms.
// fleet's trainers ask for one operation per step (the flat gradient buffer, or a weights
// broadcast), so there is nothing to fuse by waiting:
//
// - an enqueued operation wakes the thread from its sleep at once;
// - while an operation of this rank waits for the other ranks, the cycle is PENDING_CYCLE
//   (the negotiation itself is collective, so a rank that loops waits for the slowest
//   member's cycle there, in fleet's sleeping waits: tools/horovod-nospin.h).
//
// An idle rank still sleeps a whole cycle between negotiations, as Horovod does.
//
// The thread's sleeps are short (20-250 us in tools/horovod-nospin.h, PENDING_CYCLE here),
// and Linux lets a sleep overrun by the thread's timer slack, 50 us by default: a 20 us sleep
// took about 70. The background thread asks for a slack of 1 us (`fine_sleeps`, from
// BackgroundThreadLoop). Both together: a 1 MB allreduce on 2 ranks 1.8-2x faster (0.61 ms
// with a 5 ms cycle), the other sizes within the VM's noise (bench/RESULTS.md, Collectives).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace fleet_wake {

constexpr std::chrono::microseconds PENDING_CYCLE(50);

// The calling thread's sleeps end within about a microsecond of their time (Linux).
inline void fine_sleeps() {
#if defined(__linux__)
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // nanoseconds
#endif
}

struct Bell {
  std::mutex mutex;
  std::condition_variable rung;
  std::uint64_t enqueued = 0;
  std::uint64_t seen = 0;
};

inline Bell& bell() {
  static Bell instance;
  return instance;
}

// TensorQueue::AddToTensorQueue[Multi], after an operation joined the queue.
inline void enqueued() {
  auto& b = bell();
  {
    std::lock_guard<std::mutex> guard(b.mutex);
    ++b.enqueued;
  }
  b.rung.notify_all();
}

// Whether any process set of this rank has an operation that has not run yet.
template <typename GlobalState>
inline bool pending(GlobalState& state) {
  for (auto id : state.process_set_table.Ids()) {
    if (state.process_set_table.Get(id).tensor_queue.FleetPending()) {
      return true;
    }
  }
  return false;
}

// RunLoopOnce's sleep until the next cycle (`rest` > 0 of it left).
template <typename GlobalState>
inline void sleep_cycle(GlobalState& state, std::chrono::steady_clock::duration rest) {
  auto& b = bell();
  if (pending(state)) {
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(rest, PENDING_CYCLE));
    std::lock_guard<std::mutex> guard(b.mutex);
    b.seen = b.enqueued;
    return;
  }
  std::unique_lock<std::mutex> lock(b.mutex);
  b.rung.wait_for(lock, rest, [&b] { return b.enqueued != b.seen; });
  b.seen = b.enqueued;
}

}  // namespace fleet_wake
