# tests/emu/emu.mk — run the cuda backend's code on the CPU (included by the
# Makefile).
#
#   make test-emu     build the GPU test programs against the CUDA emulator
#                     (tests/emu/) and run them: tests/gpu/test_cuda_ops.c and
#                     test_cuda_model.c with --emu, test_cuda_comm.c with
#                     --no-bench; and echo-generate / echo-bench built the same
#                     way through tests/emu/cli-smoke.sh. Needs no GPU and no
#                     CUDA toolkit.
#
# The kernel sources (kernels/cuda/*.cu, comm/codec/*.cu) are compiled unmodified
# as C++17 after tests/emu/translate.py rewrites their `<<<...>>>` launches
# and `extern __shared__` arrays; every library C source is rebuilt with
# -DECHO_HAVE_CUDA=1 against tests/emu/include (cuda_runtime.h, cuda_bf16.h,
# mma.h, cublasLt.h, nccl.h are the emulator's; nothing comes from a CUDA
# toolkit). Everything is built with ASan + UBSan, so an out-of-bounds
# device access aborts with a report. Products go to $(BUILD)/emu/.
#
# ECHO_EMU_SMS sets the emulated device's multiprocessor count (comm/ and
# attention's split-K size grids by it; 132, an H100's, by default):
# EMU_SMS below keeps the comm grids small enough to emulate.

EMU_DIR      := $(BUILD)/emu
EMU_OPT      ?= -O2
EMU_SAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
EMU_INC      := -Itests/emu/include
EMU_NCCL_SRC ?= tests/emu/nccl_emu.cpp
EMU_SMS      ?= 4
# test_cuda_comm.c runs in full (counts up to 2^20 + 5 at 2-4 ranks, ~990
# cases): about 4 minutes emulated, beside ops + model (~2.5 minutes).
EMU_COMM_ARGS ?= --no-bench
EMU_CFLAGS   := -std=c11 $(EMU_OPT) -g $(WARN) -D_GNU_SOURCE -pthread -MMD -MP -I. $(EMU_INC) -DECHO_HAVE_CUDA=1 \
                $(PKG_CFLAGS) $(EMU_SAN)
