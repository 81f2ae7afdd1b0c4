"""The native accelerator under AddressSanitizer and UndefinedBehaviorSanitizer.

The extensions are built again with ``-fsanitize=address,undefined`` into a temporary directory
(``scripts/build_native.py --extra-cflags ... --output ...``), and a child Python with the sanitizers' runtime
preloaded imports that build (it checks which modules it imported) and runs the native-records security tests
(hostile peers, the C object's refusals, the hypothesis write/read exchange with a few examples), the native DATA
path's differential and fast-path tests, the relay's socket side in C (``relay_socket.c``: its fallbacks, a reused
descriptor, random chunks and buffers), and the attribute cache's differential tests (``attr_cache.h``). Any heap,
stack or global overflow, use after free, or undefined behaviour in the C code aborts the child, and this test fails
with the sanitizer's report. Without a compiler or libasan it skips, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SANITIZE = "-fsanitize=address,undefined -fno-omit-frame-pointer"
TESTS = [
    "tests/security/test_tls_native_records.py",
    "tests/security/test_tls_read_pump.py",
    "tests/security/test_tls_key_update.py",
    "tests/unit/test_hbone_native_data.py",
    "tests/unit/test_hbone_fast_paths.py",
    "tests/integration/test_relay_sockets_native.py",
    "tests/security/test_native_attr_cache.py",
    "-k",
    "not python",
]
"""What the child runs: the security tests of the native record path, the differential and fast-path tests of the
native DATA path, the relay socket side's tests (step 3; the pure-Python cases have no C to check) and the attribute
cache's differential tests against getattr and setattr."""

CHILD = """
import sys
import ambit.native
ambit.native.__path__.insert(0, sys.argv[1])
from ambit.native import _hbone_data, _tls_records
for module in (_tls_records, _hbone_data):
    assert module.__file__.startswith(sys.argv[1]), f"the installed build was imported: {module.__file__}"
import pytest
sys.exit(pytest.main(["-q", "--capture=sys", "-p", "no:cacheprovider", "-p", "no:xdist", *sys.argv[2:]]))
"""


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and the sanitizer build cannot run: {reason}")
    pytest.skip(reason)


def _libasan() -> str:
    cc = shutil.which(os.environ.get("CC") or "cc")
    if cc is None:
        _unavailable("no C compiler")
    assert cc is not None
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False).stdout
    if not os.path.isabs(path.strip()) or not os.path.exists(path.strip()):
        _unavailable("no libasan for this compiler (apt-get install libasan8)")
    return path.strip()


@pytest.mark.timeout(200)  # its two steps bound themselves (60 s + 100 s); the suite's 120 s would cut a loaded run
def test_the_native_records_pass_their_security_tests_under_address_and_undefined_sanitizers(
    tmp_path: Path,
) -> None:
    libasan = _libasan()
    built = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_native.py"), "--extra-cflags", SANITIZE, "--output", tmp_path],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert built.returncode == 0, built.stderr
    if not list(tmp_path.glob("_tls_records*")) or not list(tmp_path.glob("_hbone_data*")):
        _unavailable(built.stdout.strip())
    env = {
        **os.environ,
        "LD_PRELOAD": libasan,
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "AMBIT_EXCHANGE_EXAMPLES": "6",
        "AMBIT_DATA_PATH_EXAMPLES": "100",
        "AMBIT_RELAY_EXAMPLES": "8",
        "AMBIT_ATTR_CACHE_EXAMPLES": "40",
        "CI": "true",  # in the child a native test that cannot run fails rather than skips
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), *TESTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=100,
    )
    output = child.stdout + child.stderr
    findings = [at for at in (output.find("ERROR: AddressSanitizer"), output.find("runtime error:")) if at >= 0]
    report = output[max(min(findings) - 200, 0) :][:3000] if findings else output[-6000:]  # the sanitizer's first
    assert child.returncode == 0, f"the sanitized build failed (exit {child.returncode}):\n{report}"
    assert " passed" in child.stdout and "skipped" not in child.stdout, report
