"""``ambit proxy-config --admin-url`` against a real node proxy's admin port, and against hostile admin servers.

The node proxy is the real :class:`~ambit.inpod.daemon.NodeProxy` of :mod:`tests.proxyconfig_rig` (local config,
local CA, loopback ports picked by the kernel); the CLI runs as its own process (``python -m ambit.cli``). The
hostile servers are plain threaded HTTP servers on loopback that answer too much, too slowly, not JSON, with a
redirect, or with terminal escapes in names; each must give one clear line and exit 1, within its bound.

The recorded dump the unit tests read (``tests/unit/golden/proxyconfig/dump.json``) is checked here against a fresh
one, so it cannot drift from what the node proxy sends; ``AMBIT_UPDATE_GOLDEN=1`` records it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.harness import free_port
from tests.proxyconfig_rig import record_dump, running_node_proxy
from typer.testing import CliRunner

import ambit.cli.proxy_config  # registers the command on the app
from ambit.cli.app import app
from ambit.cli.proxy_config import child_argv
from ambit.observe.proxyconfig import Filters, Section

GOLDEN = Path(__file__).parent.parent / "unit" / "golden" / "proxyconfig" / "dump.json"
_VOLATILE = {
    "pem",
    "serialNumber",
    "validFrom",
    "expirationTime",
    "ageSeconds",
    "configFile",
    "id",
    "key",
    "tlsRecords",
}
"""``tlsRecords`` names the record path this machine selected (the C extension's file, or Python's)."""


def _masked(value: Any, key: str = "") -> Any:
    """The dump with what changes from run to run (certificates, ages, paths, pool keys) replaced by a marker."""
    if key in _VOLATILE:
        return "<volatile>"
    if isinstance(value, dict):
        return {k: _masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def _for_the_record(dump: dict[str, Any]) -> dict[str, Any]:
    """PEM blocks are long and say nothing a table shows: kept out of the recorded file."""
    recorded: dict[str, Any] = json.loads(json.dumps(dump))
    recorded["config"]["configFile"] = "/tmp/workloads.yaml"
    for entry in recorded.get("certificates", []):
        for cert in [*entry.get("certChain", []), *entry.get("rootCerts", [])]:
            cert["pem"] = "-----BEGIN CERTIFICATE-----\n(elided)\n-----END CERTIFICATE-----\n"
    return recorded


async def ambit(*args: str) -> tuple[int, str, str]:
    """Run ``python -m ambit.cli ARGS`` as its own process; (exit code, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ambit.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_recorded_dump_is_what_a_node_proxy_dumps_today(tmp_path: Path) -> None:
    async with running_node_proxy(tmp_path) as proxy:
        fresh = _for_the_record(record_dump(proxy))
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(fresh, indent=2) + "\n")
    recorded = json.loads(GOLDEN.read_text())
    assert _masked(fresh) == _masked(recorded), f"{GOLDEN} differs (AMBIT_UPDATE_GOLDEN=1 records it again)"


async def test_the_cli_shows_a_running_node_proxys_tables_over_its_admin_url(tmp_path: Path) -> None:
    async with running_node_proxy(tmp_path) as proxy:
        url = f"http://127.0.0.1:{proxy.endpoints.ports['admin']}"
        code, out, err = await ambit("proxy-config", "workloads", "--admin-url", url)
        assert (code, err) == (0, "")
        lines = out.splitlines()
        assert lines[0].split() == ["NAMESPACE", "POD", "NAME", "ADDRESS", "NODE", "WAYPOINT", "PROTOCOL"]
        assert lines[1].split() == ["apps", "client", "198.18.16.5", "node-1", "None", "HBONE"]
        assert len(lines) == 5

        code, out, err = await ambit("proxy-config", "workloads", "--admin-url", url, "--address", "198.18.17.7")
        assert code == 0 and [line.split()[1] for line in out.splitlines()[1:]] == ["server"]

        code, out, err = await ambit("proxy-config", "services", "--admin-url", url, "-n", "APPS", "-o", "json")
        assert code == 0 and [svc["name"] for svc in json.loads(out)] == ["echo", "waypoint"]

        code, out, err = await ambit("proxy-config", "certificates", "--admin-url", url, "-o", "yaml")
        certs = yaml.safe_load(out)
        assert code == 0 and [c["identity"] for c in certs] == [
            "spiffe://cluster.local/ns/apps/sa/client",
            "spiffe://cluster.local/ns/apps/sa/default",
        ]

        code, out, err = await ambit("proxy-config", "all", "--admin-url", url)
        assert code == 0
        for title in ("WORKLOADS:", "SERVICES:", "POLICIES:", "CERTIFICATES:", "CONNECTIONS:"):
            assert title in out.splitlines()
        assert "client.apps Outbound  client.apps:51000 echo.apps.svc.cluster.local:80" in out


