"""Data for fleet's preprocessor ranks: readers, the transform pipeline, splits and data-set tools.

A preprocessor process opens its own reader (`open_reader`), reads lists of indices and runs
the `Pipeline` into contiguous float32 NCHW arrays that the runtime broadcasts to trainers.
The tools (`make_synthetic`, `convert_folder`, `partition_dataset`) back `fleet data`.
"""

from preprocess.readers import RawBatch, Reader, open_reader, partition_count
from preprocess.split import epoch_order, split_indices
from preprocess.transforms import Pipeline

__all__ = [
    "Pipeline",
    "RawBatch",
    "Reader",
    "epoch_order",
    "open_reader",
    "partition_count",
    "split_indices",
]
