/* Shared between the emulator's own files (emu.cpp, runtime.cpp,
 * cublaslt.cpp, nccl_emu.cpp); not seen by the code under test. */
#ifndef ECHO_EMU_INTERNAL_H
#define ECHO_EMU_INTERNAL_H

#include <functional>

#include "cuda_runtime.h"

namespace emu {
/* run every block of a grid on this host thread (emu.cpp) */
void run_grid(const LaunchCfg &c, const std::function<void()> &body);
void seed_scheduler(uint64_t seed);
bool in_kernel();
/* Enqueue work on a stream (runtime.cpp): run now, or record it when the
 * stream is capturing. Returns the error CUDA would return for the call. */
cudaError_t enqueue(cudaStream_t s, std::function<void()> op);
/* Does [p, p+n) lie inside one live device allocation? */
bool is_device_range(const void *p, size_t n);
} // namespace emu

#endif
