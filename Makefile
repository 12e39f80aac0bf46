# A thin front door to cargo. `make run` starts the service on the
# filesystem default (no SurrealDB compiled); `make test` runs every test on
# every backend, the module-cycle check, clippy (with the minimum Rust
# version's lint, `.ci/check-msrv`), then the API contract test and the
# dashboard's browser tests; `make contract-test` runs the contract test alone; `make surreal` starts a
# SurrealDB server on 127.0.0.1:8000; `make deb` builds the Debian package
# and `make deb-test` checks it.

CARGO ?= cargo
# The SurrealDB backends and the dev server are built together, in one
# feature set, so that surrealdb-core (minutes on 2 cores) compiles once and
# `make test` and `make surreal` share it.
SURREAL_FEATURES := orchestrator/surrealdb
DEV_BUILD = $(CARGO) build --workspace --all-targets --features $(SURREAL_FEATURES)
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
# The tests start this binary on free ports.
export SURREAL_DEV_SERVER := $(TARGET_DIR)/debug/surreal-dev-server
NU_VERSION := 0.115.1
TOOLS_DIR := $(CURDIR)/.tools
NU_BIN_DIR := $(TOOLS_DIR)/node_modules/@nushell/linux-x64/bin
# Scripts run with the project's pinned nu unless one is already on PATH.
export PATH := $(if $(shell command -v nu 2>/dev/null),$(PATH),$(NU_BIN_DIR):$(PATH))

.PHONY: run test contract-test contract-test-run ui-test ui-test-run ui-screenshots soak surreal bench deb deb-test cargo-deb fmt lint tools clean

run: tools
	$(CARGO) run --release -p orchestrator -- serve --data-dir ./data --port 8080

test: tools
	$(DEV_BUILD)
	@mkdir -p $(dir $(UI_BIN_KEPT)) && ln -f $(UI_BIN) $(UI_BIN_KEPT) \
		&& ln -f $(dir $(UI_BIN))orchestrator-sandbox-exec $(dir $(UI_BIN_KEPT))
	$(CARGO) test --workspace --all-targets --features $(SURREAL_FEATURES)
	@# The default build (`make run`'s, without SurrealDB): what it says of
	@# the backends it lacks, which the line above never reaches.
	$(CARGO) test -p orchestrator-storage --test it -- backends_not_compiled_in
	$(CARGO) test -p orchestrator --test it -- startup_errors_exit_non_zero bad_specs_and_missing_backends
	$(CARGO) run -q -p module-cycles -- .
	bash .ci/check-msrv
	$(MAKE) contract-test-run CONTRACT_BIN=$(UI_BIN_KEPT)
	$(MAKE) ui-test-run UI_BIN=$(UI_BIN_KEPT)

# The API contract test (about a minute on 2 cores): schemathesis, from
# PyPI at the versions of crates/orchestrator-api/contract/requirements.txt,
# in a venv under .tools/, sends generated requests (valid and invalid) to
# every operation of /openapi.json of a real `orchestrator serve` (debug
# build, filesystem backend, a temporary data dir, a real admin token) with
# all checks and all phases, the stateful one following the document's
# links; it fails on any failure. What it leaves out, and why, is in
# contract/run.sh; see docs/api.md. ST_MAX_EXAMPLES=n for a longer run.
CONTRACT_DIR := crates/orchestrator-api/contract
ST_VENV := $(TOOLS_DIR)/schemathesis
ST_STAMP := $(ST_VENV)/.installed
CONTRACT_BIN ?= $(TARGET_DIR)/debug/orchestrator

contract-test: tools
	$(CARGO) build -p orchestrator
	$(MAKE) contract-test-run

contract-test-run: $(ST_STAMP)
	$(CONTRACT_DIR)/run.sh $(CONTRACT_BIN) $(ST_VENV)/bin/st

# The venv, made again whenever the pinned versions change.
$(ST_STAMP): $(CONTRACT_DIR)/requirements.txt
	@command -v python3 >/dev/null || { echo "the contract test needs python3 (with venv)" >&2; exit 1; }
	rm -rf $(ST_VENV)
	python3 -m venv $(ST_VENV)
	$(ST_VENV)/bin/pip install --quiet --disable-pip-version-check -r $(CONTRACT_DIR)/requirements.txt
	touch $@

# The dashboard in a real browser (ui-tests/, about 6 minutes): Debian's
# chromium (never a downloaded browser) driven by playwright-core from the
# lockfile, against the debug binary. `make test` runs them with the binary
# it built; `make ui-test` builds the default one first.
CHROMIUM ?= /usr/bin/chromium
UI_BIN ?= $(TARGET_DIR)/debug/orchestrator
# The binary this `make test` built, held by a hard link: a build in another
# checkout sharing CARGO_TARGET_DIR may replace debug/orchestrator meanwhile.
UI_BIN_KEPT := $(TARGET_DIR)/ui-tests/orchestrator-$(notdir $(CURDIR))

ui-test: tools
	$(CARGO) build -p orchestrator
	$(MAKE) ui-test-run

ui-test-run: ui-tests/node_modules/.package-lock.json
	@test -x $(CHROMIUM) || { echo "the browser tests need chromium: apt-get install chromium (or set CHROMIUM)" >&2; exit 1; }
	cd ui-tests && ORCHESTRATOR_BIN=$(UI_BIN) CHROMIUM=$(CHROMIUM) npm test

# The screenshots of docs/dashboard.md (docs/images/dashboard-*.png), light
# and dark, from a service with some of everything; as root for the test
# environment pages. About a minute.
ui-screenshots: tools ui-tests/node_modules/.package-lock.json
	$(CARGO) build -p orchestrator
	cd ui-tests && ORCHESTRATOR_BIN=$(UI_BIN) CHROMIUM=$(CHROMIUM) node screenshots.mjs

