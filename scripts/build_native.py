"""Build Ambit's native accelerator (``src/ambit/native/*.c``) for the Python running this script.

``make install`` runs it with the venv's interpreter after ``uv sync``. Each extension module of ``EXTENSIONS`` is
built next to its C sources (``tls_records.c`` and ``record_sink.c`` -> ``_tls_records<EXT_SUFFIX>``), compiled by
the system's ``cc`` against this interpreter's headers and linked with the system's libssl and libcrypto: the
libraries Python's own ``_ssl`` uses (checked with ``ldd``, and again at import by comparing OpenSSL versions). A
module is rebuilt only when one of its sources, a header next to them, or this script is newer than it, so the step
is quick and idempotent. Without a compiler, Python's headers or OpenSSL's, it says so in one line and exits 0: the
pure-Python path is used (``ambit.native``).

``--extra-cflags`` adds compiler flags and ``--output DIR`` writes the modules into ``DIR`` instead (always rebuilt
there): the sanitizer test builds ``-fsanitize=address,undefined`` copies that way, apart from the installed ones.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

NATIVE = Path(__file__).resolve().parent.parent / "src" / "ambit" / "native"
EXTENSIONS = {
    "_tls_records": ("tls_records.c", "record_sink.c", "verify_cache.c"),
    "_hbone_data": ("hbone_data.c", "hbone_send.c", "relay_socket.c"),
}
"""Each extension module and its C sources (in ``src/ambit/native``), the first one holding its ``PyInit_``."""
CFLAGS = [
    "-O2",
    "-g",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fstack-protector-strong",
    "-D_FORTIFY_SOURCE=2",
    "-fPIC",
    "-fvisibility=hidden",  # only PyInit_* leaves the module
]
LIBS = ["-lssl", "-lcrypto"]


def _skip(reason: str) -> int:
    print(f"native accelerator not built ({reason}): the pure-Python data path will be used", flush=True)
    return 0


def _ssl_libraries() -> str:
    """What ``ldd`` says Python's ``_ssl`` links (for the log line; empty when it cannot say)."""
    import _ssl

    ldd = shutil.which("ldd")
    if ldd is None or not getattr(_ssl, "__file__", None):
        return ""
    out = subprocess.run([ldd, _ssl.__file__], capture_output=True, text=True, check=False).stdout
    return ", ".join(line.split()[2] for line in out.splitlines() if "libssl" in line or "libcrypto" in line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build Ambit's native accelerator.")
    parser.add_argument("--extra-cflags", default="", help="more compiler flags (one shell-quoted string)")
    parser.add_argument("--output", type=Path, help="write the modules here, always rebuilt (default: next to the C)")
    args = parser.parse_args(argv)
    cc = shutil.which(os.environ.get("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if cc is None:
        return _skip("no C compiler: apt-get install gcc")
    if not (Path(include) / "Python.h").is_file() or not suffix:
        return _skip(f"no Python.h in {include}")
    if not Path("/usr/include/openssl/ssl.h").is_file() and "OPENSSL_INCLUDE" not in os.environ:
        return _skip("no OpenSSL headers: apt-get install libssl-dev")
    newest = max(path.stat().st_mtime for path in [Path(__file__), *NATIVE.glob("*.h")])
    for name, files in EXTENSIONS.items():
        sources = [NATIVE / file for file in files]
        target = (args.output or NATIVE) / f"{name}{suffix}"
        fresh = target.exists() and target.stat().st_mtime >= max(newest, *(s.stat().st_mtime for s in sources))
        if fresh and args.output is None:
            continue
        command = [cc, *CFLAGS, *shlex.split(args.extra_cflags), f"-I{include}"]
        if "OPENSSL_INCLUDE" in os.environ:
            command.append(f"-I{os.environ['OPENSSL_INCLUDE']}")
        partial = target.with_name(target.name + ".partial")
        command += ["-shared", *map(str, sources), "-o", str(partial), *LIBS]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            print(result.stderr, file=sys.stderr)
            print(f"native accelerator: {name} did not compile (above)", file=sys.stderr)
            return 1
        partial.replace(target)  # a running process never sees a half-written module
        print(f"native accelerator: built {target} ({_ssl_libraries()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
