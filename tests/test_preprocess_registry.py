"""The reader registry: one entry per `data.source` name, found by name, unknown names listed."""

import subprocess
import sys

import numpy as np
import pytest

from fleet.errors import UserError
from fleet.spec import SpecError, parse_spec
from fleet.spec.sections import DataSpec, Source
from preprocess.readers import READERS, RawBatch, Reader, ReaderEntry, open_reader, partition_count, reader_entry
from preprocess.readers.digits import DigitsReader
from preprocess.readers.synthetic import SyntheticReader


class FakeReader(Reader):
    """Three samples of class 0 or 1, made from the spec and seed the registry hands over."""

    def __init__(self, data: DataSpec, seed: int):
        self.data, self.seed = data, seed

    @property
    def num_classes(self) -> int:
        return 2

    @property
    def labels(self) -> np.ndarray:
        return np.array([0, 1, 0], np.int64)

    def read(self, indices: np.ndarray) -> RawBatch:
        return RawBatch(np.zeros((len(indices), 2, 2, 1), np.uint8), self.labels[indices], [str(i) for i in indices])


FAKE_ENTRY = ReaderEntry(FakeReader)
"""A registry entry, as a reader module's ``ENTRY`` is."""


def test_every_source_name_the_spec_takes_has_a_reader_and_no_other():
    assert set(READERS.names) == {source.value for source in Source}


def test_entries_are_found_by_name_or_by_source():
    assert reader_entry("hdf5") is READERS.load(Source.HDF5.value)
    assert reader_entry(Source.DIGITS) is READERS.load(Source.DIGITS.value)
    assert isinstance(reader_entry("digits").whole(DataSpec(source="digits"), 0), DigitsReader)
    synthetic = DataSpec(source="synthetic").defaults_filled()
    assert isinstance(reader_entry("synthetic").whole(synthetic, 3), SyntheticReader)


def test_an_unknown_name_is_one_line_listing_the_readers():
    with pytest.raises(UserError) as err:
        reader_entry("csv")
    assert str(err.value) == "data.source: no reader for 'csv'; valid: synthetic, imagefolder, hdf5, digits"


def test_open_reader_opens_what_the_registry_names():
    READERS.remove("digits")
    READERS.add("digits", f"{__name__}:FAKE_ENTRY")
    try:
        reader = open_reader(DataSpec(source="digits"), seed=7)
    finally:
        READERS.remove("digits")
        READERS.add("digits", "preprocess.readers.digits:ENTRY")
    assert isinstance(reader, FakeReader) and reader.seed == 7
    assert reader.data.image_size == (8, 8)  # the source's defaults are filled before the factory runs


def test_importing_the_readers_imports_no_reader_module():
    """Readers are imported when their source is opened (h5py with the hdf5 reader), as
    frameworks are; the `preprocess` package itself imports nothing."""
    code = ("import sys, preprocess, preprocess.readers\n"
            "print(sorted(m for m in sys.modules if m.startswith(('preprocess.readers.', 'h5py', 'PIL'))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['preprocess.readers._base']", done.stdout


def test_a_source_without_a_parts_reader_cannot_be_partitioned():
    with pytest.raises(UserError) as err:
        partition_count(DataSpec(source="digits", partitioned=True))
    assert str(err.value) == ("data.partitioned: source 'digits' cannot be partitioned; use source 'hdf5' "
                              "with a directory written by: fleet data partition")


def test_the_spec_lists_the_reader_names_for_an_unknown_source():
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "t", "data": {"source": "csv"}, "models": [{"family": "mlp"}]})
    assert str(err.value).startswith("data.source: ")
    assert all(f"'{name}'" in str(err.value) for name in READERS.names)
