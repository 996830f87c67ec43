# prefixd developer targets. Requires Go 1.26; `make test` is what CI runs.

GO ?= go

# What the tests need, installed by `make deps` only when missing
# (scripts/test-deps.sh). Debian packages: python3-xxhash is the C reference
# XXH3 that the block-hash tests compare against; python3-zmq and
# python3-msgpack run internal/testsupport/pypub, the libzmq publisher the
# interop tests talk to; jq runs docs/status.md's example
# (internal/testsupport/doctest).
TEST_APT_PACKAGES ?= python3-xxhash python3-zmq python3-msgpack jq
# npm packages the tests run, each directory's package-lock.json installed
# with npm ci (node and npm from Debian's nodejs and npm when missing): the
# official openai client that internal/proxy's TestOpenAINpmClient runs
# against prefixd proxy.
TEST_NPM_DIRS ?= internal/proxy/testdata/openai-npm

# Set VERSION to stamp `prefixd version` and `prefixd-bench version`
# (otherwise they report the module version the toolchain records, or "dev").
VERSION ?=
LDFLAGS := $(if $(VERSION),-X main.version=$(VERSION))
# Record the git revision in the binaries even where GOFLAGS says
# -buildvcs=false; set BUILDVCS=false to build outside a usable checkout.
BUILDVCS ?= auto
GOBUILD = $(GO) build -buildvcs=$(BUILDVCS) -ldflags "$(LDFLAGS)"

# Benchmarks: `make bench BENCH=Match BENCHTIME=2s`.
BENCH ?= .
BENCHTIME ?= 1s

# Fuzzing: each entry is package:FuzzTarget; `make fuzz FUZZTIME=5m`.
FUZZ_TARGETS ?= ./events/wire:FuzzDecode ./indexer:FuzzLookup ./events/zmtp:FuzzStream ./internal/sim/mocker:FuzzTokenize ./internal/sim/mocker:FuzzGenerationRequest ./internal/leaf/jsonlex:FuzzLexer ./internal/apiserver:FuzzDecode ./internal/apiserver:FuzzDecodeSnapshot
FUZZTIME ?= 20s

# Pinned linter: the newest staticcheck release that runs cleanly on Go 1.26.
STATICCHECK_VERSION := v0.8.2

.PHONY: all build deps test bench bench-index bench-routing bench-replicas lint fuzz demo index-demo soak clean

all: build

# bin/prefixd is the daemon and what operators run beside it (what the image
# ships); bin/prefixd-bench is the benchmark lab (routing, index, index-demo,
# soak), which links gonum/plot, its fonts and the Mooncake trace.
build:
	$(GOBUILD) -o bin/prefixd ./cmd/prefixd
	$(GOBUILD) -o bin/prefixd-bench ./cmd/prefixd-bench

deps:
	scripts/test-deps.sh $(addprefix --npm ,$(TEST_NPM_DIRS)) $(TEST_APT_PACKAGES)

# go test's events go through testprogress (internal/testsupport/testprogress):
# each package's result line as it finishes, the whole output of a failed
# test, and every 20 s a line naming the packages still running. pipefail
# keeps go test's own exit status; testprogress fails too on any failure.
TESTPROGRESS = $(GO) run ./internal/testsupport/testprogress

# go test starts packages in the order they are named, TEST_PROCS at once
# (builds and runs). The slowest are named first, so that none of them
# starts last and runs alone while the other cores idle; `./...` adds the
# rest once each. A stale order only costs time (a package that no longer
# exists fails the run). Twice as many packages as cores: much of a
# package's time is waiting (etcd leases, replay deadlines, handshake
# timeouts, linking), and the waits of one fill with another's work (209 s
# instead of 284 s on 2 cores). The tests that call t.Parallel: four of
# them at a time in a package, whatever the core count.
TEST_FIRST ?= ./indexer ./internal/sim/routing ./internal/sim/demo ./internal/proxy ./internal/apiserver \
	./internal/sim/indexbench ./internal/daemon ./deploy ./events/stream ./internal/testsupport/doctest \
	./cmd/prefixd-bench ./catalog/etcdstore ./cmd/prefixd
