// dtype.h: element types of tensors, and the helper that turns a runtime dtype into a C++ type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/error.h"

namespace kiln {

enum class DType : uint8_t { F32, F64, I32, I64, U8 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

inline bool is_floating(DType t) { return t == DType::F32 || t == DType::F64; }

// The C++ type of each dtype, and back.
template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };

template <typename T> struct TypeTag { using type = T; };

// Calls fn(TypeTag<float>{}) or fn(TypeTag<double>{}): the one place floating kernels are
// instantiated. Other dtypes are an error naming the op.
template <typename Fn>
decltype(auto) dispatch_floating(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(TypeTag<float>{});
    case DType::F64: return fn(TypeTag<double>{});
    default: break;
  }
  throw Error(std::string(op) + ": expected a floating tensor (f32 or f64), got " + dtype_name(t));
}

}  // namespace kiln
