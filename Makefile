# The whole set-up: `make run` and `make test` (see README.md).
BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_FUZZ ?= build-fuzz
JOBS       ?= $(shell nproc)
DEMO_MODEL ?= demo/mini-lite.gguf
FUZZ_SECONDS ?= 60
MOESTREAM  := $(BUILD)/tools/moestream

.PHONY: all deps build run demo test test-release test-asan test-fuzz clean

all: build

deps:
	@scripts/setup.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

$(DEMO_MODEL): | build
	@mkdir -p $(dir $(DEMO_MODEL))
	$(MOESTREAM) forge --preset mini-lite --out $(DEMO_MODEL) --seed 1

demo: build $(DEMO_MODEL)

run: demo
	@scripts/run_demo.sh $(MOESTREAM) $(DEMO_MODEL)

# Every test: the Release suite (ctest), the sanitizer suite and the bounded fuzz run.
test: test-release test-asan test-fuzz

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The sanitizer build at -O1 (ASan's advice): at -O0 its server suite alone took 10.5 of CI's 40 minutes.
test-asan: deps
	@cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DMOESTREAM_SANITIZE=ON -DMOESTREAM_CUDA=OFF >/dev/null
	@cmake --build $(BUILD_ASAN) -j $(JOBS) --target test_config test_storage test_model test_tools test_exact test_server moestream
	ctest --test-dir $(BUILD_ASAN) --output-on-failure -j $(JOBS) -R '^(config|storage|model|tools|exact|server|server_vocab|cli|convert|compare|model_cli|serve|ws)$$'

test-fuzz: deps
	@tests/fuzz/run_fuzz.sh $(BUILD_FUZZ) $(FUZZ_SECONDS) || { rc=$$?; [ $$rc -eq 77 ] && echo "fuzz: skipped"; [ $$rc -eq 77 ]; }

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
