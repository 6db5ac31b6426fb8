/*
 * Emulated CUDA runtime for tests (tests/emu/): the slice of the CUDA
 * runtime API that echo uses, implemented on the CPU by tests/emu/emu.cpp.
 * Self-contained: nothing here comes from a CUDA toolkit, so CI builds and
 * runs the cuda backend's code without a GPU or nvcc.
 *
 * Model: device memory is host memory (malloc'd, so ASan sees device
 * out-of-bounds accesses); an operation enqueued on a created stream waits
 * in the stream's queue until the host synchronises with it (runtime.cpp
 * says exactly when; the legacy stream 0 too); while a
 * stream is being captured into a graph, operations are recorded and
 * cudaGraphLaunch enqueues their replay. Kernels run with per-thread
 * semantics: each CUDA thread of a block is a coroutine, blocks run one
 * after another.
 *
 * The C part (types and runtime calls) is valid C11 so the library's C files
 * (comm/transport/local_cuda.c, comm/transport/nccl.c, tests) compile against it; the device
 * side (qualifiers, builtins, launches) is C++ only.
 */
#ifndef ECHO_EMU_CUDA_RUNTIME_H
#define ECHO_EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#define ECHO_EMU_CUDA 1
#define CUDART_VERSION 12080

#ifdef __cplusplus
extern "C" {
#endif

/* Values as in CUDA 12's driver_types.h, so printed codes match. */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureMerge = 902,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureIsolation = 905,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorCapturedEvent = 907,
    cudaErrorStreamCaptureWrongThread = 908,
    cudaErrorUnknown = 999
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxThreadsPerMultiProcessor = 39,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
} cudaDeviceAttr;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
} cudaFuncAttribute;

typedef enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
} cudaStreamCaptureMode;

typedef enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
} cudaStreamCaptureStatus;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;

/* The fields echo reads, plus a few common ones (H100-like values). */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major;
    int minor;
    int multiProcessorCount;
    int maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    size_t sharedMemPerBlockOptin;
    int l2CacheSize;
};

struct cudaFuncAttributes {
    size_t sharedSizeBytes;
    size_t constSizeBytes;
    size_t localSizeBytes;
    int maxThreadsPerBlock;
    int numRegs;
    int ptxVersion;
    int binaryVersion;
    int maxDynamicSharedSizeBytes;
};

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaFree(void *p);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemcpy2D(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind k);
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);

/* Kernel-keyed calls: the C++ templates below forward here. */
cudaError_t emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value);
cudaError_t emu_func_get_attributes(struct cudaFuncAttributes *a, const void *func);
cudaError_t emu_occupancy(int *blocks, const void *func, int threads, size_t dyn_smem);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* ---- vector types (C and C++) ---- */
typedef struct __attribute__((aligned(8))) float2 { float x, y; } float2;
typedef struct __attribute__((aligned(16))) float4 { float x, y, z, w; } float4;
typedef struct __attribute__((aligned(8))) uint2 { unsigned x, y; } uint2;
typedef struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; } uint4;
typedef struct __attribute__((aligned(8))) int2 { int x, y; } int2;
typedef struct __attribute__((aligned(16))) int4 { int x, y, z, w; } int4;
typedef struct uint3 { unsigned x, y, z; } uint3;
static inline float2 make_float2(float x, float y) { float2 r = {x, y}; return r; }
static inline float4 make_float4(float x, float y, float z, float w) { float4 r = {x, y, z, w}; return r; }
static inline uint2 make_uint2(unsigned x, unsigned y) { uint2 r = {x, y}; return r; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { uint4 r = {x, y, z, w}; return r; }
static inline int2 make_int2(int x, int y) { int2 r = {x, y}; return r; }
static inline int4 make_int4(int x, int y, int z, int w) { int4 r = {x, y, z, w}; return r; }

#ifdef __cplusplus
#include "emu_device.h"
#endif

#endif
