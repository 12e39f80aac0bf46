# A thin front door to cargo. `make run` starts the service on the
# filesystem default; `make test` runs every test.

CARGO ?= cargo
NU_VERSION := 0.115.1
TOOLS_DIR := $(CURDIR)/.tools
NU_BIN_DIR := $(TOOLS_DIR)/node_modules/@nushell/linux-x64/bin
# Scripts run with the project's pinned nu unless one is already on PATH.
export PATH := $(if $(shell command -v nu 2>/dev/null),$(PATH),$(NU_BIN_DIR):$(PATH))

.PHONY: run test bench fmt lint tools clean

run: tools
	$(CARGO) run --release -p orchestrator -- serve --data-dir ./data --port 8080

test: tools
	$(CARGO) test --workspace --all-targets

bench: tools
	@echo "the benchmark suite is not written yet (see the open benchmark issue)"; exit 1

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Nushell from the npm registry (the official binary), unless `nu` exists.
tools:
	@if ! command -v nu >/dev/null 2>&1; then \
		echo "installing nushell $(NU_VERSION) into $(TOOLS_DIR)"; \
		mkdir -p $(TOOLS_DIR) && npm install --prefix $(TOOLS_DIR) --no-audit --no-fund --silent nushell@$(NU_VERSION); \
	fi
	@nu --version >/dev/null

clean:
	$(CARGO) clean
	rm -rf $(TOOLS_DIR)
