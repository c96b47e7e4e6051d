# Two commands are all the set-up there is: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
RUN_STAMP := $(VENV)/.runtime-stamp
NFT    := /usr/sbin/nft
CHROMIUM := /usr/bin/chromium
BWRAP  := /usr/bin/bwrap
NPM    := /usr/bin/npm
AXE    := tests/browser/node_modules/.package-lock.json

.PHONY: run test test-under-load lint docs bench bench-peers clean system-packages

# `make run` needs corral and its runtime dependencies only; `make test` adds the `dev`
# extra (linters, docs, test tools) and the Debian packages the tests drive.
$(RUN_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing corral into $(VENV) ..."
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -e .
	@touch $(RUN_STAMP)

$(STAMP): pyproject.toml | system-packages
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing corral and its development tools into $(VENV) ..."
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP) $(RUN_STAMP)

# The Debian packages the tests drive: Chromium (the dashboard's browser tests, through
# Playwright: its own browser download fails here), npm and its nodejs (to install axe-core,
# which the browser tests run on every page), nftables (the partition chaos test) and
# bubblewrap (the process sandbox's tests). As root, those missing are installed (waiting
# for another apt's lock); when apt fails, its own words are shown and make stops.
# Without root or apt, make says what is missing and those tests skip.
TEST_PACKAGES := $(CHROMIUM):chromium $(NPM):npm $(NFT):nftables $(BWRAP):bubblewrap
system-packages:
	@missing=""; \
	for pair in $(TEST_PACKAGES); do [ -x "$${pair%%:*}" ] || missing="$$missing $${pair##*:}"; done; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "the tests need Debian's$$missing: install them as root, or their tests skip"; \
		exit 0; \
	fi; \
	echo "installing Debian's$$missing (for the tests) ..."; \
	log=$$(mktemp); export DEBIAN_FRONTEND=noninteractive; \
	apt="apt-get -y -qq -o DPkg::Lock::Timeout=300"; \
	if ! { $$apt install $$missing >"$$log" 2>&1 || \
		{ $$apt update >>"$$log" 2>&1 && $$apt install $$missing >>"$$log" 2>&1; }; }; then \
		cat "$$log" >&2; rm -f "$$log"; \
		echo "make: could not install$$missing; apt said so above" >&2; exit 1; \
	fi; \
	rm -f "$$log"

# axe-core for the browser tests, as tests/browser/package-lock.json pins it: `npm ci` there
# when node_modules is missing or the lock changed (npm writes the target last). Without npm
# make says so, and the browser tests skip (on CI they fail).
$(AXE): tests/browser/package-lock.json | system-packages
	@if command -v npm >/dev/null 2>&1; then \
		echo "installing axe-core for the browser tests (npm ci in tests/browser) ..."; \
		npm ci --prefix tests/browser --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null; \
	else \
		echo "npm is missing: install Debian's npm as root, or the browser tests skip"; \
	fi

run: $(RUN_STAMP)
	@echo "corral: migrating the embedded database (./corral.db) ..."
	@$(BIN)/corral db upgrade
	@echo "corral: starting on SQLite with the process executor; state in ./.corral/"
	@$(BIN)/corral serve --demo --http 127.0.0.1:8080

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples docs
	$(BIN)/ruff format --check src tests bench examples docs
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site, into site/ (git-ignored); --strict turns every warning into an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Bytecode for corral's own modules first, as installing a package makes it: the many
# `corral` processes the tests start then read it, even where PYTHONDONTWRITEBYTECODE is set.
# The tests run on TEST_WORKERS processes at once (pytest-xdist; each has its own PostgreSQL
# databases and folders); a group of tests that shares one slow set-up stays on one worker.
TEST_WORKERS ?= 4
test: lint docs $(AXE)
	@$(BIN)/python -m compileall -q src
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

# `make test` with the CPU oversubscribed: two busy processes per core spin beside it, so
# a test that counts on a quick machine fails here first. The busy processes are killed
# however this ends (a trap on exit; they also stop by themselves after LOAD_MINUTES), and
# the whole run may take LOAD_MINUTES at most.
LOAD_MINUTES ?= 45
test-under-load: $(STAMP)
	@busy=$$((2 * $$(nproc))); pids=""; \
	trap 'kill $$pids 2>/dev/null' EXIT; trap 'exit 130' INT TERM HUP; \
	for _ in $$(seq $$busy); do \
	  timeout $(LOAD_MINUTES)m $(PYTHON) -c 'while True: pass' & pids="$$pids $$!"; done; \
	echo "make test beside $$busy busy processes on $$(nproc) cores, $(LOAD_MINUTES) minutes at most"; \
	began=$$(date +%s); \
	timeout $(LOAD_MINUTES)m $(MAKE) --no-print-directory test & pids="$$pids $$!"; \
	wait $$!; status=$$?; \
	echo "make test under load: exit status $$status after $$(( $$(date +%s) - began ))s"; \
	exit $$status

bench: $(STAMP)
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/retry_storm.py
	$(BIN)/python bench/process.py
	$(BIN)/python bench/http_jobs.py
	$(BIN)/python bench/alerts.py
	$(BIN)/python bench/history.py
	$(BIN)/python bench/cli_start.py
	$(BIN)/python bench/schedules.py
	$(BIN)/python bench/api.py
	$(BIN)/python bench/dashboard.py
	$(BIN)/python bench/workers.py

# Corral against PgQueuer and the raw loop, interleaved over rounds, on the PostgreSQL server
# of CORRAL_TEST_POSTGRES_URL (JSON on stdout). PgQueuer is in the `bench` extra, installed here.
bench-peers: $(STAMP)
	@$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python bench/peers.py

clean:
	rm -rf $(VENV) corral.db corral.db-wal corral.db-shm .corral site tests/browser/node_modules
