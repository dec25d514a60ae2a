# Two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := models/demo-en-de
DEMO_SRC := models/demo-en-de-src

.PHONY: serve test lint typecheck unit install install-test demo perf-analyzer kserve-sdk clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The native decoding core (C++, serving/engine/_native): every install below builds it into the checkout
# (pyproject.toml's [tool.scikit-build]), again when its sources change.
NATIVE_SRC := CMakeLists.txt $(wildcard serving/engine/_native/*)

# The plain install: what `mtgate serve` needs (no torch, no tensorflow); `make serve` adds the convert extra below.
$(VENV)/.installed-runtime: pyproject.toml $(NATIVE_SRC) | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

# The converter without torch (onnx, nncf): builds the bundled demo package from its committed source.
$(VENV)/.installed-convert: pyproject.toml $(NATIVE_SRC) | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[convert]'
	touch $@

# The bundled demo model: git holds its source (opus-mt layout, fp16); the package (fp32 + int8, both runtimes,
# parity checked) is converted from it into $(DEMO) (not in git), again when the graphs or the package format change.
$(DEMO)/manifest.json: $(wildcard $(DEMO_SRC)/*) $(wildcard serving/package/*.py) converters/onnx_emitter.py converters/onnx_builder.py | $(VENV)/.installed-convert
	$(BIN)/mtgate convert $(DEMO_SRC) -o $(DEMO) --name demo-en-de --overwrite \
		$(if $(wildcard $(DEMO_SRC)/quality.json),--quality $(DEMO_SRC)/quality.json)

# Everything the suite needs: every extra (conversion with torch, batch, loadtest), transformers for parity, test tools.
$(VENV)/.installed-test: pyproject.toml $(NATIVE_SRC) | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: the browser test will be skipped"; }
	touch $@

# Triton's perf_analyzer, for its test (tests/serving/server/test_perf_analyzer.py), in a venv of its own: the binary the
# tritonclient 2.45.0 wheel ships, which needs libb64 (Debian's libb64-0d) and libcudart (the nvidia-cuda-runtime-cu12
# wheel; no GPU is used). Where it cannot be installed the suite goes on and that test skips, saying why.
PERF_VENV := .venv-perf
$(PERF_VENV)/.installed:
	@{ $(PYTHON) -m venv $(PERF_VENV) \
		&& $(PERF_VENV)/bin/pip install --quiet "tritonclient==2.45.0" nvidia-cuda-runtime-cu12 \
		&& { [ -e /lib/x86_64-linux-gnu/libb64.so.0d ] || { [ "$$(id -u)" = 0 ] \
			&& { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d >/dev/null 2>&1 \
				|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d >/dev/null; }; }; }; } \
		&& touch $@; } || echo "perf_analyzer not installed: its test will be skipped"

# The KServe Python SDK, for its test (tests/serving/server/test_kserve_sdk.py), in a venv of its own (its pins are not
# the server's); the test skips, saying why, where it could not be installed.
KSERVE_VENV := .venv-kserve
$(KSERVE_VENV)/.installed:
	@{ $(PYTHON) -m venv $(KSERVE_VENV) && $(KSERVE_VENV)/bin/pip install --quiet "kserve==0.21.0" && touch $@; } \
		|| echo "the KServe SDK not installed: its test will be skipped"

install: $(VENV)/.installed-runtime
install-test: $(VENV)/.installed-test
demo: $(DEMO)/manifest.json
perf-analyzer: $(PERF_VENV)/.installed
kserve-sdk: $(KSERVE_VENV)/.installed

serve: $(VENV)/.installed-runtime demo
	$(BIN)/mtgate serve

lint: $(VENV)/.installed-test
	$(BIN)/ruff check serving converters batch loadtest benchmarks tests models/recipe
	$(BIN)/mypy

unit: $(VENV)/.installed-test demo perf-analyzer kserve-sdk
	$(BIN)/python -m pytest -q

test: lint unit

clean:
	rm -rf $(VENV) $(PERF_VENV) $(KSERVE_VENV) build .pytest_cache .mypy_cache .ruff_cache
	rm -rf serving/engine/_native_core.*.so .cmake .ninja_deps .ninja_log .skbuild-info.json CMakeCache.txt CMakeFiles \
		CMakeInit.txt build.ninja cmake_install.cmake libnanobind-static.a
