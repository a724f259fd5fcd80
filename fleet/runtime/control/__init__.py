"""The control room: the coordinator (rank 0) that drives the policy, the run set-up, the rate source and the console."""
