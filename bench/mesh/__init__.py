"""The data-path benchmark: the node proxy against no mesh, stunnel and haproxy, measured in one run on the lab.

``python -m bench.mesh [--profile short|full|smoke]`` (as root; ``make bench`` / ``make bench-quick``, ``ambit
bench``) brings up a 2-node lab with the mesh and measures every scenario in every mode, interleaved (A B C … A B C
…) so that drift of the machine spreads over all modes alike; ratios are only ever taken between figures of the
same run.

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
