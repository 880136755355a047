// sim/nccl.h: the CUDA simulator's stand-in for <nccl.h> (docs/cuda_simulator.md, "NCCL").
//
// The subset of NCCL Kiln uses, with NCCL's names, enum values and signatures (NCCL 2.28), so
// comm/nccl_transport.cpp compiles unchanged against either. Semantics follow the NCCL user
// guide (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/): a communicator's ranks
// are joined with a shared unique id; collectives and send/recv are queued on a CUDA stream
// and complete there; ncclGroupStart/End fuse calls so that send/recv pairs progress together.
//
// What is different here: the ranks of a communicator are host threads of ONE process, each
// with its own simulated device (cudaSetDevice before ncclCommInitRank); a unique id made by
// another process is rejected. Calls check their arguments at once (device pointers inside
// live allocations of the communicator's device, counts, peers, the stream's device) and
// return ncclInvalidArgument / ncclInvalidUsage with the reason in ncclGetLastError. The work
// itself runs on the stream, where the ranks meet: an op waits for its peers' matching ops
// (as a NCCL kernel spins for its peers), then one of them moves the bytes. A mismatch found
// there (a send of 8 bytes met by a receive of 4, an allreduce met by one of another count)
// fails the op on every rank involved; ncclCommAbort releases every rank waiting on the
// communicator. A failed op is reported by ncclCommGetAsyncError, and as the stream's fault.
#pragma once

#include <cstddef>

#include "engine/cuda/sim/api.h"

// The NCCL release whose API this follows (ncclGetVersion reports it).
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_VERSION_CODE 22809

// The handle of one rank's membership in a communicator.
struct ncclComm;
using ncclComm_t = ncclComm*;

// The rendezvous token: rank 0 makes one, every rank passes it to ncclCommInitRank.
constexpr int NCCL_UNIQUE_ID_BYTES = 128;
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};

// The enums have a fixed underlying type (int): any int converted to one is then a valid value,
// which the simulator checks and rejects as NCCL does (an out-of-range value of an enum
// without one would be undefined behaviour, reported by UBSan before the check could run).
enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8,
};

enum ncclRedOp_t : int {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
};

enum ncclDataType_t : int {
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
  // fp8 types (10, 11) are not declared: the simulator rejects them
  ncclNumTypes = 12,
};

ncclResult_t ncclGetVersion(int* version);
const char* ncclGetErrorString(ncclResult_t result);
// The reason of the last failure seen by this thread, or by `comm` (may be null).
const char* ncclGetLastError(ncclComm_t comm);

// ---- Communicators ----------------------------------------------------------------------------
ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id);
// Joins rank `rank` of `nranks` on the calling thread's current device; blocks until every
// rank has joined (KILN_SIM_NCCL_TIMEOUT_S, default 300 s: then ncclSystemError).
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank);
// Waits for this rank's queued operations, then frees the handle.
ncclResult_t ncclCommDestroy(ncclComm_t comm);
// Frees the handle at once; every operation of the communicator still waiting for a peer, on
// any rank, fails (ncclRemoteError for the other ranks).
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

// ---- Collectives and point to point (queued on `stream`, a stream of the comm's device) -----
// In place when sendbuff == recvbuff. ncclAvg is the sum divided by the number of ranks.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
// The k-th send from rank a to rank b matches the k-th receive of b from a; both sides must
// name the same number of bytes.
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);

// ---- Groups ---------------------------------------------------------------------------------
// Calls between ncclGroupStart and the matching ncclGroupEnd (they nest) are collected for the
// calling thread and issued together at the outermost ncclGroupEnd, as one unit per stream.
// The simulator takes the calls of one communicator per group (one rank per host thread).
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
