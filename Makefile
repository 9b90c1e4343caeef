# space: `make run` installs what is missing, builds, and serves;
# `make test` runs the whole suite. See README.md.

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)

# The gVisor release space is tested with (internal/driver/gvisor.PinnedVersion
# must match; a test checks). Built once from the Go module proxy into the cache.
RUNSC_VERSION := v0.0.0-20260905035102-160fafc42237
# The patches in third_party/gvisor are applied to that source before the
# build; RUNSC_BUILD names the result by their digest (computed the same way
# by internal/driver/gvisor.BuildName), so changed patches make a new build.
# A features file next to the binary lists what they give (tar-stream: files
# are streamed into `runsc tar`), which the gvisor driver reads.
RUNSC_PATCHES := $(sort $(wildcard third_party/gvisor/*.patch))
RUNSC_BUILD   := $(RUNSC_VERSION)-$(shell cat /dev/null $(RUNSC_PATCHES) | sha256sum | cut -c1-12)
CACHE  ?= /var/cache/space
DATA   ?= /var/lib/space
LISTEN ?= 127.0.0.1:7070
RUNSC  := $(CACHE)/runsc-$(RUNSC_BUILD)/runsc
# mmdebstrap builds templates; QEMU, qemu-img, e2fsprogs and Debian's cloud
# kernel serve the qemu driver (its tests run in `make test`). postgresql's
# server binaries run the store's Postgres tests (a throwaway cluster per
# test binary, internal/store/pgtest; the package's own cluster is unused).
APT_PACKAGES := patch python3 mmdebstrap ca-certificates qemu-system-x86 qemu-utils e2fsprogs linux-image-cloud-amd64 postgresql
GOTEST_FLAGS ?= -count=1 -timeout 45m

.PHONY: all deps runsc build run test test-unit bench clean print-runsc-build

all: build

# deps installs the Debian packages space needs when they are missing.
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@command -v go >/dev/null || { echo "Go (>= 1.26) is required: /usr/local/go/bin/go not found"; exit 1; }

runsc: $(RUNSC)

$(RUNSC):
	@echo "building gVisor runsc $(RUNSC_BUILD) from the Go module proxy and third_party/gvisor (once; ~2-3 min)"
	@set -euo pipefail; \
	work=$$(mktemp -d); trap 'rm -rf "$$work"' EXIT; \
	src=$$(cd "$$work" && go mod download -json gvisor.dev/gvisor@$(RUNSC_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	test -d "$$src" || { echo "gvisor.dev/gvisor@$(RUNSC_VERSION) not downloaded"; exit 1; }; \
	cp -r "$$src"/. "$$work"; chmod -R u+w "$$work"; \
	for p in $(abspath $(RUNSC_PATCHES)); do echo "applying $$(basename $$p)"; patch -s -d "$$work" -p1 < "$$p"; done; \
	mkdir -p $(dir $(RUNSC)); \
	(cd "$$work" && CGO_ENABLED=0 go build -trimpath -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$(RUNSC_BUILD)" -o $(RUNSC).tmp ./runsc); \
	echo tar-stream > $(dir $(RUNSC))features; \
	mv $(RUNSC).tmp $(RUNSC)
	@$(RUNSC) --version | head -1

# print-runsc-build prints the cached runsc's build name (a test compares it
# with internal/driver/gvisor.BuildName).
print-runsc-build:
	@echo $(RUNSC_BUILD)

build:
	@mkdir -p bin
	CGO_ENABLED=0 go build -trimpath -o bin/space-agent ./cmd/space-agent
	CGO_ENABLED=0 go build -trimpath -o bin/space ./cmd/space

run: deps runsc build
	bin/space serve --data $(DATA) --cache $(CACHE) --listen $(LISTEN) --runsc $(RUNSC) --agent $(CURDIR)/bin/space-agent

# test runs everything: unit tests, the driver conformance suite against
# real runsc, and end-to-end tests through the HTTP API with real sandboxes.
# The end-to-end tests run alone, after the rest: beside the other
# packages' compiles, QEMU (TCG) VMs and sandbox tests on 2 cores, the
# server's memory watch ran too late for a fast allocation (the sandbox
# stopped, TestOOMKillsProcessNotSandbox) in 2 of 6 clean-clone runs.
test: deps runsc build
	export SPACE_RUNSC=$(RUNSC) SPACE_AGENT=$(CURDIR)/bin/space-agent SPACE_CACHE=$(CACHE); \
	go test $(GOTEST_FLAGS) $$(go list ./... | grep -v '/e2e$$') 2>&1 | tee /tmp/space-test.log; st=$${PIPESTATUS[0]}; \
	go test $(GOTEST_FLAGS) ./e2e/ 2>&1 | tee -a /tmp/space-test.log; [ $${PIPESTATUS[0]} = 0 ] || st=1; \
	(cd sdk/go && go test $(GOTEST_FLAGS) ./...) || st=1; \
	echo; grep -E '^(ok|FAIL|---|panic)' /tmp/space-test.log | grep -v '^--- PASS' | tail -40; \
	exit $$st

# test-unit runs the tests that need no sandbox.
test-unit:
	go test -short ./...

bench: deps runsc build
	SPACE_RUNSC=$(RUNSC) SPACE_AGENT=$(CURDIR)/bin/space-agent SPACE_CACHE=$(CACHE) \
		go run ./cmd/space-bench -out docs/PERF.md

clean:
	rm -rf bin
