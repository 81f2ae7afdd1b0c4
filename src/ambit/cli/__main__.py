"""``python -m ambit.cli``: the same as the ``ambit`` command."""

from ambit.cli.main import main

main()
