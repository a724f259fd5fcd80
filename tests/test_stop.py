import math

from fleet.runtime.train.stop import StopReason, StopTracker
from fleet.spec import StopRule


def feed(tracker, values, metric="val_accuracy", loss=1.0):
    reasons = [tracker.update({metric: v, "train_loss": loss}) for v in values]
    return reasons


def test_patience_counts_epochs_without_min_delta_gain():
    tracker = StopTracker(StopRule(patience=2, min_delta=0.01), max_epochs=100)
    reasons = feed(tracker, [0.5, 0.6, 0.605, 0.609])
    assert reasons == [None, None, None, StopReason.PATIENCE]
    assert tracker.best == 0.6 and tracker.best_epoch == 2 and tracker.epochs == 4


def test_target_stops_at_once():
    tracker = StopTracker(StopRule(patience=5, target=0.9), max_epochs=100)
    assert feed(tracker, [0.5, 0.91]) == [None, StopReason.TARGET]


def test_val_loss_lower_is_better():
    tracker = StopTracker(StopRule(patience=1, metric="val_loss", target=0.1), max_epochs=100)
    assert feed(tracker, [1.0, 0.5], metric="val_loss") == [None, None]
    assert tracker.best == 0.5
    assert feed(tracker, [0.6], metric="val_loss") == [StopReason.PATIENCE]


def test_max_epochs_and_divergence():
    tracker = StopTracker(StopRule(patience=10), max_epochs=2)
    assert feed(tracker, [0.1, 0.2]) == [None, StopReason.MAX_EPOCHS]
    diverged = StopTracker(StopRule(patience=10), max_epochs=9)
    assert feed(diverged, [0.1], loss=math.nan) == [StopReason.DIVERGED]


def test_state_round_trips():
    rule = StopRule(patience=3, min_delta=0.001)
    tracker = StopTracker(rule, max_epochs=10)
    feed(tracker, [0.3, 0.4, 0.39])
    again = StopTracker.from_dict(rule, tracker.to_dict())
    assert again == tracker
    assert feed(again, [0.38, 0.37]) == feed(tracker, [0.38, 0.37])
