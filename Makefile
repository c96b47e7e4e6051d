# Two commands are all the set-up there is: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
NFT    := /usr/sbin/nft

.PHONY: run test lint docs bench clean

$(STAMP): pyproject.toml | $(NFT)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing corral and its dependencies into $(VENV) ..."
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# The partition chaos test cuts a network namespace off with nftables. As root, install it
# when it is missing (quietly; once there, this is a no-op); otherwise that test skips.
$(NFT):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing nftables (for the partition chaos test) ..."; \
		export DEBIAN_FRONTEND=noninteractive; \
		{ apt-get install -y -qq nftables || \
			{ apt-get update -qq && apt-get install -y -qq nftables; }; } >/dev/null 2>&1 || \
			echo "could not install nftables: the partition chaos test will skip"; \
	fi

run: $(STAMP)
	@echo "corral: migrating the embedded database (./corral.db) ..."
	@$(BIN)/corral db upgrade
	@echo "corral: starting on SQLite with the process executor; state in ./.corral/"
	@$(BIN)/corral serve --demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples docs
	$(BIN)/ruff format --check src tests bench examples docs
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site, into site/ (git-ignored); --strict turns every warning into an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint docs
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/retry_storm.py

clean:
	rm -rf $(VENV) corral.db corral.db-wal corral.db-shm .corral site
