# Quan — one static library (common/, a folder per subsystem) and four service binaries.
#
#   make            build everything (parallel: make -j2)
#   make deps       install the Debian packages the build, tests and local stack need
#   make up         install what is missing, build, start local infra + the four services and
#                   the gateway in front of them (port 10000, the console at /console/;
#                   QUAN_UP_PORT moves both) (TOPOLOGY=cluster: Redis Cluster, two PostgreSQL
#                   servers, a RabbitMQ cluster, two replicas of each service and the gateway;
#                   TOPOLOGY=sentinel: Redis as a master, a replica and three sentinels;
#                   deploy/local/up.sh)
#   make down       stop what `make up` started (any topology; TOPOLOGY= to pick one) and
#                   make observe's Prometheus
#   make observe    Debian's Prometheus on a free loopback port scraping make up's stack, with
#                   the alert rules of deploy/prometheus/ (data in .run/prometheus/)
#   make test       install what is missing, build, run unit + integration tests against
#                   freshly started servers (QUAN_TEST_ASAN=1: also the sanitized build;
#                   TOPOLOGY=cluster: the integration suites against the cluster topology,
#                   two replicas of each service behind a gateway)
#   make test-asan  unit tests built with ASan/LSan/UBSan
#   make fuzz       the libFuzzer targets of fuzz/ (clang, ASan + UBSan) into build-fuzz/fuzz/;
#                   integration-tests/fuzz.sh runs them (QUAN_TEST_FUZZ=1 make test: as a suite)
#   make chaos      install what is missing, build, run the chaos suite: a flash sale while one
#                   process or server is killed (kill -9) and started again, then the promises
#                   checked (integration-tests/chaos/; QUAN_TEST_CHAOS=1 make test: as a suite;
#                   TOPOLOGY=cluster: the faults of the cluster topology's parts;
#                   TOPOLOGY=sentinel: the Redis master killed under Sentinel)
#   make backup     a base backup of make up's PostgreSQL (its WAL is archived all along):
#                   deploy/local/backup.sh backup (TOPOLOGY=cluster: both servers)
#   make restore [TO='2026-12-07 14:30:05 UTC']
#                   the stack stopped (make down), PostgreSQL back to TO (default: the last WAL
#                   it has) from the newest base backup before it; claims then wait for:
#   make recover    quan-recover: Redis, the claim queue and the engines made consistent with
#                   the restored databases, then the bloom filter rebuilt (see
#                   deploy/local/README.md, "Backups and point-in-time restore")
#   make bench      benchmarks (not part of make test)
#   make soak       a leak test: 10 minutes of mixed load, memory, fds, connections and threads
#                   of every service sampled (SOAK_SECONDS, SOAK_INTERVAL; bench/soak.sh)
#   make image      the images deploy/k8s names (one per binary and the gateway), built with
#                   podman from deploy/Dockerfile on bases made from Debian's packages; prints
#                   their sizes (deploy/image.sh; no registry needed)
#   make format     clang-format the C sources
#
# up, test, bench, soak and chaos install the packages before anything is compiled: on a bare machine
# the headers pkg-config names below do not exist yet, so they build through a second make,
# which reads this file again once the packages are there.

CC       ?= gcc
SAN      ?=
BUILD    ?= build$(if $(SAN),-$(SAN))
OPT      ?= -O2

# PKGS: every library the Makefile links. libquan and the services link LIB_PKGS; libxlsxwriter
# only what writes workbooks with it (XLSX_USERS, below), so the services do not load it.
LIB_PKGS  := libevent libevent_pthreads hiredis libpq libcjson librabbitmq libcurl libzip expat libcrypto zlib libjwt
XLSX_PKGS := xlsxwriter
PKGS      := $(LIB_PKGS) $(XLSX_PKGS)
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(LIB_PKGS) 2>/dev/null)
XLSX_LIBS  := $(shell pkg-config --libs $(XLSX_PKGS) 2>/dev/null)

WARN     := -Wall -Wextra -Werror -Wstrict-prototypes -Wwrite-strings \
            -Wno-missing-field-initializers -Wshadow -Wformat=2
ASAN_FLAGS := -fsanitize=address -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# SAN=fuzz (build-fuzz/): clang, the library instrumented for libFuzzer's coverage as well; only
# the fuzz targets link libFuzzer itself (-fsanitize=fuzzer brings its main).
FUZZ_CC    ?= clang
FUZZ_FLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \
              -fno-omit-frame-pointer
