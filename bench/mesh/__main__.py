"""``python -m bench.mesh``: see :mod:`bench.mesh.run`."""

import sys

from bench.mesh.run import main

sys.exit(main())
