// sim/cublas.cpp: the simulated cuBLAS subset (sim/cublas.h): handles, math mode, SGEMM, DGEMM
// and GemmEx (16-bit or FP32 inputs, FP32 accumulation). Each call checks its arguments the way
// the cuBLAS documentation lists them ("cuBLAS Library", https://docs.nvidia.com/cuda/cublas/,
// cublas<t>gemm and cublasGemmEx:
// CUBLAS_STATUS_INVALID_VALUE for negative sizes, a bad operation, lda/ldb/ldc below their
// minimum, null alpha/beta; CUBLAS_STATUS_NOT_SUPPORTED for a type combination GemmEx does not
// offer) and, beyond cuBLAS, that every matrix it will touch lies inside one live allocation of
// the handle's device. Then it queues the product on the handle's stream; OpenBLAS computes it
// there (GemmEx on FP32 copies of 16-bit operands).
//
// Not faithful: the order of the K-sum (cuBLAS's tiles and split-K differ from OpenBLAS's, so
// the last bits differ), performance, and the tensor-core path's exact rounding of the sum
// (TF32 is simulated by rounding the inputs; the products are summed in FP32). For 16-bit
// inputs the products are exact in FP32 on both, so only the summation order differs.
#include "engine/cuda/sim/cublas.h"

#include <cblas.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "engine/cuda/sim/internal.h"
#include "engine/host_device.h"
#include "engine/cuda/sim/library.h"

struct cublasContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

namespace {

using kiln::sim::library_fail;

// Never destroyed: handles may be destroyed by other static objects while the process exits.
std::mutex& g_mutex = *new std::mutex;
std::unordered_set<cublasHandle_t>& g_handles = *new std::unordered_set<cublasHandle_t>;  // live

// A copy of the handle's state, or false for a null or destroyed handle.
bool lookup(cublasHandle_t handle, cublasContext* state) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (handle == nullptr || g_handles.count(handle) == 0) return false;
  *state = *handle;
  return true;
}

cublasStatus_t bad_handle(const char* call) {
  return library_fail(CUBLAS_STATUS_NOT_INITIALIZED,
                      std::string(call) + ": the handle is null or was destroyed");
}

bool valid_math(int mode) {
  const int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  return base == CUBLAS_DEFAULT_MATH || base == CUBLAS_PEDANTIC_MATH ||
         base == CUBLAS_TF32_TENSOR_OP_MATH;
}

// The product on the host, column-major. C is m x n; A is stored a_rows x a_cols, B likewise.
template <typename T>
void gemm_host(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b,
               int ldb, T beta, T* c, int ldc, bool tf32) {
  // beta == 0: C is not read (it may hold NaN). Zeroing it first makes that true whatever the
  // host BLAS does with beta = 0.
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      T& cij = c[static_cast<int64_t>(j) * ldc + i];
      cij = beta == T(0) ? T(0) : beta * cij;
    }
  if (k == 0 || alpha == T(0)) return;  // A and B are not read
  std::vector<T> a_round, b_round;
  if constexpr (std::is_same_v<T, float>) {
    if (tf32) {  // tensor cores read TF32: round copies of the operands
      const int a_rows = ta ? k : m, a_cols = ta ? m : k;
      const int b_rows = tb ? n : k, b_cols = tb ? k : n;
      a_round.resize(static_cast<size_t>(a_rows) * a_cols);
      b_round.resize(static_cast<size_t>(b_rows) * b_cols);
      for (int j = 0; j < a_cols; ++j)
        for (int i = 0; i < a_rows; ++i)
          a_round[static_cast<size_t>(j) * a_rows + i] =
              kiln::sim::round_tf32(a[static_cast<int64_t>(j) * lda + i]);
      for (int j = 0; j < b_cols; ++j)
        for (int i = 0; i < b_rows; ++i)
          b_round[static_cast<size_t>(j) * b_rows + i] =
              kiln::sim::round_tf32(b[static_cast<int64_t>(j) * ldb + i]);
      a = a_round.data(), lda = a_rows;
      b = b_round.data(), ldb = b_rows;
    }
  }
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasColMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, 1.0f, c, ldc);
  else
    cblas_dgemm(CblasColMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, 1.0, c, ldc);
}

