"""Data for fleet's preprocessor ranks: readers, the transform pipeline, splits and data-set tools.

A preprocessor process opens its own reader (`preprocess.readers.open_reader`), reads lists of
indices and runs the `preprocess.transforms.Pipeline` into contiguous float32 NCHW arrays that
the runtime broadcasts to trainers. The tools (`make.make_synthetic`, `convert.convert_folder`,
`partition.partition_dataset`) back `fleet data`.

Importing this package imports nothing: each module is imported where it is used, and a
reader's module (h5py for ``hdf5``) only when its source is opened (`preprocess.readers.READERS`).
"""
