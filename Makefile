# Ambit: set-up, tests and demo on a Debian 12 machine (as root).
SHELL := /bin/bash
APT_PACKAGES := gcc libssl-dev iproute2 nftables iptables containernetworking-plugins runc ca-certificates curl tcpdump iperf3 stunnel4 haproxy nghttp2-client sockperf dnsperf dnsmasq-base chromium
VENV := .venv
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
STAMP := $(VENV)/.installed

BYTECODE := $(VENV)/bin/python -m compileall -q -j 0 src tests bench >/dev/null
.PHONY: install bytecode test demo lint bench bench-quick bench-apiserver bench-apiserver-quick bench-lab bench-cni bench-policy bench-policy-quick bench-l7 bench-l7-quick bench-waypoint bench-dns bench-dns-quick bench-scale bench-scale-quick bench-node-state bench-startup bench-startup-quick bench-soak bench-soak-quick soak-rollout soak-rollout-long clean

install: $(STAMP)
	@$(VENV)/bin/python scripts/build_native.py  # the native accelerator (src/ambit/native/*.c); rebuilt only when changed

$(STAMP): pyproject.toml uv.lock
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v kubectl >/dev/null 2>&1 || missing="$$missing kubernetes-client"; \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v uv >/dev/null 2>&1 || [ -x $(HOME)/.local/bin/uv ] || python3 -m pip install -q --user uv || python3 -m pip install -q --break-system-packages --user uv
	$(UV) sync --frozen --all-groups --quiet --compile-bytecode  # see bytecode below
	@touch $(STAMP)

# Every Python process of the suite and the lab (hundreds of `ambit` commands, containers whose root is read-only)
# reads its modules' bytecode from __pycache__; where PYTHONDONTWRITEBYTECODE is set (some CI shells), nothing
# writes it, and each process would compile ~600 modules again (2-5 s of CPU). So it is compiled here, once.
bytecode: install
	$(BYTECODE)

test: install bytecode
	bash scripts/run_suite.sh  # in shares: the lab tests in order, beside the rest on xdist workers then the other machine tests

lint: install
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	@# Tests and benchmarks are not type-checked (their fakes are duck-typed), but a name they take from a module must
	@# exist: a refactor once renamed a function a test still called, and only CI's run found it.
	@MYPYPATH=src:. $(VENV)/bin/mypy --explicit-package-bases --ignore-missing-imports --follow-imports=silent \
	  --no-incremental tests bench 2>&1 | grep -E 'error: Module ("[^"]+" )?has no attribute' && exit 1 || true

demo: install bytecode
	bash scripts/demo.sh

bench: install  # root: the data path on a lab, full profile (bench/results/latest.{md,json,png})
	$(VENV)/bin/python -m bench.mesh --profile full

bench-quick: install  # root: the same, short profile (under 5 minutes)
	$(VENV)/bin/python -m bench.mesh --profile short

bench-apiserver: install
	$(VENV)/bin/python -m bench.apiserver
	$(VENV)/bin/python -m bench.lab

bench-apiserver-quick: install
	$(VENV)/bin/python -m bench.apiserver --quick

bench-cni: install  # ambit-cni start-up against /usr/lib/cni/bridge (no root)
	$(VENV)/bin/python -m bench.cni_startup

bench-policy: install  # root: 0, 100 and 10,000 AuthorizationPolicies on a lab (bench/results/policy.{md,json})
	$(VENV)/bin/python -m bench.policy

bench-policy-quick: install  # root: the same, fewer rounds and shorter runs
	$(VENV)/bin/python -m bench.policy --quick

bench-l7: install  # root: the waypoint and ingress paths against L4, direct and haproxy on a lab (bench/results/l7.{md,json})
	$(VENV)/bin/python -m bench.l7

bench-l7-quick: install  # root: the same, two short rounds (under 6 minutes)
	$(VENV)/bin/python -m bench.l7 --quick

bench-waypoint: install  # the waypoint's own process on loopback: CPU per 1,000 req/s and RSS, HTTP/1.1 and HTTP/2 (no root, no lab)
	$(VENV)/bin/python -m bench.waypoint_loopback

bench-dns: install  # the DNS proxy against dnsmasq, in a private netns (bench/results/dns.{md,json})
	$(VENV)/bin/python -m bench.dns

bench-dns-quick: install  # the same, one round of short runs (under 1 minute)
	$(VENV)/bin/python -m bench.dns --quick

bench-scale: install  # control plane at 10,000 pods, 1,000 Services, 100 node proxies (bench/results/scale.{md,json}); no root
	$(VENV)/bin/python -m bench.scale --profile default

bench-scale-quick: install  # the same at 1,000 pods and 10 node proxies (under a minute); full size: --profile full
	$(VENV)/bin/python -m bench.scale --profile quick

bench-node-state: install  # a node proxy's memory per known workload and time to apply a full snapshot, up to 100,000 pods (bench/results/node-state.{md,json}); no root
	$(VENV)/bin/python -m bench.scale.node_state

bench-startup: install bytecode  # root: the node proxy's start-up: import time, RSS at ready, modules, threads (bench/results/startup.{md,json})
	$(VENV)/bin/python -m bench.startup

bench-soak: install bytecode  # root: 100,000 connections of mixed lifetimes with pod and policy churn; node proxies' memory and fds (bench/results/soak.{md,json,png})
	$(VENV)/bin/python -m bench.soak

bench-soak-quick: install bytecode  # root: the same with 10,000 connections (a few minutes)
	$(VENV)/bin/python -m bench.soak --quick

soak-rollout: install bytecode  # root: 20 long streams and new connections through 3 node proxy rollouts in a row (~4 min and a lab bring-up)
	AMBIT_SOAK_RESULTS=bench/results/soak-rollout-{seconds}s.md $(VENV)/bin/pytest -q -s tests/faults/test_rollout_soak.py

soak-rollout-long: install bytecode  # root: the same for an hour, 6 rollouts (bench/results/soak-rollout-3600s.md)
	AMBIT_SOAK_SECONDS=3600 AMBIT_SOAK_ROLLOUTS=6 AMBIT_SOAK_RESULTS=bench/results/soak-rollout-{seconds}s.md \
	  $(VENV)/bin/pytest -q -s tests/faults/test_rollout_soak.py

bench-startup-quick: install bytecode  # root: the same, the 'no pods' variant once
	$(VENV)/bin/python -m bench.startup --quick --runs 1

bench-lab: install  # root: brings a lab up and down
	$(VENV)/bin/python -m bench.lab

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