async def test_a_stopped_node_proxy_gives_one_clear_line(tmp_path: Path) -> None:
    port = free_port()
    code, out, err = await ambit("proxy-config", "workloads", "--admin-url", f"http://127.0.0.1:{port}")
    assert code == 1 and out == ""
    assert err.startswith(f"ambit proxy-config: http://127.0.0.1:{port}/config_dump: cannot connect")
    assert "Traceback" not in err and len(err.splitlines()) == 1


# --- hostile admin servers ---------------------------------------------------------------------------------------

Handler = Callable[[BaseHTTPRequestHandler], None]


@pytest.fixture
def hostile() -> Iterator[Callable[[Handler], str]]:
    """Start a loopback HTTP server whose GET does what the test says; returns its base URL. Stopped at the end."""
    servers: list[ThreadingHTTPServer] = []

    def start(behaviour: Handler) -> str:
        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                behaviour(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        servers.append(server)
        threading.Thread(target=server.serve_forever, name="hostile admin", daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["proxy-config", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    handler.send_response(status)
    for name, value in (headers or {"Content-Length": str(len(body))}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def test_an_answer_over_64_mib_is_refused_without_reading_it_all(hostile: Callable[[Handler], str]) -> None:
    sent: list[int] = []

    def endless(handler: BaseHTTPRequestHandler) -> None:  # no Content-Length: the size shows only while reading
        handler.send_response(200)
        handler.send_header("Connection", "close")
        handler.end_headers()
        chunk = b" " * (1 << 20)
        try:
            for _ in range(200):
                handler.wfile.write(chunk)
                sent.append(len(chunk))
        except OSError:
            pass  # the client hung up, as it should

    code, out, err = _run("workloads", "--admin-url", hostile(endless))
    assert code == 1 and out == ""
    assert "the answer is over 67108864 bytes" in err
    assert sum(sent) < 100 << 20  # the client stopped reading well before the server's 200 MiB


def test_a_content_length_over_the_limit_is_refused_before_reading(hostile: Callable[[Handler], str]) -> None:
    def announce(handler: BaseHTTPRequestHandler) -> None:
        _send(handler, 200, b"{}", {"Content-Length": str(1 << 30)})

    code, _out, err = _run("workloads", "--admin-url", hostile(announce))
    assert code == 1 and f"the answer is {1 << 30} bytes, over 67108864" in err


def test_a_server_that_drips_is_cut_off_at_the_timeout(hostile: Callable[[Handler], str]) -> None:
    def drip(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.end_headers()
        try:
            for _ in range(100):
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass

    started = time.monotonic()
    code, _out, err = _run("workloads", "--admin-url", hostile(drip), "--timeout", "1")
    assert code == 1 and "no complete answer within 1 s" in err
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("status", "body", "headers", "expected"),
    [
        (200, b"<html>not json</html>", None, "config_dump is not JSON"),
        (200, b"[1, 2]", None, "config_dump (top level): expected an object, got a list"),
        (200, b'{"services": []}', None, "config_dump has no 'workloads' section"),
        (200, b'{"workloads": [{"name": 3}], "services": []}', None, "workloads[0].name: expected a string, got 3"),
        (404, b"404: Not Found", None, "HTTP 404 Not Found: '404: Not Found'"),
        (302, b"", {"Location": "http://192.0.2.1/", "Content-Length": "0"}, "HTTP 302"),
    ],
)
def test_a_bad_answer_is_one_clear_line(
    hostile: Callable[[Handler], str], status: int, body: bytes, headers: dict[str, str] | None, expected: str
) -> None:
    code, out, err = _run("workloads", "--admin-url", hostile(lambda h: _send(h, status, body, headers)))
    assert code == 1 and out == "" and expected in err, err
    assert len(err.splitlines()) == 1


def test_terminal_escapes_in_a_dump_are_shown_not_obeyed(hostile: Callable[[Handler], str]) -> None:
    workload = {"uid": "u", "name": "evil\x1b]0;pwned\x07\x1b[2J", "namespace": "apps", "workloadIps": ["10.0.0.1"]}
    body = json.dumps({"workloads": [workload], "services": []}).encode()
    url = hostile(lambda h: _send(h, 200, body))
    code, out, _err = _run("workloads", "--admin-url", url)
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J" in out
    for output in ("json", "yaml"):
        code, out, _err = _run("workloads", "--admin-url", url, "-o", output)
        assert code == 0 and "\x1b" not in out and "\x07" not in out


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("file:///etc/passwd", "expected http://HOST:PORT"),
        ("127.0.0.1:15000", "expected http://HOST:PORT"),
        ("http://127.0.0.1:99999", "bad admin URL"),
        ("http://127.0.0.1:15000/?x=1", "no query or fragment"),
    ],
)
def test_a_bad_admin_url_is_refused_before_any_connection(url: str, expected: str) -> None:
    code, _out, err = _run("workloads", "--admin-url", url)
    assert code == 1 and expected in err


def test_no_lab_and_no_admin_url_says_how_to_reach_an_admin_port(tmp_path: Path) -> None:
    code, _out, err = _run("workloads", "--lab-dir", str(tmp_path))
    assert code == 1 and "--admin-url" in err and "port-forward" in err


def test_a_bad_filter_is_refused_before_any_fetch() -> None:
    sock = socket.socket()  # nothing listens here: a fetch would fail differently
    sock.close()
    code, _out, err = _run("workloads", "--admin-url", "http://127.0.0.1:1", "--address", "not-an-ip")
    assert code == 2 and "not an IP address" in err
    code, _out, err = _run("connections", "--admin-url", "http://127.0.0.1:1", "--direction", "sideways")
    assert code == 2 and "inbound or outbound" in err
    code, _out, err = _run("workloads", "--admin-url", "http://127.0.0.1:1", "-o", "xml")
    assert code == 2 and "table, json, yaml" in err


@pytest.mark.parametrize(
    ("args", "sections", "filters", "output"),
    [
        (
            ("workloads", "-n", "apps", "--address", "198.18.16.9"),
            [Section.WORKLOADS],
            Filters(namespace="apps", address="198.18.16.9"),
            "table",
        ),
        (
            ("connections", "--direction", "outbound", "--raw", "-o", "yaml"),
            [Section.CONNECTIONS],
            Filters(direction="outbound", raw=True),
            "yaml",
        ),
        (("all", "-o", "json"), list(Section), Filters(), "json"),
    ],
)
def test_the_lab_child_is_asked_for_the_same_view(
    hostile: Callable[[Handler], str], args: tuple[str, ...], sections: list[Section], filters: Filters, output: str
) -> None:
    """In the lab the command runs again inside the node proxy's netns with child_argv: it must print the same."""
    body = GOLDEN.read_bytes()
    url = hostile(lambda h: _send(h, 200, body))
    direct = CliRunner().invoke(app, ["proxy-config", *args, "--admin-url", url])
    argv = child_argv(sections, filters, output, 10.0, url)
    assert argv[:2] == ["proxy-config", args[0]]
    via_child = CliRunner().invoke(app, argv)
    assert direct.exit_code == 0 and direct.stdout.strip()
    assert (via_child.exit_code, via_child.stdout) == (0, direct.stdout)
