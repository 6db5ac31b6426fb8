/*
 * tests/emu/include/nccl.h — the slice of NCCL's API that comm/transport/nccl.c and its
 * tests use, for the CPU emulator (tests/emu/nccl_emu.cpp, which says what is
 * and is not modelled). Names, signatures and enum values are those of the
 * real <nccl.h> (2.x), so code built against this header also builds against
 * the real one. C-compatible: comm/transport/nccl.c is C11.
 */
#ifndef EMU_NCCL_H
#define EMU_NCCL_H

#include <stddef.h>

#include <cuda_runtime.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE 23000
#define NCCL_EMULATED 1 /* not in the real header: tests may print it, never branch on it */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

ncclResult_t ncclGetVersion(int *version);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
