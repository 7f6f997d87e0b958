# The two set-up commands are `make run` and `make test` (README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
REDIS_URL ?= redis://127.0.0.1:6379/0
STAMP := $(VENV)/.installed

.PHONY: bytecode screenshots run test test-e2e test-long test-postgres test-fast bench lint install install-gpu-wgsl install-gpu-cuda lavapipe redis chromium superuser clean

$(STAMP): requirements.txt pyproject.toml setup.py $(wildcard apps/*/*.c core/*/*.c)  # the C extensions build at install
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

## The project's own modules compiled to __pycache__ once, up front: a node starts five Python
## processes, and where PYTHONDONTWRITEBYTECODE is set (CI images often set it) each one would
## otherwise compile every module it imports from source again (~0.3 s of CPU apiece).
SOURCES := apps core cli tenzro_site testkit bench
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j0 $(SOURCES) > /dev/null

## Optional GPU backends (a default install carries neither): WGSL through wgpu on any Vulkan,
## Metal or D3D12 driver; CUDA through CuPy on an NVIDIA driver (core/experts/gpu/).
install-gpu-wgsl: $(VENV)/.installed-gpu-wgsl
$(VENV)/.installed-gpu-wgsl: requirements-gpu-wgsl.txt $(STAMP)
	$(BIN)/pip install --quiet -r requirements-gpu-wgsl.txt
	touch $@

install-gpu-cuda: install
	$(BIN)/pip install --quiet -r requirements-gpu-cuda.txt

## Mesa's lavapipe: a Vulkan driver on the CPU, on which the tests run the WGSL backend.
lavapipe:
	scripts/ensure-lavapipe.sh

redis:
	REDIS_URL=$(REDIS_URL) scripts/ensure-redis.sh

chromium:
	scripts/ensure-chromium.sh

## Start one node with the embedded defaults (SQLite in var/node, local Redis db 0).
run: install redis bytecode
	REDIS_URL=$(REDIS_URL) $(BIN)/tenzro node run

## The whole test suite: unit, real multi-process nodes, and the dashboard in chromium, on
## TEST_WORKERS pytest-xdist workers (whole files per worker: a module's shared nodes start once;
## every worker but the first gets a Redis server of its own, testkit/xdist_redis.py).
TEST_WORKERS ?= 2
## The WGSL backend runs too, on lavapipe (TENZRO_TEST_REQUIRE_WGSL: an error, not a skip, if it cannot);
## the CUDA tests skip where no NVIDIA device exists, and the summary says why.
test: install install-gpu-wgsl lavapipe chromium bytecode
	REDIS_URL=redis://127.0.0.1:6379/15 scripts/ensure-redis.sh
	TENZRO_TEST_REQUIRE_WGSL=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -p testkit.xdist_redis

## Only the multi-process tests (real nodes on loopback: the walkthrough, the fault suite, network
## conditions, the peer door as an outsider…), on the same workers; `make test` runs them too.
test-e2e: install install-gpu-wgsl lavapipe chromium bytecode
	REDIS_URL=redis://127.0.0.1:6379/15 scripts/ensure-redis.sh
	TENZRO_TEST_REQUIRE_WGSL=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -p testkit.xdist_redis -m e2e

## The long runs CI has no time for (~19 min, two workers): the restart loop with 20 restarts, three runs
## over, beside a node running 10 minutes with its peer killed and restarted twice (no ERROR in its log).
test-long: install bytecode
	REDIS_URL=redis://127.0.0.1:6379/15 scripts/ensure-redis.sh
	TENZRO_TEST_RESTARTS=20 TENZRO_TEST_RESTART_RUNS=3 TENZRO_TEST_LOG_RUN_S=600 $(BIN)/python -m pytest -n 2 \
		--dist loadfile -p testkit.xdist_redis tests/e2e/test_restart_loop.py tests/e2e/test_quiet_logs.py

## Photographs of every dashboard page at 1280 px into docs/screenshots/, taken in a real browser on a
## three-node network carrying traffic (the browser tests write 1280 and 390 px ones of every page they
## visit to tests/e2e/screenshots/ on every run).
screenshots: install bytecode chromium
	REDIS_URL=redis://127.0.0.1:6379/15 scripts/ensure-redis.sh
	TENZRO_SCREENSHOTS_DIR=docs/screenshots $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile \
		-p testkit.xdist_redis -m browser tests/dashboard/test_tour.py tests/dashboard/test_pages_generate.py

## The database-touching in-process tests again on PostgreSQL (needs a server at POSTGRES_URL).
POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/tenzro
test-postgres: install
	REDIS_URL=redis://127.0.0.1:6379/15 scripts/ensure-redis.sh
	DATABASE_URL=$(POSTGRES_URL) REDIS_URL=redis://127.0.0.1:6379/15 $(BIN)/pytest -q tests/api tests/governance tests/catalog/test_api.py tests/worker tests/providers/test_services.py tests/generation/test_records.py

## Pure cores only (no services needed).
test-fast: install install-gpu-wgsl lavapipe bytecode
	TENZRO_TEST_REQUIRE_WGSL=1 $(BIN)/pytest -m "not e2e"

## Every benchmark in bench/ (forward and generate: five real nodes and a redis-server of their own,
## ~10 and ~8 min; load ~2 min; netem ~4 min; quiet ~9 min; wire_floor ~8 min), then
## bench/results/summary.md (bench/summary.py),
## or only some: `make bench BENCH="forward transport"`.
BENCH ?= $(filter-out report summary,$(basename $(notdir $(wildcard bench/[a-z]*.py))))
bench: install bytecode
	@for name in $(BENCH); do \
		echo "### $$name"; $(BIN)/python -m bench.$$name || exit 1; \
	done
	$(BIN)/python -m bench.summary

## Style and architecture: ruff, then the import contracts of pyproject.toml (import-linter).
lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

## An admin login. Without a terminal (a script, CI, a container) it takes DJANGO_SUPERUSER_USERNAME,
## DJANGO_SUPERUSER_PASSWORD and DJANGO_SUPERUSER_EMAIL (optional) instead of asking.
superuser: install
	@if [ -n "$$DJANGO_SUPERUSER_USERNAME" ] && [ -n "$$DJANGO_SUPERUSER_PASSWORD" ]; then \
		$(BIN)/python manage.py createsuperuser --noinput --email "$${DJANGO_SUPERUSER_EMAIL:-}"; \
	elif [ -t 0 ]; then \
		$(BIN)/python manage.py createsuperuser; \
	else \
		echo "make superuser: no terminal to ask on; set DJANGO_SUPERUSER_USERNAME and DJANGO_SUPERUSER_PASSWORD" \
			"(and DJANGO_SUPERUSER_EMAIL) to create the login without questions" >&2; exit 2; \
	fi

clean:
	rm -rf $(VENV) var .pytest_cache
