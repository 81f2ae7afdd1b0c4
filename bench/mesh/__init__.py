"""The data-path benchmark: the node proxy against no mesh, stunnel and haproxy, measured in one run on the lab.

``python -m bench.mesh [--profile short|full|smoke]`` (as root; ``make bench`` / ``make bench-quick``, ``ambit
bench``) brings up a 2-node lab with the mesh and measures every scenario in every mode, interleaved (A B C … A B C
…) so that drift of the machine spreads over all modes alike; ratios are only ever taken between figures of the
same run.

Scenarios, in the order they run: bulk throughput (iperf3, 1 and 4 streams; also same node in the full profile);
request/response latency (sockperf, 14 B and 1 KiB, closed loop, each node's processes on a vCPU of its own; the
same closed loop unpinned, 14 B, and 1 KiB in the full profile; a fixed rate and same node in the full profile);
new connections per second with a 1-byte echo, pooled (the node proxies' defaults: a new connection is an HTTP/2
stream on a pooled mutual-TLS connection); the same with cold handshakes (the node proxies restarted with
``--pool-max-streams=1 --pool-idle-timeout=0``, so each connection is a full mutual-TLS handshake; ambit against
direct, stunnel and haproxy-tls, then the proxies are restarted with their defaults); held idle connections
(proxy RSS per connection); proxy memory (RSS idle and peak, per proxy process: one per node).

Modules:

- :mod:`bench.mesh.profile`: the profiles (durations, repeats, which scenarios) and the modes;
- :mod:`bench.mesh.topology`: the lab, its pods, and every process the bench starts (killed at the end);
- :mod:`bench.mesh.tunnels`: ECDSA P-256 certificates, stunnel and haproxy configured for mutual TLS;
- :mod:`bench.mesh.apps`: the 1-byte echo server, the connection-rate client and the idle-connection holder;
- :mod:`bench.mesh.probes`: parsers for iperf3 and sockperf output, and ``/proc`` readings (CPU, RSS);
- :mod:`bench.mesh.scenarios`: one function per scenario, turning a run into :class:`~bench.mesh.results.Sample`;
- :mod:`bench.mesh.results`: aggregation (median, min–max, ×direct, ×stunnel), Markdown, JSON lines;
- :mod:`bench.mesh.chart`: the PNG chart, drawn with zlib and struct;
- :mod:`bench.mesh.run`: the orchestration and the command line.
"""

# ruff: noqa: RUF002, RUF003 - the tables use × and en dashes on purpose
