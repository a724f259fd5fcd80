"""The part of its host's cores a CPU job's work gets (`fleet.runtime.control.host_use`)."""

import os
import subprocess
import sys

import pytest

from fleet.runtime.control.host_use import RANK0_ROLE, HostUse, core_share, process_cpu_s, run_queue_wait_s
from fleet.runtime.control.measured_costs import MeasuredCosts
from fleet.runtime.protocol import StreamDone


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def sampled(steps, cores=2.0):
    """A HostUse over `steps` of (seconds later, CPU seconds of each of two ranks so far, demand
    [, run-queue waits of each rank so far]; without them none can be read)."""
    clock, state = Clock(), {"cpu": (0.0, 0.0), "demand": 0.0, "waits": None}
    use = HostUse((1, 2), cores, lambda: state["demand"], period_s=0.5, clock=clock,
                  read=lambda pid: state["cpu"][pid - 1],
                  waits=lambda pid: None if state["waits"] is None else state["waits"][pid - 1])
    for later, cpu, demand, *waits in steps:
        clock.now += later
        state["cpu"], state["demand"], state["waits"] = cpu, demand, (waits[0] if waits else None)
        use.tick()
    return use


def test_the_cores_count_as_wanted_where_the_ranks_threads_waited_for_them():
    use = sampled([
        (0.0, (0.0, 0.0), 9.0, (0.0, 0.0)),
        (1.0, (0.9, 0.9), 9.0, (0.5, 0.4)),  # 0.9 threads waited on average: saturated
        (1.0, (1.5, 1.3), 9.0, (0.6, 0.5)),  # 0.2: the work fitted, whatever the estimate said
        (1.0, (2.4, 2.2), 0.0, (1.0, 0.7)),  # 0.6: saturated, whatever the estimate said
    ])
    assert use.busy_share() == pytest.approx((1.8 + 1.8) / 4.0)


def test_only_the_time_the_work_wanted_more_than_the_cores_counts_for_how_busy_they_were():
    use = sampled([
        (0.0, (0.0, 0.0), 3.0),  # first sample: 3 cores wanted of 2
        (1.0, (0.9, 0.9), 3.0),  # 1.8 of 2 cores busy: saturated
        (1.0, (1.8, 1.8), 3.0),  # again
        (0.2, (1.8, 1.8), 3.0),  # too soon after the last sample: not taken
        (1.0, (2.3, 1.8), 1.0),  # the tail: one rank, 1 core wanted: not counted
        (1.0, (2.8, 1.8), 1.0),
    ])
    assert use.busy_share() == pytest.approx(3.6 / 4.0)
    assert use.cpu_s() == pytest.approx(4.6)


def test_the_share_counts_what_the_costs_account_for_and_virtual_nodes_on_one_host():
    use = sampled([(0.0, (0.0, 0.0), 3.0), (1.0, (0.9, 0.9), 3.0), (1.0, (1.8, 1.8), 3.0)])
    # 0.9 busy, 3.24 of the 3.6 CPU seconds accounted for: 0.81 of the host's 2 cores
    assert core_share(use, 3.24, simulated_cores=2.0) == pytest.approx(0.81)
    # the same host as 2 virtual nodes of 2 cores each: 0.405 of the 4 the simulator counts
    assert core_share(use, 3.24, simulated_cores=4.0) == pytest.approx(0.405)


def test_no_figure_without_a_second_of_saturated_samples_or_with_a_rank_unread():
    short = sampled([(0.0, (0.0, 0.0), 3.0), (0.6, (0.5, 0.5), 3.0)])
    assert short.busy_share() is None and core_share(short, 1.0, 2.0) is None
    gone = HostUse((1,), 2.0, lambda: 3.0, read=lambda pid: None, waits=lambda pid: None)
    gone.tick()
    assert gone.failed and gone.cpu_s() is None


def test_a_process_cpu_is_read_from_proc():
    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        pytest.skip("no /proc here")
    sum(i * i for i in range(200_000))
    assert process_cpu_s(os.getpid()) > 0
    assert process_cpu_s(2**22 + 12345) is None
    assert run_queue_wait_s(2**22 + 12345) is None
    if os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"):
        assert run_queue_wait_s(os.getpid()) >= 0.0


def test_each_role_has_its_ranks_cpu_from_the_first_sample_to_the_last():
    clock, cpu = Clock(), {1: 1.0, 2: 5.0, 3: 7.0}
    use = HostUse((1, 2, 3), 2.0, lambda: 3.0, period_s=0.5, clock=clock, read=cpu.get, waits=lambda pid: None,
                  roles=(RANK0_ROLE, "trainer", "trainer"))
    use.tick()
    clock.now, cpu[1], cpu[2], cpu[3] = 1.0, 3.5, 6.0, 9.0
    use.tick()
    assert use.cpu_by_role() == pytest.approx({RANK0_ROLE: 2.5, "trainer": 3.0})
    with pytest.raises(ValueError, match="one role per pid"):
        HostUse((1, 2), 2.0, lambda: 3.0, roles=("trainer",))


def test_the_run_sets_each_roles_cpu_beside_what_its_costs_account_for():
    costs = MeasuredCosts()
    costs.stream_done(StreamDone(stream=1, rank=0, decoded=1000, cpu_s=2.0))
    costs.stream_done(StreamDone(stream=2, rank=1, decoded=500, cpu_s=1.5))
    costs.coordinator_cpu_s = 0.5
    record = costs.host_cpu({RANK0_ROLE: 4.0, "preprocessor": 1.5})
    assert record["roles"] == {"preprocessor": {"cpu_s": 1.5, "accounted_s": 1.5},
                               RANK0_ROLE: {"cpu_s": 4.0, "accounted_s": 2.5}}  # its loop and the coordinator
    assert record["decoded"] == 1500 and record["trained"] == 0


def test_a_rank_limits_numpys_blas_to_one_thread():
    """A preprocessor decodes on one core: numpy's BLAS threads (spinning while they wait) would
    take the cores of the trainers beside it."""
    probe = ("import numpy, threadpoolctl\n"
             "from fleet.runtime.launch.process import one_blas_thread\n"
             "threadpoolctl.threadpool_limits(4, user_api='blas')\n"
             "before = [i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']\n"
             "one_blas_thread()\n"
             "after = [i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']\n"
             "print(before, after)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    before, after = done.stdout.strip().split("] [")
    assert before and "4" in before and set(after.strip("[]").split(", ")) == {"1"}
