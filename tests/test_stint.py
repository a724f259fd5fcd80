"""A trainer's CPU seconds leave out the threads in its process that do other work."""

import threading
import time

from fleet.runtime.train import stint


def _burn(seconds: float, started: threading.Event | None = None) -> None:
    if started is not None:
        started.set()
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_trainers_cpu_leaves_out_its_own_decoders_thread(monkeypatch):
    monkeypatch.setattr(stint, "_APART", {})
    go, burnt, end = threading.Event(), threading.Event(), threading.Event()
    decoder = threading.Thread(target=lambda: (go.wait(), _burn(0.3), burnt.set(), end.wait()), daemon=True)
    decoder.start()  # it lives as long as its trainer, as an own decoder does
    stint.set_apart(decoder)
    before_total, before = time.process_time(), stint.trainer_cpu_s()
    go.set()
    _burn(0.1)  # the trainer's own work
    burnt.wait()
    total, own = time.process_time() - before_total, stint.trainer_cpu_s() - before
    end.set()
    decoder.join()
    assert total >= 0.39
    assert 0.09 <= own <= 0.2  # the decoder's 0.3 s are not in it
