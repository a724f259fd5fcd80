"""Model-task parallelism (MTP, a baseline of issue 47): every (group, configuration) an
independent model on one GPU decoding its own group's data, as a job array does: `baseline`
under the name the issue gives it."""

from __future__ import annotations

from fleet.schedule.planners.baseline import Baseline


class ModelTask(Baseline):
    """`Baseline` by its grouped-data name: a free GPU takes a random remaining model, which
    decodes its own data."""

    name = "model-task"
