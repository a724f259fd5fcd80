"""Profiling: measured training rates r_i(m) and preprocessor throughput (see fleet profile).

It measures with the runtime's parts (trainers, collectives, waits), so it sits above the
runtime, which never imports it: `fleet.rank_entry` runs it between a rank's start-up and the
run's set-up. What to measure is planned in `fleet.profiling`; what a profile predicts, in
`fleet.prediction`."""
