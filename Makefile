# The two commands of the README: `make run` and `make test`. Both install what is missing,
# build, and then run.
JOBS ?= $(shell nproc)
BUILD := build/release
ASAN_BUILD := build/asan

.PHONY: all deps build run test test-release test-asan test-full bench bench-peers format clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS)

run: build
	$(BUILD)/tools/attn demo

test: deps test-release test-asan

test-release: build
	ctest --preset release -j $(JOBS)

test-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

# The full case sweep (slow): the same tests over every case list.
test-full: build
	ATTN_FULL_SWEEP=1 ctest --preset release -j $(JOBS)

bench: build
	$(BUILD)/bench/attn_bench

format:
	@git ls-files '*.cpp' '*.hpp' | xargs clang-format -i

clean:
	rm -rf build