// The shape checks every GEMM entry point makes (CUBLAS_STATUS_INVALID_VALUE, as documented),
// and the storage of A and B that follows: rows x cols, column-major.
struct GemmShape {
  bool ta, tb;
  int a_rows, a_cols, b_rows, b_cols;
};
cublasStatus_t check_shape(const std::string& name, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, int lda, int ldb,
                           int ldc, GemmShape* s) {
  auto invalid = [&](const std::string& why) {
    return library_fail(CUBLAS_STATUS_INVALID_VALUE, name + ": " + why);
  };
  auto valid_op = [](cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  if (!valid_op(transa) || !valid_op(transb)) return invalid("transa/transb must be N, T or C");
  if (m < 0 || n < 0 || k < 0)
    return invalid("m, n, k = " + std::to_string(m) + ", " + std::to_string(n) + ", " +
                   std::to_string(k) + ": negative");
  s->ta = transa != CUBLAS_OP_N, s->tb = transb != CUBLAS_OP_N;
  s->a_rows = s->ta ? k : m, s->a_cols = s->ta ? m : k;
  s->b_rows = s->tb ? n : k, s->b_cols = s->tb ? k : n;
  if (lda < std::max(1, s->a_rows))
    return invalid("lda = " + std::to_string(lda) + " < max(1, " + std::to_string(s->a_rows) +
                   ") (rows of A as stored)");
  if (ldb < std::max(1, s->b_rows))
    return invalid("ldb = " + std::to_string(ldb) + " < max(1, " + std::to_string(s->b_rows) +
                   ") (rows of B as stored)");
  if (ldc < std::max(1, m))
    return invalid("ldc = " + std::to_string(ldc) + " < max(1, m = " + std::to_string(m) + ")");
  return CUBLAS_STATUS_SUCCESS;
}

// One operand's place in device memory: `bytes` from `p` (0 when the call does not touch it).
struct Operand {
  const void* p;
  size_t bytes;
};

// Checks that A, B and C lie in allocations of the handle's device and that its stream can take
// work, then queues `work` there behind the same range checks (the memory may be freed before
// the work's turn).
cublasStatus_t queue_gemm(const char* call, const cublasContext& h, Operand a, Operand b,
                          Operand c, std::function<void()> work) {
  const std::string name(call);
  std::string why;
  if (!kiln::sim::device_range_ok("A", a.p, a.bytes, h.device, &why) ||
      !kiln::sim::device_range_ok("B", b.p, b.bytes, h.device, &why) ||
      !kiln::sim::device_range_ok("C", c.p, c.bytes, h.device, &why))
    return library_fail(CUBLAS_STATUS_INVALID_VALUE, name + ": " + why);
  if (const std::string problem = kiln::sim::stream_problem(h.stream, h.device); !problem.empty())
    return library_fail(CUBLAS_STATUS_EXECUTION_FAILED, name + ": " + problem);
  const int device = h.device;
  const cudaError_t queued = kiln::sim::enqueue(h.stream, call, [=] {
    kiln::sim::require_device_range(call, "A", a.p, a.bytes, device);
    kiln::sim::require_device_range(call, "B", b.p, b.bytes, device);
    kiln::sim::require_device_range(call, "C", c.p, c.bytes, device);
    work();
  });
  if (queued != cudaSuccess)
    return library_fail(CUBLAS_STATUS_EXECUTION_FAILED,
                        name + ": could not queue on the handle's stream: " +
                            cudaGetErrorName(queued));
  return CUBLAS_STATUS_SUCCESS;
}

bool tf32_mode(const cublasContext& h) {
  return (h.mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) == CUBLAS_TF32_TENSOR_OP_MATH;
}

// cublasSgemm and cublasDgemm.
template <typename T>
cublasStatus_t gemm(const char* call, cublasHandle_t handle, cublasOperation_t transa,
                    cublasOperation_t transb, int m, int n, int k, const T* alpha, const T* a,
                    int lda, const T* b, int ldb, const T* beta, T* c, int ldc) {
  kiln::sim::clear_library_error();
  cublasContext h;
  if (!lookup(handle, &h)) return bad_handle(call);
  const std::string name(call);
  GemmShape s;
  if (const cublasStatus_t st = check_shape(name, transa, transb, m, n, k, lda, ldb, ldc, &s);
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (alpha == nullptr || beta == nullptr)
    return library_fail(CUBLAS_STATUS_INVALID_VALUE, name + ": alpha or beta is null");
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;  // nothing to compute or scale
  // Host pointer mode: the scalars are read now, the caller may reuse them after the call.
  const T alpha_v = *alpha, beta_v = *beta;
  const bool reads_ab = k > 0 && alpha_v != T(0);
  const size_t a_bytes = reads_ab ? sizeof(T) * kiln::sim::matrix_span(s.a_rows, s.a_cols, lda) : 0;
  const size_t b_bytes = reads_ab ? sizeof(T) * kiln::sim::matrix_span(s.b_rows, s.b_cols, ldb) : 0;
  const size_t c_bytes = sizeof(T) * kiln::sim::matrix_span(m, n, ldc);
  const bool tf32 = std::is_same_v<T, float> && tf32_mode(h);
  return queue_gemm(call, h, {a, a_bytes}, {b, b_bytes}, {c, c_bytes}, [=] {
    gemm_host<T>(s.ta, s.tb, m, n, k, alpha_v, a, lda, b, ldb, beta_v, c, ldc, tf32);
  });
}

// ---- cublasGemmEx --------------------------------------------------------------------------

size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_16BF: return "CUDA_R_16BF";
  }
  return "an unknown cudaDataType";
}

