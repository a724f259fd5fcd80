"""A user-model module that fails while it is imported."""

raise RuntimeError("set MYNETS_HOME first")
