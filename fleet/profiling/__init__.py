"""Pure profiling logic, below the runtime: what to measure and where (`plan`), and the profile
document (`document`: its fingerprint, when it may be reused, decode throughput). The MPI side
that measures lives in the top-level `profiler/` package."""
