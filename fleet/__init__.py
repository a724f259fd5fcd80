"""fleet: train an ensemble of heterogeneous deep nets on an MPI job, decoding the data once."""

__version__ = "0.1.0"
