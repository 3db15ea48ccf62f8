# localcluster: every install step the project needs lives here (CI starts from a clean clone).
#   make demo   create .venv, install, run the five-broker failover walk-through
#   make test   install what the tests need and run the whole suite
#   make bench  run the benchmark suite (QUICK=1: under 3 minutes); report in bench/results/latest/
#   make lint   ruff over the package, tests and benchmarks
#   make sim    a long sweep of the deterministic simulator (SEEDS=N, PROTOCOL=..., START=...)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=

.PHONY: demo test bench lint clean venv system-deps sim

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "localcluster needs Python 3.11 or newer; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel

# One stamp per extra: reinstall when pyproject.toml changes.
$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[speed]'
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[test,speed]'
	@touch $@

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[bench,speed]'
	@touch $@

$(VENV)/.installed-lint: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[lint]'
	@touch $@

venv: $(VENV)/.installed-base

# Issue 7's walk-through: up -n 5, RF 3 with min.insync.replicas=2, acks=all, kill -9 the
# leader, new leader and ISR, consume everything back, down. (`localcluster demo`: storage.)
demo: $(VENV)/.installed-base
	$(BIN)/python -m localcluster.tools.cluster_demo

# The simulator and the unit tests are CPU-bound and independent of each other: two workers
# (pytest-xdist) share them over the two cores, the simulator's long sweeps first, with the
# integration modules that time nothing (files, raw requests, admin calls, output, clients
# reading back what they wrote: no failover timed, no session timeout, no latency bound).
# Work stealing keeps both workers busy past the simulator's 2-minute sweep (whole modules per
# worker left one idle while the other ran the sweep; a module's shared cluster may now start
# on both). The integration tests that time real processes (failovers, session timeouts,
# chaos) run after them, also on two workers: alone they kept 0.9 of the two cores busy (702 s
# wall, 630 s of CPU: they mostly wait for brokers), on two workers they take 390-410 s, beside
# nothing CPU-bound (make test in all: 12 min). Both parts always run; either failing fails
# the target. Every test has a timeout (setup.cfg). PYTEST_ARGS=... runs just those.
UNTIMED_INTEGRATION := $(addprefix tests/integration/,test_log_corruption.py test_log_crash.py \
	test_protocol_versions.py test_bad_input.py test_output_in_pipes.py test_kcat.py \
	test_admin_records.py test_topic_configs.py test_dynamic_broker_configs.py \
	test_producer_ids.py test_stable_addresses.py test_broker_only_requests.py \
	test_compaction.py test_compression_clients.py test_confluent_kafka.py test_client.py \
	test_groups_cli.py test_kafka_python.py test_idempotent_clients.py \
	test_coord_file_backend.py)
test: $(VENV)/.installed-test system-deps
ifeq ($(strip $(PYTEST_ARGS)),)
	@status=0; \
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=15 tests/sim tests/unit $(UNTIMED_INTEGRATION) || status=1; \
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=25 tests/integration $(addprefix --ignore=,$(UNTIMED_INTEGRATION)) || status=1; \
	exit $$status
else
	$(BIN)/python -m pytest $(PYTEST_ARGS)
endif

# Real servers and clients the tests and benchmarks run against (Debian packages), installed
# only when missing; nothing here starts a service (tests and benchmarks start private servers
# in temporary directories):
# - zookeeper (3.8): the oracle the coordination contract tests hold the file backend to;
# - kcat: a real client in the tests;
# - nats-server (2.9) and redis-server (7.0): the peer systems bench.suite measures.
ZOOKEEPER_HOME ?= /usr/share/zookeeper
system-deps:
	@missing=""; \
	[ -f $(ZOOKEEPER_HOME)/bin/zkServer.sh ] || missing="$$missing zookeeper"; \
	command -v kcat >/dev/null 2>&1 || missing="$$missing kcat"; \
	command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || missing="$$missing nats-server"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; \
	elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	else \
		echo "system-deps: missing Debian packages:$$missing, and this is not root;" \
			"run 'apt-get install$$missing' as root. Tests and benchmarks that need them will be skipped." >&2; \
		exit 0; \
	fi; \
	echo "system-deps: installing Debian packages:$$missing (real servers and clients for tests and benchmarks)"; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing

# tests/sim: one seed -> one run of brokers, controller and ZooKeeper over the real cores;
# a failing seed prints its trace and the command that replays it.
SEEDS ?= 2000
START ?= 0
PROTOCOL ?= leader-epoch
sim: $(VENV)/.installed-test
	$(BIN)/python -m tests.sim.simulator --seeds $(START):$$(( $(START) + $(SEEDS) )) --protocol $(PROTOCOL)

# The benchmark suite: every benchmark, one report in bench/results/<timestamp>/report.md
# (bench/results/latest). QUICK=1: under 3 minutes. BENCH_ARGS: e.g. --only matrix,peers.
BENCH_ARGS ?=
bench: $(VENV)/.installed-bench system-deps
	$(BIN)/python -m bench.suite $(if $(QUICK),--quick) $(BENCH_ARGS)

lint: $(VENV)/.installed-lint
	$(BIN)/ruff check localcluster tests bench
	$(BIN)/ruff format --check localcluster tests bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .ruff_cache
