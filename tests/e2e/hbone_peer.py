"""An independent HBONE peer for e2e tests: Node.js's own HTTP/2 stack sends a CONNECT to a pod's 15008 with a
workload certificate of the mesh, as upstream's echo client does in its direct HBONE calls (TestDirect), then one
HTTP/1.1 request through the tunnel.

:func:`node_connect` prints what came back in one line: ``status 200 <body>`` when the tunnel opened and the
request was answered (``<body>`` is what followed the inner response's head), ``status <code>`` when the CONNECT was
answered with another status, ``error <code>`` when the connection or stream failed, and ``closed without an
answer`` when the peer closed first.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId

NODE_CONNECT = r"""
const http2 = require('http2'); const fs = require('fs');
const [ip, authority, key, cert, ca] = process.argv.slice(1);  // node -e: no script path in argv
const client = http2.connect(`https://${ip}:15008`, {
  key: fs.readFileSync(key), cert: fs.readFileSync(cert), ca: fs.readFileSync(ca),
  minVersion: 'TLSv1.3', ALPNProtocols: ['h2'], checkServerIdentity: () => undefined,
});
let answered = false;
const fail = (e) => { console.log('error ' + e.code); process.exit(0); };
client.on('error', fail);
client.on('close', () => { if (!answered) console.log('closed without an answer'); });
const req = client.request({':method': 'CONNECT', ':authority': authority});
req.on('error', fail);
req.on('response', (headers) => {
  answered = true;
  const status = headers[':status'];
  if (status !== 200) { console.log('status ' + status); client.close(); return; }
  let body = '';
  req.setEncoding('utf8');
  req.on('data', (d) => { body += d; });
  req.on('end', () => {
    const split = body.indexOf('\r\n\r\n');
    const head = split < 0 ? body : body.slice(0, split);
    const inner = head.split('\r\n')[0].split(' ')[1];
    console.log(inner === '200' ? 'status 200 ' + body.slice(split + 4).replace(/\s+/g, ' ') : 'inner ' + inner);
    client.close();
  });
  req.end('GET /from-node HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
});
"""


def workload_files(directory: Path, ca_dir: Path, namespace: str, service_account: str, name: str) -> list[str]:
    """Key, leaf and root of a workload certificate for ``namespace/service_account`` signed by the CA in
    ``ca_dir``, written under ``directory`` as ``<name>.key``, ``.crt`` and ``.ca``."""
    identity = SpiffeId("cluster.local", namespace, service_account)
    cert = asyncio.run(LocalCa(ca_dir).fetch_certificate(identity))
    files = []
    for suffix, data in (("key", cert.key_pem), ("crt", cert.chain_pem[0]), ("ca", cert.roots_pem)):
        path = directory / f"{name}.{suffix}"
        path.write_bytes(data)
        files.append(str(path))
    return files


def node_connect(target: str, authority: str, files: list[str]) -> str:
    """CONNECT ``authority`` through ``target``:15008 with the certificate in ``files``; the one-line outcome."""
    done = subprocess.run(
        ["node", "-e", NODE_CONNECT, target, authority, *files], capture_output=True, text=True, timeout=20, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
