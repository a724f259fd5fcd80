"""One module per `fleet` sub-command; see `fleet/cli.py`."""
