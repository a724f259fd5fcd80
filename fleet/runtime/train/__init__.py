"""The training side: trainers, checkpoints, the stop rule, the local runner and the collectives."""
