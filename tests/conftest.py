"""Shared fixtures: an embedded API server (in-process or as a real subprocess) and a kubectl runner.

``make test`` runs the suite in shares (``scripts/run_suite.sh``). The tests that use the machine itself (a lab
network, network namespaces, root: ``SERIAL_DIRECTORIES``, ``SERIAL_MODULES``, the ``root`` marker) run one after
the other in one process, as they would run alone; every other test (``rest``) runs on pytest-xdist workers. The
machine's tests split in two that run at once: ``lab``, those that bring up a lab or take the machine-wide lab lock
(``LAB_DIRECTORIES``, ``LAB_MODULES``, the ``root_lab_lock`` and ``new_lab`` fixtures: a lab's names), and
``host``, those whose namespaces, links and tables carry names of their own and never a lab's addresses in the
root namespace. The environment variable ``AMBIT_TEST_SHARE`` (``machine``, ``lab``, ``host`` or ``rest``;
``machine`` is ``lab`` and ``host``) picks a share; without it every test runs. ``make test`` runs the lab share in
two streams that take its modules from one queue (``tests/lab_streams.py``, :func:`pytest_runtestloop`).

Garbage is pinned to the test that made it: in the suites that run real servers and sockets (``GC_PINNED``), a
full collection runs at each test's teardown, after its event loop is closed, so an unclosed transport or socket
fails that test (filterwarnings=error turns the ResourceWarning into an error there) instead of whichever test
runs when the collector happens to find it. The objects alive once collection is done (modules, classes, the
test items) are frozen out of the collector's view (``gc.freeze``), so a collection costs milliseconds.
"""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings
from tests import harness, lab_streams
from tests.harness import ServerProcess, free_port

from ambit import native
from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.hbone.connection import HboneConnection
from ambit.hbone.events import Event
from ambit.tls.socket_transport import TlsTransportKind

REPO = Path(__file__).resolve().parents[1]

# Property tests judge correctness, never speed: no per-example deadline and no "too slow" health check, which a
# loaded machine trips at random. In CI the examples are derived from each test's name, so a run is repeatable.
settings.register_profile(
    "ambit",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=os.environ.get("CI") == "true",
)
settings.load_profile("ambit")


GC_PINNED = frozenset({"integration", "security"})
"""The test directories whose tests each end with a full garbage collection."""


SERIAL_DIRECTORIES = frozenset({"e2e", "faults", "netns"})
"""Every test here brings up a lab or creates namespaces, links and nftables tables on the machine (faults: a lab
whose parts the tests kill)."""
SERIAL_MODULES = frozenset(
    {
        "tests/integration/test_harness_lab_lock.py",  # takes the machine-wide lab lock itself
        "tests/integration/test_cni_agent.py",  # real network namespaces for the node agent
        "tests/integration/test_zds_socket.py",  # netns file descriptors passed over ZDS
        "tests/security/test_file_modes.py",  # root: files as the installed mesh writes them
        "tests/security/test_identity_forgery.py",  # root: a lab-like node's sockets
    }
)


LAB_DIRECTORIES = frozenset({"e2e", "faults"})
"""Every test here brings up a lab (or runs on one)."""
LAB_MODULES = frozenset(
    {
        # Each lab-lock holder first sweeps the labs no process runs in, and the orphaned ones: these two make
        # such labs (or sweep) on purpose, so they must not overlap a lab of the suite.
        "tests/integration/test_harness_lab_lock.py",
        "tests/integration/test_lab_orphans.py",
    }
)
SHARES = ("machine", "lab", "host", "rest")


def uses_the_machine(item: pytest.Item) -> bool:
    path: Path = item.path
    if not path.is_relative_to(REPO / "tests"):
        return False
    relative = path.relative_to(REPO)
    return (
        relative.parts[1] in SERIAL_DIRECTORIES
        or relative.as_posix() in SERIAL_MODULES
        or item.get_closest_marker("root") is not None
    )


def uses_the_lab(item: pytest.Item) -> bool:
    """Whether a test of the machine's brings up a lab or takes the machine-wide lab lock (the ``lab`` share)."""
    relative = item.path.relative_to(REPO)
    return (
        relative.parts[1] in LAB_DIRECTORIES
        or relative.as_posix() in LAB_MODULES
        or not {"root_lab_lock", "new_lab"}.isdisjoint(getattr(item, "fixturenames", ()))
    )


def share_of(item: pytest.Item) -> str:
    if not uses_the_machine(item):
        return "rest"
    return "lab" if uses_the_lab(item) else "host"


def shares_the_mesh_lab(item: pytest.Item) -> bool:
    """Whether the item's module runs on the shared mesh lab (tests/e2e/lab_driver.py, ``shared_mesh_lab``)."""
    return bool(getattr(getattr(item, "module", None), "SHARES_THE_MESH_LAB", False))


