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

test: fetch
	$(BIN)/python -m pytest -q -ra --timeout 1200 --durations=15

clean:
	rm -rf $(VENV) .pytest_cache
