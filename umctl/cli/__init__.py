"""The ``umctl`` command line."""
