"""The training runtime: stop rule, events, the local trainer and the MPI runtime."""
