"""The ``ambit`` command."""
