"""The security suite: every attack the adversarial review of issue 14 found, replayed against the real components,
and each expected to be refused with the right answer (403, 401, 400, GOAWAY, a closed watch) and within a stated
memory bound; plus the defences that held up then, so that they keep holding.

One module per surface (``test_rbac.py``, ``test_hbone_dos.py``, ...). Attacks are bounded in count and time like
every load loop of the suite.
"""

from tests.security.tls_peers import certs, no_peer_traceback, tls_records  # noqa: F401  # the TLS peer tests' fixtures
