// wire_format.cpp: see wire_format.h.
#include "comm/wire_format.h"

#include "engine/error.h"

namespace kiln::comm {

const char* wire_format_name(WireFormat w) {
  switch (w) {
    case WireFormat::Uncompressed: return "uncompressed";
    case WireFormat::F16: return "f16";
    case WireFormat::BF16: return "bf16";
  }
  return "?";
}

DType wire_dtype(WireFormat w, DType grad) {
  switch (w) {
    case WireFormat::Uncompressed: return grad;
    case WireFormat::F16: return DType::F16;
    case WireFormat::BF16: return DType::BF16;
  }
  throw Error("comm: unknown wire format");
}

ElemType elem_type_of(DType t) {
  switch (t) {
    case DType::F32: return ElemType::F32;
    case DType::F64: return ElemType::F64;
    case DType::F16: return ElemType::F16;
    case DType::BF16: return ElemType::BF16;
    default: break;
  }
  throw Error(std::string("comm: ") + dtype_name(t) + " cannot travel; use f32, f64, f16 or bf16");
}

}  // namespace kiln::comm