// Empty when (Atype, Btype, Ctype, computeType, algo) is a simulated combination (sim/cublas.h),
// else why not.
std::string unsupported_ex(cudaDataType_t at, cudaDataType_t bt, cudaDataType_t ct,
                           cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC)
    return "computeType " + std::to_string(static_cast<int>(compute)) +
           " is not simulated (CUBLAS_COMPUTE_32F and _32F_PEDANTIC are)";
  if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP)
    return "algo " + std::to_string(static_cast<int>(algo)) +
           " is not simulated (CUBLAS_GEMM_DEFAULT is)";
  const bool ok_inputs = at == bt && (at == CUDA_R_16F || at == CUDA_R_16BF || at == CUDA_R_32F);
  const bool ok_output = ct == CUDA_R_32F || (ct == at && at != CUDA_R_32F);
  if (!ok_inputs || !ok_output)
    return std::string("Atype ") + type_name(at) + ", Btype " + type_name(bt) + ", Ctype " +
           type_name(ct) + " with compute type 32F is not a supported combination (A and B "
           "both 16F, 16BF or 32F; C of their type or 32F)";
  return "";
}

// Element i of a 16-bit or FP32 buffer, as FP32 (exact; the rules of engine/host_device.h).
float load_elem(const void* p, cudaDataType_t t, int64_t i) {
  switch (t) {
    case CUDA_R_16F: return kiln::f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case CUDA_R_16BF: return kiln::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// A column-major rows x cols matrix of type t (leading dimension ld), packed into FP32.
std::vector<float> widen_matrix(const void* p, cudaDataType_t t, int rows, int cols, int ld) {
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  for (int j = 0; j < cols; ++j)
    for (int i = 0; i < rows; ++i)
      out[static_cast<size_t>(j) * rows + i] = load_elem(p, t, static_cast<int64_t>(j) * ld + i);
  return out;
}

// The GemmEx product on the host: 16-bit operands widened to FP32, the FP32 product of
// gemm_host, a 16-bit C rounded once from the FP32 result (nearest even).
void gemm_ex_host(const GemmShape& s, int m, int n, int k, float alpha, const void* a,
                  cudaDataType_t at, int lda, const void* b, cudaDataType_t bt, int ldb,
                  float beta, void* c, cudaDataType_t ct, int ldc, bool tf32) {
  std::vector<float> a32, b32;
  const float* ap = static_cast<const float*>(a);
  const float* bp = static_cast<const float*>(b);
  if (k > 0 && alpha != 0.0f && at != CUDA_R_32F) {  // otherwise A and B are not read
    a32 = widen_matrix(a, at, s.a_rows, s.a_cols, lda);
    b32 = widen_matrix(b, bt, s.b_rows, s.b_cols, ldb);
    ap = a32.data(), lda = std::max(1, s.a_rows);
    bp = b32.data(), ldb = std::max(1, s.b_rows);
  }
  if (ct == CUDA_R_32F) {
    gemm_host<float>(s.ta, s.tb, m, n, k, alpha, ap, lda, bp, ldb, beta, static_cast<float*>(c),
                     ldc, tf32);
    return;
  }
  // C is read only when beta != 0 (it may hold NaN otherwise, and gemm_host ignores it then).
  std::vector<float> c32 = beta != 0.0f ? widen_matrix(c, ct, m, n, ldc)
                                        : std::vector<float>(static_cast<size_t>(m) * n);
  gemm_host<float>(s.ta, s.tb, m, n, k, alpha, ap, lda, bp, ldb, beta, c32.data(), m, tf32);
  uint16_t* out = static_cast<uint16_t*>(c);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      const float v = c32[static_cast<size_t>(j) * m + i];
      out[static_cast<int64_t>(j) * ldc + i] =
          ct == CUDA_R_16F ? kiln::f32_to_f16(v) : kiln::f32_to_bf16(v);
    }
}
}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  kiln::sim::clear_library_error();
  if (handle == nullptr) return library_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate: null");
  if (kiln::sim::configured_device_count() == 0)
    return library_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate: no CUDA device");
  auto* h = new cublasContext;
  h->device = kiln::sim::current_device();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_handles.insert(h);
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  kiln::sim::clear_library_error();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (handle == nullptr || g_handles.erase(handle) == 0) return bad_handle("cublasDestroy");
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  kiln::sim::clear_library_error();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (handle == nullptr || g_handles.count(handle) == 0) return bad_handle("cublasSetStream");
  handle->stream = stream;  // checked when work is queued on it, as cuBLAS does
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  kiln::sim::clear_library_error();
  cublasContext h;
  if (!lookup(handle, &h)) return bad_handle("cublasGetStream");
  if (stream == nullptr) return library_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetStream: null");
  *stream = h.stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  kiln::sim::clear_library_error();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (handle == nullptr || g_handles.count(handle) == 0) return bad_handle("cublasSetMathMode");
  if (!valid_math(mode))
    return library_fail(CUBLAS_STATUS_NOT_SUPPORTED,
                        "cublasSetMathMode: mode " + std::to_string(static_cast<int>(mode)) +
                            " is not simulated (DEFAULT, PEDANTIC, TF32_TENSOR_OP are)");
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  kiln::sim::clear_library_error();
  cublasContext h;
  if (!lookup(handle, &h)) return bad_handle("cublasGetMathMode");
  if (mode == nullptr) return library_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetMathMode: null");
  *mode = h.mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  return gemm<float>("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta,
                     C, ldc);
}

cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const double* alpha,
                           const double* A, int lda, const double* B, int ldb,
                           const double* beta, double* C, int ldc) {
  return gemm<double>("cublasDgemm", handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta,
                      C, ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  const char* call = "cublasGemmEx";
  kiln::sim::clear_library_error();
  cublasContext h;
  if (!lookup(handle, &h)) return bad_handle(call);
  const std::string name(call);
  GemmShape s;
  if (const cublasStatus_t st = check_shape(name, transa, transb, m, n, k, lda, ldb, ldc, &s);
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (const std::string why = unsupported_ex(Atype, Btype, Ctype, computeType, algo); !why.empty())
    return library_fail(CUBLAS_STATUS_NOT_SUPPORTED, name + ": " + why);
  if (alpha == nullptr || beta == nullptr)
    return library_fail(CUBLAS_STATUS_INVALID_VALUE, name + ": alpha or beta is null");
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // Compute type 32F: the scalars are float, read now (host pointer mode).
  const float alpha_v = *static_cast<const float*>(alpha);
  const float beta_v = *static_cast<const float*>(beta);
  const bool reads_ab = k > 0 && alpha_v != 0.0f;
  const size_t a_bytes =
      reads_ab ? type_size(Atype) * kiln::sim::matrix_span(s.a_rows, s.a_cols, lda) : 0;
  const size_t b_bytes =
      reads_ab ? type_size(Btype) * kiln::sim::matrix_span(s.b_rows, s.b_cols, ldb) : 0;
  const size_t c_bytes = type_size(Ctype) * kiln::sim::matrix_span(m, n, ldc);
  // TF32 rounds FP32 inputs only (16-bit inputs already fit in TF32's 10 mantissa bits), and
  // only where the compute type is not PEDANTIC.
  const bool tf32 = Atype == CUDA_R_32F && computeType == CUBLAS_COMPUTE_32F && tf32_mode(h);
  return queue_gemm(call, h, {A, a_bytes}, {B, b_bytes}, {C, c_bytes}, [=] {
    gemm_ex_host(s, m, n, k, alpha_v, A, Atype, lda, B, Btype, ldb, beta_v, C, Ctype, ldc, tf32);
  });
}

// ---- Status names and texts (the cuBLAS documentation's cublasStatus_t table) -------------
namespace {
struct StatusText {
  cublasStatus_t status;
  const char* name;
  const char* text;
};
constexpr StatusText kStatus[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED",
     "the cuBLAS library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
     "an unsupported value or parameter was passed to the function"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH",
     "the function requires a feature absent from the device architecture"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR",
     "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED",
     "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR",
     "an internal cuBLAS operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
     "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR",
     "the functionality requested requires some license"},
};
const StatusText* find_status(cublasStatus_t status) {
  for (const StatusText& s : kStatus)
    if (s.status == status) return &s;
  return nullptr;
}
}  // namespace

const char* cublasGetStatusName(cublasStatus_t status) {
  const StatusText* s = find_status(status);
  return s ? s->name : "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  const StatusText* s = find_status(status);
  return s ? s->text : "unknown cuBLAS status";
}
