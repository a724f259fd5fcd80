// fleet's patch to Horovod's MPI controller and MPI tensor operations (tools/build-horovod.sh
// includes this file after the includes of horovod/common/mpi/mpi_controller.cc and
// horovod/common/ops/mpi_operations.cc).
//
// Horovod's background thread negotiates with the other ranks every cycle (1-5 ms) in blocking
// MPI collectives. MPICH's blocking calls poll without sleeping, so a rank whose cycle starts
// before its peers' spins a core until they arrive: measured on 2 ranks, 56-73% of a core per
// idle rank. Where ranks share cores (a CPU job, or a GPU node's spare cores taken by the
// preprocessors) that is the trainers' CPU. Here the controller's collectives become their
// non-blocking forms, tested with sleeps that grow from 20 us to 250 us; so do the allreduce,
// broadcast and barrier of the tensor operations on the CPU (a member that waits for a slower
// one inside a 64 MB allreduce would spin too).
//
// A sleeping wait costs bandwidth: MPI moves a large message in shared-memory pieces and Open
// MPI advances a non-blocking collective only inside MPI_Test, so each sleep passes one piece
// (Open MPI 4.1 on 16 cores: 0.06-0.12 GB/s against 0.9-3.8 GB/s blocking). So an allreduce or
// broadcast of more than LARGE_BYTES waits for every member in a sleeping Ibarrier and then
// moves in the blocking call: it spins only while the data moves (and for one sleep of the
// last member to see the barrier done). Where every rank has cores to itself, fleet's runtime
// sets FLEET_MPI_WAIT=busy in the process before Horovod starts (fleet.runtime.waiting: the
// data plane's choice), and all these calls stay the blocking ones Horovod was written with.
#pragma once

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace fleet_nospin {

// Read at every call: the variable is set before Horovod's background thread starts.
inline bool busy() {
  const char* mode = std::getenv("FLEET_MPI_WAIT");
  return mode != nullptr && std::strcmp(mode, "busy") == 0;
}

inline int wait(MPI_Request* request) {
  auto delay = std::chrono::microseconds(20);
  while (true) {
    int done = 0;
    int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) {
      return rc;
    }
    std::this_thread::sleep_for(delay);
    if (delay < std::chrono::microseconds(250)) {
      delay *= 2;
    }
  }
}

// Larger transfers wait for every member, then move in a blocking call (see the top).
constexpr long long LARGE_BYTES = 64 << 10;

inline bool large(int count, MPI_Datatype type) {
  int size = 0;
  MPI_Type_size(type, &size);
  return static_cast<long long>(count) * size > LARGE_BYTES;
}

// Starts a non-blocking operation (`start(&request)`) and waits for it.
template <typename Start>
inline int nonblocking(Start start) {
  MPI_Request request;
  int rc = start(&request);
  return rc != MPI_SUCCESS ? rc : wait(&request);
}

// Every member of `comm` has called: a sleeping Ibarrier.
inline int all_arrived(MPI_Comm comm) {
  return nonblocking([&](MPI_Request* r) { return MPI_Ibarrier(comm, r); });
}

inline int Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  if (busy()) return MPI_Allreduce(send, recv, count, type, op, comm);
  if (large(count, type)) {
    int rc = all_arrived(comm);
    return rc != MPI_SUCCESS ? rc : MPI_Allreduce(send, recv, count, type, op, comm);
  }
  return nonblocking([&](MPI_Request* r) { return MPI_Iallreduce(send, recv, count, type, op, comm, r); });
}

inline int Allgather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                     MPI_Datatype recv_type, MPI_Comm comm) {
  if (busy()) return MPI_Allgather(send, send_count, send_type, recv, recv_count, recv_type, comm);
  return nonblocking([&](MPI_Request* r) {
    return MPI_Iallgather(send, send_count, send_type, recv, recv_count, recv_type, comm, r);
  });
}

inline int Gather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                  MPI_Datatype recv_type, int root, MPI_Comm comm) {
  if (busy()) return MPI_Gather(send, send_count, send_type, recv, recv_count, recv_type, root, comm);
  return nonblocking([&](MPI_Request* r) {
    return MPI_Igather(send, send_count, send_type, recv, recv_count, recv_type, root, comm, r);
  });
}

inline int Gatherv(const void* send, int send_count, MPI_Datatype send_type, void* recv, const int* recv_counts,
                   const int* displacements, MPI_Datatype recv_type, int root, MPI_Comm comm) {
  if (busy()) return MPI_Gatherv(send, send_count, send_type, recv, recv_counts, displacements, recv_type, root, comm);
  return nonblocking([&](MPI_Request* r) {
    return MPI_Igatherv(send, send_count, send_type, recv, recv_counts, displacements, recv_type, root, comm, r);
  });
}

inline int Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  if (busy()) return MPI_Bcast(buffer, count, type, root, comm);
  if (large(count, type)) {
    int rc = all_arrived(comm);
    return rc != MPI_SUCCESS ? rc : MPI_Bcast(buffer, count, type, root, comm);
  }
  return nonblocking([&](MPI_Request* r) { return MPI_Ibcast(buffer, count, type, root, comm, r); });
}

inline int Barrier(MPI_Comm comm) {
  if (busy()) return MPI_Barrier(comm);
  return nonblocking([&](MPI_Request* r) { return MPI_Ibarrier(comm, r); });
}

inline int Alltoall(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                    MPI_Datatype recv_type, MPI_Comm comm) {
  if (busy()) return MPI_Alltoall(send, send_count, send_type, recv, recv_count, recv_type, comm);
  return nonblocking([&](MPI_Request* r) {
    return MPI_Ialltoall(send, send_count, send_type, recv, recv_count, recv_type, comm, r);
  });
}

}  // namespace fleet_nospin

#define MPI_Allreduce fleet_nospin::Allreduce
#define MPI_Allgather fleet_nospin::Allgather
#define MPI_Gather fleet_nospin::Gather
#define MPI_Gatherv fleet_nospin::Gatherv
#define MPI_Bcast fleet_nospin::Bcast
#define MPI_Barrier fleet_nospin::Barrier
#define MPI_Alltoall fleet_nospin::Alltoall
