"""Profiling: measured training rates r_i(m) and preprocessor throughput (see fleet profile)."""
