"""The part of its host's cores a CPU job's work gets (`fleet.runtime.control.host_use`)."""

import os

import pytest

from fleet.runtime.control.host_use import HostUse, core_share, process_cpu_s


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def sampled(steps, cores=2.0):
    """A HostUse over `steps` of (seconds later, CPU seconds of each of two ranks so far, demand)."""
    clock, state = Clock(), {"cpu": (0.0, 0.0), "demand": 0.0}
    use = HostUse((1, 2), cores, lambda: state["demand"], period_s=0.5, clock=clock,
                  read=lambda pid: state["cpu"][pid - 1])
    for later, cpu, demand in steps:
        clock.now += later
        state["cpu"], state["demand"] = cpu, demand
        use.tick()
    return use


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
    gone = HostUse((1,), 2.0, lambda: 3.0, read=lambda pid: None)
    gone.tick()
    assert gone.failed and gone.cpu_s() is None


def test_a_process_cpu_is_read_from_proc():
    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        pytest.skip("no /proc here")
    sum(i * i for i in range(200_000))
    assert process_cpu_s(os.getpid()) > 0
    assert process_cpu_s(2**22 + 12345) is None