TEST_PROCS ?= $(shell echo $$(( $$(getconf _NPROCESSORS_ONLN) * 2 )))
# A package's whole run, and so the end-to-end tests' own deadline
# (testsupport.Context): past go test's 10 minutes, so that the suite
# still passes with two or three of it running at once on 2 cores.
TEST_TIMEOUT ?= 20m
TEST_PARALLEL ?= 4

test: private SHELL := /bin/bash
test: deps
	$(GO) vet ./...
	set -o pipefail; $(GO) test -race -count=1 -p $(TEST_PROCS) -parallel $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) -json $(TEST_FIRST) ./... | $(TESTPROGRESS)
	# The portable token reader, as on platforms without scanBlocks.
	$(GO) vet -tags purego ./internal/leaf/jsonlex
	set -o pipefail; $(GO) test -race -count=1 -json -tags purego ./internal/leaf/jsonlex | $(TESTPROGRESS)

bench:
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchmem -benchtime=$(BENCHTIME) -count=1 ./...

# Routing quality on the Mooncake trace (docs/benchmarks.md): every policy at
# six load levels and prefixd's overlap weight; the report and SVG charts go
# to docs/bench/routing. About 20 minutes on 2 cores.
ROUTING_FLAGS ?= --weights 0.5,1,2,4
bench-routing:
	$(GO) run ./cmd/prefixd-bench routing $(ROUTING_FLAGS) --out docs/bench/routing

# The same trace routed by N replicas that share nothing but the engines
# (docs/benchmarks.md#replicas): each its own bookings and index. The report
# and charts go to docs/bench/replicas.
REPLICAS_FLAGS ?= --policies least-loaded,prefixd,oracle --speedups 1,4,8,16 --replicas 1,2,4,8
bench-replicas:
	$(GO) run ./cmd/prefixd-bench routing $(REPLICAS_FLAGS) --out docs/bench/replicas

# The index benchmark's full sweep (Dynamo's mooncake_bench shape): the
# Mooncake trace through 64 mock engines, offered load swept at each core
# count; `make bench-index BENCH_INDEX_FLAGS='--cpu 1,4,8'`. The report,
# its JSON and SVG charts go to docs/bench/index. `make bench` runs its
# short form (BenchmarkMooncake).
BENCH_INDEX_FLAGS ?=
bench-index:
	$(GO) run ./cmd/prefixd-bench index $(BENCH_INDEX_FLAGS) --out docs/bench/index

lint:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

# go test fuzzes one target per invocation, so loop. A listed target that does
# not exist is an error, not a silent pass.
fuzz:
	@set -e; for entry in $(FUZZ_TARGETS); do \
		pkg=$${entry%%:*}; target=$${entry#*:}; \
		if [ "$$pkg" = "$$entry" ] || [ -z "$$target" ]; then \
			echo "fuzz: bad FUZZ_TARGETS entry '$$entry' (want package:FuzzTarget)" >&2; exit 2; \
		fi; \
		if ! $(GO) test -list="^$$target\$$" "$$pkg" | grep -qx "$$target"; then \
			echo "fuzz: no fuzz target $$target in $$pkg" >&2; exit 1; \
		fi; \
		echo "fuzz: $$pkg $$target for $(FUZZTIME)"; \
		$(GO) test -run='^$$' -fuzz="^$$target\$$" -fuzztime=$(FUZZTIME) "$$pkg"; \
	done

demo:
	$(GO) run ./cmd/prefixd demo

index-demo:
	$(GO) run ./cmd/prefixd-bench index-demo

# Soak (not in CI): `make soak SOAK_DURATION=30m`; the samples go to soak.csv.
# The daemon under load is bin/prefixd, built first, in its own process.
SOAK_DURATION ?= 10m
soak:
	$(GOBUILD) -o bin/prefixd ./cmd/prefixd
	$(GO) run ./cmd/prefixd-bench soak --prefixd bin/prefixd --duration $(SOAK_DURATION) --csv soak.csv

clean:
	rm -rf bin
