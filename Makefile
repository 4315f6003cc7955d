# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.12
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test fetch install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

fetch: $(STAMP)
	$(BIN)/specjax fetch

demo: fetch
	$(BIN)/specjax generate --chat --max-new-tokens 64 --prompt "Write a Python function that checks whether a number is prime."
	$(BIN)/specjax generate --chat --max-new-tokens 64 --method ngram --num-draft 4 --json \
		--prompt "Write a Python function that checks whether a number is prime."

# The suite runs in TEST_WORKERS pytest-xdist processes (2: the CPU CI host's cores). --dist loadfile keeps
# each test file, and so its module-scoped fixtures (one SmolLM2 load and compile), in one worker.
# TEST_WORKERS=0 runs it in this one process: do that on a GPU host, where each JAX process would take
# most of the GPU's memory. A test past 1200 s has its worker stopped (--timeout-method thread: a hang inside
# XLA never returns to Python for the signal method); a stopped or crashed worker costs only the test it was
# running (tests/xdist_recovery.py), never the run.
TEST_WORKERS ?= 2

test: fetch
	$(BIN)/python -m pytest -q -ra --timeout 1200 --timeout-method thread --durations=15 -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache
