# tests/emu/emu.mk — run the cuda backend's code on the CPU (included by the
# Makefile).
#
#   make test-emu     build the GPU test programs against the CUDA emulator
#                     (tests/emu/) and run them: tests/gpu/test_cuda_ops.c and
#                     test_cuda_model.c with --emu, test_cuda_comm.c with
#                     --no-bench. Needs no GPU and no CUDA toolkit.
#
# The kernel sources (kernels/cuda/*.cu, comm/*.cu) are compiled unmodified
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
EMU_OPT      ?= -O1
EMU_SAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
EMU_INC      := -Itests/emu/include
EMU_NCCL_SRC ?= tests/emu/nccl_emu.cpp
EMU_SMS      ?= 4
EMU_CFLAGS   := -std=c11 $(EMU_OPT) -g $(WARN) -D_GNU_SOURCE -pthread -MMD -MP -I. $(EMU_INC) -DECHO_HAVE_CUDA=1 \
                $(PKG_CFLAGS) $(EMU_SAN)
# The emulator's own C++ (tests/emu/*.cpp) builds with the project's warnings.
EMU_CXXFLAGS := -std=c++17 $(EMU_OPT) -g $(WARN) -pthread -MMD -MP -I. $(EMU_INC) -Itests/emu $(EMU_SAN)
# The translated .cu files are device code written for nvcc: as host C++
# they trip warnings nvcc does not give (unused static helpers of other
# files, parameters only some instantiations read, `#pragma unroll`).
EMU_KERN_CXXFLAGS := -std=c++17 $(EMU_OPT) -g -Wall -Wextra -Werror -Wno-unknown-pragmas -Wno-unused-function \
                     -Wno-unused-parameter -Wno-unused-variable -pthread -MMD -MP -I. $(EMU_INC) -DECHO_HAVE_CUDA=1 \
                     $(EMU_SAN)

EMU_LIB_OBJ := $(LIB_C_SRC:%.c=$(EMU_DIR)/obj/%.o) $(LIB_CC_SRC:%.cc=$(EMU_DIR)/obj/%.o) \
               $(CU_SRC:%.cu=$(EMU_DIR)/obj/%.o)
EMU_RT_OBJ  := $(EMU_DIR)/obj/tests/emu/emu.o $(EMU_DIR)/obj/tests/emu/runtime.o \
               $(EMU_DIR)/obj/tests/emu/cublaslt.o $(EMU_NCCL_SRC:%.cpp=$(EMU_DIR)/obj/%.o)
EMU_LIB     := $(EMU_DIR)/libecho-emu.a
EMU_TESTS   := $(EMU_DIR)/gpu_test_cuda_ops $(EMU_DIR)/gpu_test_cuda_model $(EMU_DIR)/gpu_test_cuda_comm
EMU_LDLIBS  := $(PKG_LIBS) $(if $(LIB_CC_SRC),$(shell pkg-config --libs sentencepiece 2>/dev/null || echo -lsentencepiece)) \
               -lm -pthread

# Rebuild when the flags change (another EMU_OPT in the same BUILD). A rule,
# not a $(shell ...), so builds that do not ask for emu targets touch nothing.
EMU_FLAGS_STAMP := $(EMU_DIR)/.flags
EMU_FLAGS_LINE  := $(EMU_CFLAGS) | $(EMU_KERN_CXXFLAGS) | $(EMU_CXXFLAGS)
$(EMU_FLAGS_STAMP): emu-force
	@mkdir -p $(dir $@)
	@echo '$(EMU_FLAGS_LINE)' | cmp -s - $@ || echo '$(EMU_FLAGS_LINE)' > $@
emu-force:

.PHONY: test-emu emu-build emu-force
emu-build: $(EMU_TESTS)

$(EMU_DIR)/obj/%.o: %.c $(EMU_FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) -c $< -o $@

$(EMU_DIR)/obj/%.o: %.cc $(EMU_FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 $(EMU_OPT) -g $(WARN) -pthread -MMD -MP -I. $(EMU_SAN) \
	  $(shell pkg-config --cflags sentencepiece 2>/dev/null) -c $< -o $@

$(EMU_DIR)/obj/tests/emu/%.o: tests/emu/%.cpp $(EMU_FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(EMU_DIR)/gen/%.cpp: %.cu tests/emu/translate.py
	@mkdir -p $(dir $@)
	python3 tests/emu/translate.py $< $@

$(EMU_DIR)/obj/%.o: $(EMU_DIR)/gen/%.cpp $(EMU_FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_KERN_CXXFLAGS) -c $< -o $@

$(EMU_LIB): $(EMU_LIB_OBJ) $(EMU_RT_OBJ)
	rm -f $@ && ar rcs $@ $^

$(EMU_DIR)/gpu_test_%: $(EMU_DIR)/obj/tests/gpu/test_%.o $(EMU_LIB)
	$(CXX) $(EMU_SAN) $^ -o $@ $(EMU_LDLIBS)

# Every program runs even when one fails; the status is the worst.
test-emu: $(EMU_TESTS)
	@fail=0; \
	echo "== $(EMU_DIR)/gpu_test_cuda_ops --emu"; \
	$(EMU_DIR)/gpu_test_cuda_ops --emu > $(EMU_DIR)/ops.log 2>&1 || fail=1; \
	tail -n 3 $(EMU_DIR)/ops.log; \
	echo "== $(EMU_DIR)/gpu_test_cuda_model --emu"; \
	$(EMU_DIR)/gpu_test_cuda_model --emu > $(EMU_DIR)/model.log 2>&1 || fail=1; \
	tail -n 3 $(EMU_DIR)/model.log; \
	echo "== ECHO_EMU_SMS=$(EMU_SMS) $(EMU_DIR)/gpu_test_cuda_comm --no-bench"; \
	ECHO_EMU_SMS=$(EMU_SMS) $(EMU_DIR)/gpu_test_cuda_comm --no-bench > $(EMU_DIR)/comm.log 2>&1 || fail=1; \
	tail -n 3 $(EMU_DIR)/comm.log; \
	if [ $$fail != 0 ]; then echo "test-emu: FAILED (logs: $(EMU_DIR)/*.log)"; grep -h 'FAIL\|emu:\|ERROR' $(EMU_DIR)/*.log | head -40; fi; \
	exit $$fail
