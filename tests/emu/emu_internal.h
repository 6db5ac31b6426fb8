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
/* Enqueue work on a stream (runtime.cpp): queue it (the legacy stream 0:
 * run it now), or record it when the stream is capturing. Returns the error
 * CUDA would return for the call. */
cudaError_t enqueue(cudaStream_t s, std::function<void()> op);
/* The same; a capture also records `at_launch`, which every cudaGraphLaunch
 * of the graph calls during the launch call (checks of the launch itself). */
cudaError_t enqueue_checked(cudaStream_t s, std::function<void()> op, std::function<void()> at_launch);
/* Run the work queued on s so far, on this thread (s = 0: the blocking
 * streams of the current device). For NCCL operations, which the emulator
 * runs during the call: what the stream computed before them must be done. */
void sync_stream(cudaStream_t s);
/* Run the pending work of every stream no thread is running now, as a GPU
 * would by itself: for waits of the emulator that real hardware ends by
 * making progress (NCCL's rendezvous, the end of a clique). */
void progress(void);
/* Does [p, p+n) lie inside one live device allocation? */
bool is_device_range(const void *p, size_t n);
} // namespace emu

#endif
