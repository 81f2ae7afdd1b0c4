"""Control-plane scale harness (issue 22): see :mod:`bench.scale.run`."""
