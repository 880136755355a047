// cublas_api.cpp: cuBLAS opened with dlopen on first use (see cublas_api.h).
#include "engine/cuda/cublas_api.h"

#include <atomic>
#include <cstddef>
#include <string>

#include "engine/error.h"

#if !KILN_CUDA_SIM
#include <dlfcn.h>

#include <cuda_runtime_api.h>
#endif

namespace kiln::cuda {
namespace {

std::atomic<bool> loaded{false};

#if KILN_CUDA_SIM

CublasApi load() {
  return CublasApi{&cublasCreate,      &cublasDestroy,      &cublasSetStream,
                   &cublasGetStream,   &cublasSetMathMode,  &cublasGetMathMode,
                   &cublasSgemm,       &cublasDgemm,        static_cast<CublasGemmExFn>(&cublasGemmEx),
                   &cublasGetStatusName, &cublasGetStatusString};
}

#else

// The library's file name for the cuBLAS these headers declare: libcublas.so.13 for CUDA 13.
std::string soname() { return "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR); }

// The directory of the CUDA runtime library this process loaded, with a trailing '/'; empty
// when the runtime is linked statically (then the soname search alone applies).
std::string runtime_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) == 0 || !info.dli_fname) {
    return "";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

void* open_library() {
  // RTLD_LOCAL: cuBLAS's symbols stay out of the global namespace, so nothing else binds to
  // them by accident.
  const std::string dir = runtime_dir();
  if (!dir.empty()) {
    if (void* h = dlopen((dir + soname()).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  if (void* h = dlopen(soname().c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const char* why = dlerror();
  throw Error("cannot load cuBLAS (" + soname() + ", looked for in " +
              (dir.empty() ? std::string("the library search path") : dir + " and the library search path") +
              "): " + (why ? why : "unknown error") +
              ": install the CUDA toolkit's cuBLAS or add its directory to LD_LIBRARY_PATH");
}

// Stringifies a name after macro expansion: cublasSgemm is a macro for cublasSgemm_v2, and the
// library exports the latter.
#define KILN_CUBLAS_SYMBOL_NAME(name) KILN_CUBLAS_STR(name)
#define KILN_CUBLAS_STR(name) #name

template <typename Fn>
void resolve(void* library, const char* name, Fn& fn) {
  void* sym = dlsym(library, name);
  if (!sym) {
    throw Error(std::string("cuBLAS (") + soname() + ") has no entry point " + name +
                ": it is older than the headers Kiln was built with (CUDA " +
                std::to_string(CUBLAS_VER_MAJOR) + "); install a matching cuBLAS");
  }
  fn = reinterpret_cast<Fn>(sym);
}

CublasApi load() {
  void* library = open_library();  // kept open for the life of the process
  CublasApi api{};
  try {
#define KILN_RESOLVE(field, name) resolve(library, KILN_CUBLAS_SYMBOL_NAME(name), api.field)
    KILN_RESOLVE(create, cublasCreate);
    KILN_RESOLVE(destroy, cublasDestroy);
    KILN_RESOLVE(set_stream, cublasSetStream);
    KILN_RESOLVE(get_stream, cublasGetStream);
    KILN_RESOLVE(set_math_mode, cublasSetMathMode);
    KILN_RESOLVE(get_math_mode, cublasGetMathMode);
    KILN_RESOLVE(sgemm, cublasSgemm);
    KILN_RESOLVE(dgemm, cublasDgemm);
    KILN_RESOLVE(gemm_ex, cublasGemmEx);
    KILN_RESOLVE(status_name, cublasGetStatusName);
    KILN_RESOLVE(status_string, cublasGetStatusString);
#undef KILN_RESOLVE
  } catch (...) {
    dlclose(library);
    throw;
  }
  loaded = true;
  return api;
}

#endif

}  // namespace

const CublasApi& cublas() {
  static const CublasApi api = load();  // a failed load throws, and the next call tries again
  return api;
}

bool cublas_loaded() { return loaded.load(); }

}  // namespace kiln::cuda
