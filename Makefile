# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
FARM := $(VENV)/bin/farm
STAMP := $(VENV)/.installed
KEY ?= .keys/dev_ed25519.pem

.PHONY: demo test clean

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[tune,test,plot]'
	@touch $(STAMP)

# A real sweep on an embedded local Ray in CPU interpret mode, then verify and show the bundle, and
# write the run's report (its path is printed last).
demo: $(STAMP)
	@test -f $(KEY) || { echo "demo: no signing key at $(KEY); creating a local development key (not for production)"; \
		$(FARM) keygen $(KEY); }
	@run=artifacts/demo-$$(date -u +%Y%m%d-%H%M%S); \
	$(FARM) sweep search_spaces/softmax.yaml search_spaces/matmul.yaml --target interpret --trials 8 \
		--key $(KEY) --out $$run && \
	$(FARM) verify $$run/bundle --trust $(KEY).pub && \
	$(FARM) show $$run/bundle --trust $(KEY).pub && \
	$(FARM) report $$run

# Two phases (tests/conftest.py says which test goes where): the tests that neither start Ray nor
# time anything, in two processes; then, alone, the ones that do. Both run, whatever the first gives.
test: $(STAMP)
	@$(PY) -m pytest -q -n 2 --dist worksteal -m "not serial"; parallel=$$?; \
	$(PY) -m pytest -q -m serial; serial=$$?; \
	echo "make test: the parallel phase exited $$parallel, the serial phase $$serial"; \
	test $$parallel = 0 -a $$serial = 0

clean:
	rm -rf artifacts/demo-* .pytest_cache
