# `make test` is all a fresh machine needs: it creates .venv, installs the dev extra with the
# pinned constraints, and runs the suite on the committed test data (tests/data/README.md); the
# tests that need the full data sets are skipped unless GMLP_SHARED_DATA names them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install test test-fast test-shared-data lint format demo-models demo-eval export serve bench bench-peers bench-perf-analyzer bench-pytriton profile soak docker loadtest constraints grpc-stubs settings-docs release audit timm-parity clean

$(BIN)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $@

install: $(BIN)/.installed

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The in-process tests only (no servers, processes or containers): a quick check while editing.
test-fast: install
	$(BIN)/python -m pytest -m unit -q $(PYTEST_ARGS)

# Only the tests that need the full data sets (the training runs); fails where they are absent.
test-shared-data: install
	$(BIN)/python -m pytest -m shared_data $(PYTEST_ARGS)

# The same checks as the pre-commit hooks (.pre-commit-config.yaml; `pre-commit install` once).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/codespell

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Export the committed demo checkpoints into the served-model repository ./models
demo-models: install
	$(BIN)/gmlp export checkpoints/cifar10-gmlp --out models/cifar10-gmlp --variants fp32,int8
	$(BIN)/gmlp export checkpoints/gutenberg-gmlp-mlm --out models/gutenberg-gmlp-mlm --variants fp32,int8

export: demo-models

# Evaluate the exported demo models (every variant) and record the figures in the model cards;
# needs the full data sets (GMLP_SHARED_DATA=DIR make demo-eval).
demo-eval: demo-models
	for v in fp32 int8; do \
	  $(BIN)/gmlp eval models/cifar10-gmlp --variant $$v --threads 2 --record checkpoints/cifar10-gmlp && \
	  $(BIN)/gmlp eval models/gutenberg-gmlp-mlm --variant $$v --threads 2 --record checkpoints/gutenberg-gmlp-mlm \
	  || exit 1; \
	done

serve: install
	$(BIN)/gmlp serve

# Benchmarks are programs of the checkout's benchmarks/ package (not in the wheel), run as
# `python -m benchmarks.NAME` from the repository root; docs/benchmarks.md lists them all.
# The limit every server is measured against: each task's unavoidable work in one process beside
# raw session.run, on the demo models in ./models (make demo-models; BENCH_ARGS to override).
BENCH_ARGS ?=
bench: install
	$(BIN)/python -m benchmarks.bare_pipeline $(BENCH_ARGS)

# gmlp-serve against LitServe, Ray Serve and BentoML (each installed into .bench-venvs/ by the
# benchmark) and raw ONNX Runtime; needs wrk. Rewrites "Against other servers" in docs/benchmarks.md.
bench-peers: install
	$(BIN)/python -m benchmarks.peers.run $(PEERS_ARGS)

# Triton's perf_analyzer 2.60 against gmlp-serve on ./models (make demo-models), REST and gRPC, closed
# and open loop; installs perf_analyzer into .bench-tools/ (a private glibc where the system's is
# older than 2.38). Rewrites "perf_analyzer" in docs/benchmarks.md.
bench-perf-analyzer: install
	$(BIN)/python -m benchmarks.perf_analyzer --models models $(PERF_ANALYZER_ARGS)

# The same against NVIDIA PyTriton on the demo classifier, 3 interleaved rounds (PyTriton in its own
# venv under .bench-venvs/). Rewrites "Against PyTriton" in docs/benchmarks.md.
bench-pytriton: install
	$(BIN)/python -m benchmarks.perf_analyzer --models models --against pytriton --rounds 3 \
		--data random --rate-fractions 0.6 $(PYTRITON_ARGS)

# Where a served request's CPU goes, at 32 clients (py-spy and per-thread CPU); needs wrk.
# /classify by default; PROFILE_ARGS='--task fill-mask' for /fill-mask.
profile: install
	$(BIN)/python -m benchmarks.profile $(PROFILE_ARGS)

# Minutes of mixed load at twice the sustainable rate on ./models (make demo-models): RSS, open
# fds, p99 and errors per minute (docs/reliability.md).
SOAK_ARGS ?= --minutes 10 --out soak.json --server-cpus 0
soak: install
	$(BIN)/python -m benchmarks.soak --repository models $(SOAK_ARGS)

