"""A case where measured rates make ``policy: auto`` hand the run over, shared by the
simulator's test (`test_schedule_adapting.py`) and the runtime's (`test_profiler_mpi.py`).

The planning profile has most rates wrong (e.g. d: 800 samples/s for 3,200 really): on it
auto takes fleet-l; at the first convergence the measured rates make fleet-g far faster.
"""

EPOCHS = dict(zip("abcdef", (3, 3, 2, 2, 1, 3)))
PLANNED = (1600, 800, 400, 800, 1600, 400)
TRUE = (1600, 1600, 800, 3200, 1600, 400)


def profile(rates, samples_per_epoch: int) -> dict:
    """A profile.json document of the six models on one node of 4 GPUs."""
    return {"schema": 1, "gpus_per_node": 4, "samples_per_epoch": samples_per_epoch, "models": [
        {"id": m, "rates": {"1": r, "2": 1.8 * r, "3": 2.5 * r, "4": 3.1 * r}, "epochs": EPOCHS[m]}
        for m, r in zip(EPOCHS, rates)]}