# The emulator's own C++ (tests/emu/*.cpp) builds with the project's warnings.
EMU_CXXFLAGS := -std=c++17 $(EMU_OPT) -g $(WARN) -pthread -MMD -MP -I. $(EMU_INC) -Itests/emu $(EMU_SAN)
# The translated .cu files are device code written for nvcc: as host C++
# they trip warnings nvcc does not give (unused static helpers of other
# files, parameters only some instantiations read, `#pragma unroll`), and
# they move data through vector types (uint4, float4 over bf16 rows) the way
# CUDA code does, which g++ may only compile as meant without strict
# aliasing.
# The headers of kernels/cuda/ hold device code too (cuda_block_sum's static
# __shared__ variables): translated like the .cu files, into gen/, which is
# searched before the source tree.
EMU_GEN_HDRS := $(patsubst %,$(EMU_DIR)/gen/%,$(wildcard kernels/cuda/*.h))
EMU_KERN_CXXFLAGS := -std=c++17 $(EMU_OPT) -g -fno-strict-aliasing -Wall -Wextra -Werror -Wno-unknown-pragmas \
                     -Wno-unused-function \
                     -Wno-unused-parameter -Wno-unused-variable -pthread -MMD -MP -I$(EMU_DIR)/gen -I. $(EMU_INC) \
                     -DECHO_HAVE_CUDA=1 $(EMU_SAN)

EMU_LIB_OBJ := $(LIB_C_SRC:%.c=$(EMU_DIR)/obj/%.o) $(LIB_CC_SRC:%.cc=$(EMU_DIR)/obj/%.o) \
               $(CU_SRC:%.cu=$(EMU_DIR)/obj/%.o)
EMU_RT_OBJ  := $(EMU_DIR)/obj/tests/emu/emu.o $(EMU_DIR)/obj/tests/emu/runtime.o \
               $(EMU_DIR)/obj/tests/emu/cublaslt.o $(EMU_NCCL_SRC:%.cpp=$(EMU_DIR)/obj/%.o)
EMU_LIB     := $(EMU_DIR)/libecho-emu.a
EMU_TESTS   := $(EMU_DIR)/gpu_test_cuda_ops $(EMU_DIR)/gpu_test_cuda_model $(EMU_DIR)/gpu_test_cuda_comm
EMU_LDLIBS  := $(PKG_LIBS) $(if $(LIB_CC_SRC),$(shell pkg-config --libs sentencepiece 2>/dev/null || echo -lsentencepiece)) \
               $(XGR_LIB) -lstdc++ -lm -pthread

# Rebuild when the flags change (another EMU_OPT in the same BUILD). A rule,
# not a $(shell ...), so builds that do not ask for emu targets touch nothing.
EMU_FLAGS_STAMP := $(EMU_DIR)/.flags
EMU_FLAGS_LINE  := $(EMU_CFLAGS) | $(EMU_KERN_CXXFLAGS) | $(EMU_CXXFLAGS)
$(EMU_FLAGS_STAMP): emu-force
	@mkdir -p $(dir $@)
	@echo '$(EMU_FLAGS_LINE)' | cmp -s - $@ || echo '$(EMU_FLAGS_LINE)' > $@
emu-force:

.PHONY: test-emu emu-build emu-force
.PRECIOUS: $(EMU_DIR)/gen/%.cpp $(EMU_DIR)/gen/%.h
emu-build: $(EMU_TESTS)

$(EMU_DIR)/obj/%.o: %.c $(EMU_FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) -c $< -o $@

$(EMU_DIR)/obj/%.o: %.cc $(EMU_FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 $(EMU_OPT) -g $(WARN) -pthread -MMD -MP -I. $(EMU_SAN) \
	  $(shell pkg-config --cflags sentencepiece 2>/dev/null) -c $< -o $@

# grammar/ wraps xgrammar (server/ links it, so the emulated echo-serve does)
$(EMU_DIR)/obj/grammar/%.o: grammar/%.cc $(EMU_FLAGS_STAMP) | $(XGR_LIB)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 $(EMU_OPT) -g $(WARN) -pthread -MMD -MP -I. $(EMU_SAN) $(XGR_CFLAGS) -c $< -o $@

$(EMU_DIR)/obj/tests/emu/%.o: tests/emu/%.cpp $(EMU_FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(EMU_DIR)/gen/%.cpp: %.cu tests/emu/translate.py
	@mkdir -p $(dir $@)
	python3 tests/emu/translate.py $< $@

$(EMU_DIR)/gen/%.h: %.h tests/emu/translate.py
	@mkdir -p $(dir $@)
	python3 tests/emu/translate.py $< $@

$(EMU_DIR)/obj/%.o: $(EMU_DIR)/gen/%.cpp $(EMU_FLAGS_STAMP) $(EMU_GEN_HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_KERN_CXXFLAGS) -c $< -o $@

$(EMU_LIB): $(EMU_LIB_OBJ) $(EMU_RT_OBJ)
	rm -f $@ && ar rcs $@ $^

$(EMU_DIR)/gpu_test_%: $(EMU_DIR)/obj/tests/gpu/test_%.o $(EMU_LIB)
	$(CXX) $(EMU_SAN) $^ -o $@ $(EMU_LDLIBS)

# The command-line programs on the emulated device, for tests/emu/cli-smoke.sh
# (echo-generate --device cuda over both transports and with graphs,
# echo-bench forward's cuda measurements).
EMU_PROGS := $(EMU_DIR)/bin/echo-generate $(EMU_DIR)/bin/echo-bench $(EMU_DIR)/bin/echo-serve
EMU_BENCH_OBJ := $(BENCH_SRC:%.c=$(EMU_DIR)/obj/%.o)
$(EMU_DIR)/bin/echo-bench: $(EMU_DIR)/obj/tools/echo_bench.o $(EMU_DIR)/obj/tools/cli.o $(EMU_BENCH_OBJ) $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_SAN) $^ -o $@ $(EMU_LDLIBS) $(if $(EMU_BENCH_OBJ),$(CURL_LIBS))
$(EMU_DIR)/bin/echo-%: $(EMU_DIR)/obj/tools/echo_%.o $(EMU_DIR)/obj/tools/cli.o $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_SAN) $^ -o $@ $(EMU_LDLIBS)

# The emulator's own checks (tests/emu/selftest.cpp): CUDA semantics the
# kernels rely on, and misuse that must abort or fail.
# selftest_translated.cu goes through translate.py like the product's kernels.
$(EMU_DIR)/selftest: $(EMU_DIR)/obj/tests/emu/selftest.o $(EMU_DIR)/obj/tests/emu/selftest_translated.o $(EMU_LIB)
	$(CXX) $(EMU_SAN) $^ -o $@ $(EMU_LDLIBS)

$(EMU_DIR)/obj/tests/emu/selftest.o: tests/emu/selftest.cpp $(EMU_FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_KERN_CXXFLAGS) -c $< -o $@

# Every program runs even when one fails; ops and model run one after the
# other beside comm (two jobs: the CI machines have two cores). The status
# is the worst; each program's output is in $(EMU_DIR)/*.log.
test-emu: $(EMU_TESTS) $(EMU_DIR)/selftest $(EMU_PROGS)
	@$(EMU_DIR)/selftest > $(EMU_DIR)/selftest.log 2>&1 || { cat $(EMU_DIR)/selftest.log; exit 1; }; tail -n 1 $(EMU_DIR)/selftest.log
	@echo "== tests/emu/cli-smoke.sh $(EMU_DIR)/bin"; tests/emu/cli-smoke.sh $(EMU_DIR)/bin > $(EMU_DIR)/cli.log 2>&1; \
	  rc=$$?; grep -v '^PASS' $(EMU_DIR)/cli.log; [ $$rc = 0 ] || exit 1
	@echo "== $(EMU_DIR)/gpu_test_cuda_ops --emu; gpu_test_cuda_model --emu; ECHO_EMU_SMS=$(EMU_SMS) gpu_test_cuda_comm $(EMU_COMM_ARGS)"
	@start=$$(date +%s); \
	( ECHO_EMU_SMS=$(EMU_SMS) $(EMU_DIR)/gpu_test_cuda_comm $(EMU_COMM_ARGS) > $(EMU_DIR)/comm.log 2>&1; \
	  echo $$? > $(EMU_DIR)/comm.rc ) & \
	$(EMU_DIR)/gpu_test_cuda_ops --emu > $(EMU_DIR)/ops.log 2>&1; ops=$$?; \
	$(EMU_DIR)/gpu_test_cuda_model --emu > $(EMU_DIR)/model.log 2>&1; model=$$?; \
	wait; comm=$$(cat $(EMU_DIR)/comm.rc); fail=0; \
	for t in ops:$$ops model:$$model comm:$$comm; do \
	  n=$${t%%:*}; rc=$${t#*:}; \
	  printf '%-6s exit %s: %s PASS, %s FAIL, %s skipped\n' $$n $$rc "$$(grep -c ' PASS' $(EMU_DIR)/$$n.log)" \
	    "$$(grep -c ' FAIL' $(EMU_DIR)/$$n.log)" "$$(grep -v '^[0-9]' $(EMU_DIR)/$$n.log | grep -c 'skipped (--emu')"; \
	  if [ $$rc != 0 ]; then fail=1; grep -h ' FAIL\|^emu:\|ERROR' $(EMU_DIR)/$$n.log | head -20; tail -n 5 $(EMU_DIR)/$$n.log; fi; \
	done; \
	echo "test-emu: $$(( $$(date +%s) - start )) s"; exit $$fail