docker:
	docker compose build

# Load-test a running service (make serve, or docker compose up) and write loadtest-report/
loadtest: install
	$(BIN)/gmlp loadtest --url http://127.0.0.1:8000 --users 1,4,16,32 --duration 30s --out loadtest-report

constraints: install
	( sed -n '1,3p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -vi '^gmlp' | sed 's/+cpu//' ) > constraints.new
	mv constraints.new constraints.txt

# Regenerate the committed gRPC stubs of service/v2/proto/ from grpc_predict_v2.proto (the serving
# image has no grpcio-tools); tests/service/v2/test_v2_grpc.py fails when they are stale.
grpc-stubs: install
	$(BIN)/python scripts/grpc_stubs.py

# Rewrite docs/service.md's settings tables from the fields of service/settings.py (their groups and
# descriptions); tests/service/test_config.py fails when the committed tables are stale.
settings-docs: install
	$(BIN)/python -m scripts.settings_docs

# The wheel of the version in pyproject.toml, into dist/, once CHANGELOG.md has its dated section
# (`## [X.Y.Z] - YYYY-MM-DD`): no release goes out without its notes. `python -m build` where
# installed (an isolated build), else pip's.
release: install
	$(BIN)/python -c "import re, sys, tomllib; \
	  v = tomllib.load(open('pyproject.toml', 'rb'))['project']['version']; \
	  found = re.search(r'^## \[' + re.escape(v) + r'\] - \d{4}-\d{2}-\d{2}$$', open('CHANGELOG.md').read(), re.M); \
	  sys.exit(None if found else f'CHANGELOG.md has no section \"## [{v}] - YYYY-MM-DD\" for version {v}')"
	if $(BIN)/python -c "import build" 2>/dev/null; then $(BIN)/python -m build --wheel --outdir dist .; \
	else $(BIN)/python -m pip wheel --no-deps --wheel-dir dist .; fi

# Known vulnerabilities of the pinned serving install (what the runtime image installs): a fresh
# venv with `pip install -c constraints.txt .[serve]`, its packages checked by pip-audit (in a venv
# of its own, so that its dependencies are not audited) against PyPI's vulnerability data;
# AUDIT_SERVICE=osv asks OSV instead. Fails when a pinned package has a known vulnerability or could
# not be checked (--strict: unreachable vulnerability data is not a pass).
AUDIT_VENV ?= .venv-audit
AUDIT_SERVICE ?= pypi
audit:
	test -x $(AUDIT_VENV)/serve/bin/python || $(PYTHON) -m venv $(AUDIT_VENV)/serve
	$(AUDIT_VENV)/serve/bin/python -m pip install -q -c constraints.txt ".[serve]"
	test -x $(AUDIT_VENV)/tool/bin/pip-audit || \
	  ( $(PYTHON) -m venv $(AUDIT_VENV)/tool && $(AUDIT_VENV)/tool/bin/python -m pip install -q pip-audit )
	$(AUDIT_VENV)/serve/bin/python -m pip freeze | grep -vi '^gmlp' > $(AUDIT_VENV)/serve-requirements.txt
	$(AUDIT_VENV)/tool/bin/pip-audit --vulnerability-service $(AUDIT_SERVICE) --no-deps --disable-pip --strict \
	  --desc on -r $(AUDIT_VENV)/serve-requirements.txt

# Optional: parity against timm's own gMLP. timm needs torchvision, which imports only beside
# torch 2.14.1 (a 5.5 GB CUDA build that runs on CPU), so it lives in a separate venv.
timm-parity:
	test -x .venv-timm/bin/python || $(PYTHON) -m venv .venv-timm
	.venv-timm/bin/python -m pip install -q torch==2.14.1 torchvision==0.29.1 timm safetensors numpy pytest onnx
	PYTHONPATH=. .venv-timm/bin/python -m pytest -p no:cacheprovider -s -m timm tests/model/test_timm_import.py

clean:
	rm -rf $(VENV) .venv-timm .venv-audit .bench-venvs .pytest_cache .ruff_cache *.egg-info
