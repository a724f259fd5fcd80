"""Launching a job: the job environment, topology and roles, the mpiexec launcher, processes and signals."""
