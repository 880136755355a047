// dnnl_cpu.cpp: the shared oneDNN engine and streams (contract: dnnl_cpu.h).
#include "engine/dnnl_cpu.h"

namespace kiln::dnnl_cpu {

dnnl::engine& engine() {
  static dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  return cpu;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

dnnl::memory::data_type data_type(DType t) {
  switch (t) {
    case DType::F32: return dnnl::memory::data_type::f32;
    case DType::F16: return dnnl::memory::data_type::f16;
    case DType::BF16: return dnnl::memory::data_type::bf16;
    default: break;
  }
  throw Error(std::string("oneDNN: no data type for ") + dtype_name(t) +
              " here (f32, f16 and bf16 only)");
}

// oneDNN names its implementations "<kind>:<isa>", e.g. "brg:avx512_core_amx",
// "jit:avx512_core_bf16", "gemm:jit", and the reference ones "ref:any", "gemm:ref"...
bool is_reference(const std::string& impl_info) { return impl_info.find("ref") != std::string::npos; }

}  // namespace kiln::dnnl_cpu