PROPERTY_TEST_TIMEOUT = 900
"""Seconds a property test may take unless it says otherwise: a few hundred generated examples take ~30 s on a quiet
machine and passed the suite's 120 s default under load, after which hypothesis replays the example as a
FlakyFailure (seen with both cores loaded). The bound is for a hung test, not a measurement."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give property tests :data:`PROPERTY_TEST_TIMEOUT`; keep only the share ``AMBIT_TEST_SHARE`` names (module
    docstring)."""
    for item in items:
        test = getattr(item, "obj", None)
        if getattr(test, "is_hypothesis_test", False) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(PROPERTY_TEST_TIMEOUT))
    share = os.environ.get("AMBIT_TEST_SHARE", "")
    if not share:
        items.sort(key=lambda item: not shares_the_mesh_lab(item))  # stable: the modules on the shared lab first
        return
    if share not in SHARES:
        raise pytest.UsageError(f"AMBIT_TEST_SHARE must be one of {', '.join(SHARES)}, not {share!r}")
    wanted = {"lab", "host"} if share == "machine" else {share}
    keep = [item for item in items if share_of(item) in wanted]
    keep.sort(key=lambda item: not shares_the_mesh_lab(item))  # stable: the modules on the shared lab run first
    dropped = [item for item in items if share_of(item) not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """With ``AMBIT_LAB_QUEUE``, run only the modules this stream takes from the queue (tests/lab_streams.py);
    otherwise pytest's own loop runs every test."""
    queue = os.environ.get(lab_streams.QUEUE_VARIABLE)
    if not queue or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    lab_streams.run_from_queue(session, Path(queue), REPO)
    return True


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()  # what is alive now lives for the session: later collections need not walk it again


@pytest.fixture(autouse=True)
def _collect_this_tests_garbage(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    path: Path = request.node.path
    if path.is_relative_to(REPO / "tests") and path.relative_to(REPO / "tests").parts[0] in GC_PINNED:
        gc.collect()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> object:
    """Keep the running test where :func:`tests.harness.timeout_paused` finds it."""
    harness.running_test.append(item)
    try:
        return (yield)
    finally:
        harness.running_test.remove(item)


def hbone_data_or_skip() -> ModuleType:
    """The native HBONE DATA path's extension (``ambit.native._hbone_data``); where it is not built the test is
    skipped, or failed under CI (``CI=true``), so CI cannot test without it unawares."""
    module = native.load_hbone_data()
    if module is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and the native HBONE DATA path (_hbone_data) cannot be used")
        pytest.skip("the native HBONE DATA path is not built (scripts/build_native.py builds it)")
    return module


def use_records_path(path: str) -> None:
    """Make this process run TLS records on ``path``: "python", "native" (records and DATA frames of attached streams
    in C: steps 1 and 2) or "relay" (and the relay's plain socket side: step 3); a native path that is not built
    skips the test, or fails it under CI (``CI=true``), so CI cannot test the fallback alone without saying so."""
    if path == "python":
        native.use(native.NativeSelection(None, "the pure-Python path, by the test"))
        return
    module, reason = native.load_tls_records()
    if module is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the native accelerator cannot be used: {reason}")
        pytest.skip(f"the native accelerator cannot be used: {reason} (scripts/build_native.py builds it)")
    hbone_data = native.load_hbone_data()
    if hbone_data is None and os.environ.get("CI") == "true":
        pytest.fail("CI=true and the native HBONE DATA path (_hbone_data) cannot be used")
    if path == "relay" and hbone_data is None:
        pytest.skip("the native HBONE DATA path (_hbone_data) is not built: no relay sockets in C without it")
    native.use(native.NativeSelection(module, reason, hbone_data, hbone_data if path == "relay" else None))


@pytest.fixture(params=("python", "native"))
def records_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each TLS record path of the socket transport in turn (pure Python, C): the same behaviour must hold on each."""
    path: str = request.param
    use_records_path(path)
    yield path
    native.use(None)


class _QuietShell:
    """A DataPath's session in a pure test: ``received`` is set, and the core's output stays in the core."""

    received = False

    def flush(self) -> None:
        pass


Receive = Callable[[bytes], list[Event]]
"""A core's ``receive_data``, on one of the two paths (``data_path``)."""
DataPathFactory = Callable[[HboneConnection], Receive]


@pytest.fixture(params=("python", "native"))
def data_path(request: pytest.FixtureRequest) -> DataPathFactory:
    """Each way a core's input is parsed, as a factory of its ``receive_data``: the Python engine alone, or first
    the DATA frames of attached streams in C (``ambit.native._hbone_data``, as the native transport feeds them) and
    the rest by the engine. A native path that is not built skips, or fails under CI (``CI=true``)."""
    if request.param == "python":
        return lambda core: core.receive_data
    module = hbone_data_or_skip()

    def native_receive(core: HboneConnection) -> Receive:
        feed = module.DataPath(core, _QuietShell()).feed

        def receive(data: bytes) -> list[Event]:
            taken: int = feed(data)
            return core.receive_data(data[taken:]) if taken < len(data) else []

        return receive

    return native_receive


@pytest.fixture(params=("loop", "socket", "socket-native", "socket-relay"))
def tls_transport(request: pytest.FixtureRequest) -> Iterator[TlsTransportKind]:
    """Each HBONE TLS transport in turn (the loop's, TLS on the socket with its records in Python, the same with its
    records and DATA frames in C, and with the relay's socket side in C too): a test that takes it, or a fixture
    that does, runs on each, and the same behaviour must hold."""
    kind: str = request.param
    use_records_path({"socket-native": "native", "socket-relay": "relay"}.get(kind, "python"))
    yield "loop" if kind == "loop" else "socket"
    native.use(None)


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[ApiServer]:
    """An API server in this test's event loop, on a free loopback port."""
    server = ApiServer(ApiServerSettings(data_dir=tmp_path / "apiserver", port=0))
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()


@pytest.fixture(scope="module")
def server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("apiserver"), free_port())
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None:
            server.stop()
