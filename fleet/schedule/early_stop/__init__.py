"""Early stopping across the models of an ensemble: rungs, and who goes on past them.

Methods (`METHODS`), as the literature defines them; metrics are lower-is-better:

- ``asha``: asynchronous successive halving (Li et al., "A System for Massively Parallel
  Hyperparameter Tuning", MLSys 2020): at each rung a model continues only if it is in the
  top 1/η of the models recorded there so far.
- ``sha``: synchronous successive halving with promotion (Jamieson & Talwalkar 2016; Li et
  al. 2018): every model pauses at a rung; the top 1/η are promoted once the rung is full.
- ``hyperband``: brackets of ``sha`` with the bracket sizes and first rungs of Li et al.,
  "Hyperband: A Novel Bandit-Based Approach to Hyperparameter Optimization", JMLR 2018.
- ``median``: median stopping, as Optuna's ``MedianPruner`` (Golovin et al., Google Vizier,
  KDD 2017).
- ``none``: no early stopping.

Rungs lie at ``min_epochs × η^k`` epochs (rounded, distinct, below ``max_epochs``): rungs
are whole epochs. The protocol (`EarlyStopping`) is in ``_base``; each method has its module;
`surviving_share` predicts from the rung arithmetic alone.
"""

from fleet.schedule.early_stop._base import EarlyStopping, NoEarlyStopping
from fleet.schedule.early_stop.asha import Asha
from fleet.schedule.early_stop.decisions import RecordError, RungDecision, Verdict
from fleet.schedule.early_stop.halving import Hyperband, SuccessiveHalving
from fleet.schedule.early_stop.median import MedianStopping
from fleet.schedule.early_stop.registry import METHODS, create_early_stopping
from fleet.schedule.early_stop.rungs import BracketPlan, hyperband_brackets, rung_epochs
from fleet.schedule.early_stop.settings import EarlyStopError, EarlyStopSettings
from fleet.schedule.early_stop.shares import RungShare, surviving_share

__all__ = [
    "METHODS", "Asha", "BracketPlan", "EarlyStopError", "EarlyStopSettings", "EarlyStopping", "Hyperband",
    "MedianStopping", "NoEarlyStopping", "RecordError", "RungDecision", "RungShare", "SuccessiveHalving",
    "Verdict", "create_early_stopping", "hyperband_brackets", "rung_epochs", "surviving_share",
]