# `npm ci` installs exactly the lockfile, and leaves this file as its stamp.
ui-tests/node_modules/.package-lock.json: ui-tests/package-lock.json
	cd ui-tests && npm ci --no-audit --no-fund

# The crash drill at length: SIGKILL at seeded random moments, many times.
# Set ORCHESTRATOR_FAULT_SEED to replay a run (the seed is printed).
soak: tools
	$(DEV_BUILD)
	ORCHESTRATOR_FAULT_ROUNDS=$${ORCHESTRATOR_FAULT_ROUNDS:-40} \
	ORCHESTRATOR_FAULT_SEED=$${ORCHESTRATOR_FAULT_SEED:-$$(date +%s)} \
	$(CARGO) test -p orchestrator --test it --features $(SURREAL_FEATURES) faults -- --nocapture

# A real SurrealDB server in memory, for `--storage-type surrealdb-server`
# with the default URL and credentials (root/root). Ctrl-C stops it.
surreal:
	$(DEV_BUILD)
	$(SURREAL_DEV_SERVER) start --bind 127.0.0.1:8000 --user root --pass root memory

# Orchestration overhead against spawning the scripts directly, written to
# docs/benchmarks.md (about 6.5 minutes after the release build, 2 of them for
# workload 7's workflows of up to 10,000 steps and 1.3 for workload 8's live
# migration under load, plus workload 11's peer rows, below). The default
# measures the filesystem backend; add embedded SurrealDB with
# `make bench BENCH_BACKENDS=filesystem,surrealdb-embedded` (builds with
# --features orchestrator/surrealdb: 20+ minutes the first time, about an hour
# on a busy 2-core machine; the benchmark then also runs workloads 1-3 and 7
# on embedded SurrealDB, workload 5 on it, and migrates fs -> embedded -> fs
# in workload 6).
#
# `BENCH_BACKENDS=...,surrealdb-server` also builds the SurrealDB server
# (surreal-dev-server) in release mode, starts it in memory on a free port,
# runs workloads 1-3 on it and adds workload 9: 1, 2 and 3 nodes on that
# server. With all three backends the benchmark took 20 minutes.
BENCH_BACKENDS ?= filesystem
BENCH_FEATURES := $(if $(findstring surrealdb,$(BENCH_BACKENDS)),--features orchestrator/surrealdb)
BENCH_SERVER := $(if $(findstring surrealdb-server,$(BENCH_BACKENDS)),-p surreal-dev-server)
BENCH_BIN := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/release/orchestrator-bench
# Workload 11, the peer rows: the same 500-step and DAG workflows through
# Luigi beside xargs, make and the orchestrator in the same run (about a
# minute). Luigi comes from PyPI at the versions of
# crates/orchestrator-bench/peers/requirements.txt, in a venv under .tools/
# made once per pinned version, as the contract test's is.
PEERS_DIR := crates/orchestrator-bench/peers
BENCH_VENV := $(TOOLS_DIR)/bench-venv
BENCH_STAMP := $(BENCH_VENV)/.installed

bench: $(BENCH_STAMP)
	$(CARGO) build --release -p orchestrator -p orchestrator-bench $(BENCH_SERVER) $(BENCH_FEATURES)
	$(BENCH_BIN) --backends $(BENCH_BACKENDS) --luigi-python $(BENCH_VENV)/bin/python --out docs/benchmarks.md

$(BENCH_STAMP): $(PEERS_DIR)/requirements.txt
	@command -v python3 >/dev/null || { echo "the benchmark's peer rows need python3 (with venv)" >&2; exit 1; }
	rm -rf $(BENCH_VENV)
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check -r $(PEERS_DIR)/requirements.txt
	touch $@

# The Debian package, in $(TARGET_DIR)/debian/: the release binary with its
# default features (the filesystem backend only; see docs/deployment.md for
# the SurrealDB variant), stripped. About 3 minutes on 2 cores, cold.
CARGO_DEB_VERSION := 3.8.0
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
DEB := $(TARGET_DIR)/debian/orchestrator_$(VERSION)-1_amd64.deb

deb: cargo-deb
	$(CARGO) deb -p orchestrator --strip

# Checks the package: contents, lintian, the unit (systemd-analyze) and an
# install, purge and reinstall in a throwaway Debian root (debootstrap,
# cached in ~/.cache/orchestrator-deb-test). Needs root for the install.
deb-test: deb
	crates/orchestrator/debian/check-deb.sh $(DEB)

# cargo-deb at a pinned version, built outside the shared target dir.
cargo-deb:
	@if [ "$$($(CARGO) deb --version 2>/dev/null)" != "cargo-deb $(CARGO_DEB_VERSION)" ]; then \
		echo "installing cargo-deb $(CARGO_DEB_VERSION)"; \
		env -u CARGO_TARGET_DIR $(CARGO) install cargo-deb --version $(CARGO_DEB_VERSION) --locked; \
	fi

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	bash .ci/check-msrv

# Nushell from the npm registry (the official binary), unless `nu` exists.
tools:
	@if ! command -v nu >/dev/null 2>&1; then \
		echo "installing nushell $(NU_VERSION) into $(TOOLS_DIR)"; \
		mkdir -p $(TOOLS_DIR) && npm install --prefix $(TOOLS_DIR) --no-audit --no-fund --silent nushell@$(NU_VERSION); \
	fi
	@nu --version >/dev/null

clean:
	$(CARGO) clean
	rm -rf $(TOOLS_DIR) ui-tests/node_modules ui-tests/artifacts