SANFLAGS := $(if $(filter asan,$(SAN)),$(ASAN_FLAGS))$(if $(filter fuzz,$(SAN)),$(FUZZ_FLAGS))
ifeq ($(SAN),fuzz)
CC := $(FUZZ_CC)
endif
CFLAGS   ?= $(OPT) -g
# ccache when it is installed (deps.sh --test installs it; CCACHE= turns it off): sources this
# machine compiled once with the same flags, in any checkout (a CI clone, another branch), come
# from its cache, the same objects. The debug information names paths relative to the checkout,
# which is what lets a clone elsewhere share the cache.
CCACHE   ?= $(if $(shell command -v ccache 2>/dev/null),ccache)
DEBUG_PATHS := -fdebug-prefix-map=$(CURDIR)=.
export CCACHE_BASEDIR := $(CURDIR)
CFLAGS   += -std=gnu11 $(WARN) $(SANFLAGS) -pthread -MMD -MP
# common/ is one folder per subsystem (core, http, redis, pg, mq, sheet, coupon, outbound); each is
# on the include path, so a module is included by its name alone ("redis.h"), wherever it lives.
COMMON_DIRS := $(filter-out common/tests,$(patsubst %/,%,$(wildcard common/*/)))
CPPFLAGS += $(addprefix -I,$(COMMON_DIRS)) -Icommon/tests $(PKG_CFLAGS) -D_GNU_SOURCE
LDFLAGS  += $(SANFLAGS) -pthread
LDLIBS   += $(PKG_LIBS) -lm

COMMON_SRC := $(wildcard $(addsuffix /*.c,$(COMMON_DIRS)))
COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/%.o)
LIB        := $(BUILD)/libquan.a

SERVICES   := engine merchant-admin distribution settlement
BINS       := $(SERVICES:%=$(BUILD)/bin/quan-%)

TOOLS      := $(notdir $(wildcard tools/*))
TOOL_BINS  := $(TOOLS:%=$(BUILD)/bin/quan-%)

# Unit tests: common/tests/test_X.c -> build/tests/test_X;
# services/S/tests/test_X.c -> build/tests/S__test_X (linked with S's objects but main.c).
COMMON_TESTS := $(patsubst common/tests/%.c,$(BUILD)/tests/%,$(wildcard common/tests/test_*.c))
SVC_TESTS    := $(foreach t,$(wildcard services/*/tests/test_*.c),\
                  $(BUILD)/tests/$(word 2,$(subst /, ,$(t)))__$(notdir $(t:.c=)))
TEST_HELPERS := $(patsubst common/tests/%.c,$(BUILD)/tests/%,$(wildcard common/tests/helper_*.c))
TEST_BINS    := $(COMMON_TESTS) $(SVC_TESTS)

.PHONY: all lib tests deps up down observe backup restore recover test test-unit test-asan fuzz fuzz-targets chaos bench soak \
        image format format-check clean
all: $(BINS) $(TOOL_BINS)
lib: $(LIB)
tests: $(TEST_BINS) $(TEST_HELPERS)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(strip $(CCACHE) $(CC)) $(CPPFLAGS) $(CFLAGS) $(DEBUG_PATHS) -c $< -o $@

# Made anew each time: `ar r` would keep the objects of source files that are gone.
$(LIB): $(COMMON_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

# Each service: services/<name>/*.c linked with libquan.
# (% in a pattern rule's prerequisites is the stem, so object names go through a function.)
objs_of = $(patsubst %.c,$(BUILD)/%.o,$(1))
.SECONDEXPANSION:
# A tool may also link a service's modules (TOOL_LINK_<tool>: their sources, main.c left out).
TOOL_LINK_archive := $(wildcard services/engine/*.c)
$(BUILD)/tools/archive/%.o: CPPFLAGS += -Iservices/engine
TOOL_LINK_reconcile := $(wildcard services/engine/*.c)
$(BUILD)/tools/reconcile/%.o: CPPFLAGS += -Iservices/engine
TOOL_LINK_recover := $(wildcard services/engine/*.c)
$(BUILD)/tools/recover/%.o: CPPFLAGS += -Iservices/engine
$(BUILD)/bin/quan-%: $$(call objs_of,$$(wildcard services/$$*/*.c) $$(wildcard tools/$$*/*.c) \
                      $$(call not_main,$$(TOOL_LINK_$$*))) $(LIB)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB) $(LDLIBS)

# The sources that include <xlsxwriter.h>: quan-sheet-gen (bench sheets) and the unit tests that
# write sample workbooks. (A target-specific LDLIBS reaches its prerequisites too, but only the
# link rules read it.)
XLSX_USERS := $(BUILD)/bin/quan-sheet-gen $(BUILD)/tests/test_sheet \
              $(BUILD)/tests/distribution__test_taskrow
$(XLSX_USERS): LDLIBS += $(XLSX_LIBS)

$(BUILD)/tests/test_% $(BUILD)/tests/helper_%: $(BUILD)/common/tests/$$(notdir $$@).o $(LIB)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

svc_of = $(word 1,$(subst __, ,$(1)))
not_main = $(filter-out %/main.c,$(1))
$(BUILD)/tests/%: $$(call objs_of,services/$$(call svc_of,$$*)/tests/$$(word 2,$$(subst __, ,$$*)).c \
                   $$(call not_main,$$(wildcard services/$$(call svc_of,$$*)/*.c))) $(LIB)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB) $(LDLIBS)

# Fuzz targets: fuzz/fuzz_X.c -> build-fuzz/fuzz/fuzz_X (SAN=fuzz), linked with libquan and
# with the objects FUZZ_LINK_X names (a service's modules but main.c).
FUZZ_TARGETS := $(patsubst fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard fuzz/fuzz_*.c))
FUZZ_LINK_envelope := $(call not_main,$(wildcard services/engine/*.c))
fuzz-targets: $(FUZZ_TARGETS)
$(BUILD)/fuzz/fuzz_%: $(BUILD)/fuzz/fuzz_%.o $$(call objs_of,$$(FUZZ_LINK_$$*)) $(LIB)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $(filter %.o,$^) $(LIB) $(LDLIBS)

# A sub-make for the build, in parallel unless the caller chose its own -j.
JOBS     ?= $(shell nproc 2>/dev/null || echo 2)
SUBMAKE   = $(MAKE) --no-print-directory $(if $(findstring -j,$(MAKEFLAGS)),,-j$(JOBS))

# single (the default), cluster or sentinel; make down without it stops whichever is up.
TOPOLOGY ?=

deps:
	deploy/local/deps.sh
up:
	deploy/local/deps.sh
	+$(SUBMAKE) all
	deploy/local/up.sh $(TOPOLOGY)
down:
	deploy/local/down.sh $(TOPOLOGY)
observe:
	deploy/local/deps.sh
	deploy/local/observe.sh
# make up's stores (either topology).
INFRA_DIR = .run$(if $(filter cluster,$(TOPOLOGY)),/cluster)/infra
backup:
	deploy/local/backup.sh backup $(INFRA_DIR)
restore:
	deploy/local/backup.sh restore $(INFRA_DIR) $(if $(TO),"$(TO)")
recover:
	+$(SUBMAKE) all
	set -e; . $(INFRA_DIR)/env; export QUAN_LUA_DIR=lua-scripts; \
	$(BUILD)/bin/quan-recover $(RECOVER_ARGS); $(BUILD)/bin/quan-bloom-rebuild
test:
	deploy/local/deps.sh --test $(if $(filter 1,$(QUAN_TEST_FUZZ)),--fuzz)
	+$(SUBMAKE) all tests
	+$(if $(filter 1,$(QUAN_TEST_ASAN)),$(SUBMAKE) SAN=asan OPT=-O1 all tests)
	+$(if $(filter 1,$(QUAN_TEST_FUZZ)),$(SUBMAKE) SAN=fuzz OPT=-O1 fuzz-targets)
	$(if $(filter cluster,$(TOPOLOGY)),QUAN_TOPOLOGY=cluster )integration-tests/run.sh
test-unit: all tests
	integration-tests/run.sh --unit-only
test-asan:
	+$(SUBMAKE) SAN=asan OPT=-O1 all tests
	QUAN_BUILD=build-asan integration-tests/run.sh --unit-only
# clang is installed only here (and for QUAN_TEST_FUZZ=1): make up and make test do without it.
fuzz:
	deploy/local/deps.sh --fuzz
	+$(SUBMAKE) SAN=fuzz OPT=-O1 fuzz-targets
chaos:
	deploy/local/deps.sh
	+$(SUBMAKE) all
	$(if $(filter cluster sentinel,$(TOPOLOGY)),QUAN_TOPOLOGY=$(TOPOLOGY) )integration-tests/chaos/run.sh
bench:
	deploy/local/deps.sh
	+$(SUBMAKE) all
	bench/run.sh
soak:
	deploy/local/deps.sh
	+$(SUBMAKE) all
	bench/soak.sh
# Compiles inside the image's build stage, not here: nothing of this tree's build is used.
image:
	deploy/image.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')
format-check:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-*

# Objects reached only through the pattern rules above count as intermediate files, which
# make deletes after the first build (so the next build compiled everything again).
ALL_OBJS := $(COMMON_OBJ) $(call objs_of,$(wildcard services/*/*.c services/*/tests/*.c tools/*/*.c \
              common/tests/*.c fuzz/*.c))
.SECONDARY: $(ALL_OBJS)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
