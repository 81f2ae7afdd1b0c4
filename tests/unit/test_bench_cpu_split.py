"""The CPU-split probe's reading of ``perf report --sort dso``: shares summed per group, the rest as "other"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.mesh.cpu_split import shares_of  # noqa: E402

REPORT = """\
# To display the perf.data header info, please use --header/--header-only options.
#
# Overhead  Shared Object
# ........  .......................................
#
    54.12%  [kernel.kallsyms]
    23.44%  libpython3.11.so.1.0
     6.85%  loop.cpython-311-x86_64-linux-gnu.so
     6.46%  libcrypto.so.3
     4.12%  libc.so.6
     2.73%  libssl.so.3
     0.85%  _struct.cpython-311-x86_64-linux-gnu.so
     0.78%  _ssl.cpython-311-x86_64-linux-gnu.so
     0.25%  [vdso]
"""


def test_every_line_lands_in_one_group_and_the_groups_sum_to_the_report() -> None:
    shares = shares_of(REPORT)
    assert shares["kernel"] == pytest.approx(54.12)
    assert shares["python"] == pytest.approx(23.44)
    assert shares["event loop"] == pytest.approx(6.85)
    assert shares["TLS (libssl, libcrypto, _ssl)"] == pytest.approx(6.46 + 2.73 + 0.78)
    assert shares["libc"] == pytest.approx(4.12)
    assert shares["other"] == pytest.approx(0.85 + 0.25)
    assert sum(shares.values()) == pytest.approx(99.6)


def test_a_report_with_no_samples_gives_zero_shares() -> None:
    assert set(shares_of("# nothing recorded\n").values()) == {0.0}
