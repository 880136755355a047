// dtype.h: element types of tensors, and the helper that turns a runtime dtype into a C++ type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/error.h"
#include "engine/host_device.h"

namespace kiln {

// The numbers are a file-format contract: checkpoints and test fixtures record a dtype by its
// value, so new dtypes go at the end and existing ones never move.
//   F16   IEEE 754 binary16 (element type Half, engine/host_device.h)
//   BF16  bfloat16, the top half of an f32 (element type BFloat16)
// F16 and BF16 are storage formats: tensors of them can be created, filled, printed, copied,
// reshaped, saved, loaded and converted (to(DType)); the ops a network's activations pass
// through take them too (is_activation_dtype, below), the other compute ops take f32/f64 and
// say so (dispatch_floating). Mixed precision computes with them under autocast
// (engine/autocast.h): conv2d and matmul round their f32 inputs to bf16/f16 and run 16-bit
// kernels internally.
enum class DType : uint8_t { F32, F64, I32, I64, U8, F16, BF16 };

// The largest dtype code this build knows (checkpoint readers validate against it).
constexpr uint8_t kLastDType = static_cast<uint8_t>(DType::BF16);

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::F16: return 2;
    case DType::BF16: return 2;
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
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
  }
  return "?";
}

// The floating dtypes Kiln computes in: f32 and f64, the ones dispatch_floating instantiates
// kernels for and autograd differentiates. f16 and bf16 are not among them (yet): an op's
// is_floating check refuses them rather than letting one reach an f32 kernel.
inline bool is_floating(DType t) { return t == DType::F32 || t == DType::F64; }

// The 16-bit floating formats (storage and conversion only, see DType).
inline bool is_low_precision(DType t) { return t == DType::F16 || t == DType::BF16; }

// The error for a compute op given an f16 or bf16 tensor.
inline std::string low_precision_unsupported(const char* op, DType t) {
  return std::string(op) + ": " + dtype_name(t) +
         " tensors are not supported yet; convert with .to(DType::F32) (for mixed precision, "
         "keep f32 tensors and compute under an AutocastGuard, engine/autocast.h)";
}

// The C++ type of each dtype, and back.
template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::BF16; };

template <typename T> struct TypeTag { using type = T; };

// Calls fn(TypeTag<float>{}) or fn(TypeTag<double>{}): the one place floating kernels are
// instantiated. Other dtypes are an error naming the op; f16 and bf16 one that says to convert.
template <typename Fn>
decltype(auto) dispatch_floating(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(TypeTag<float>{});
    case DType::F64: return fn(TypeTag<double>{});
    default: break;
  }
  if (is_low_precision(t)) throw Error(low_precision_unsupported(op, t));
  throw Error(std::string(op) + ": expected a floating tensor (f32 or f64), got " + dtype_name(t));
}

// The dtypes an activation between layers may have: f32 and f64, and f16 and bf16 when autocast
// keeps activations in 16 bits (engine/autocast.h, AutocastOutputs::LowPrecision). The ops a
// network's layers are made of (conv2d, BatchNorm, ReLU, add, pooling, the ResNet head) take
// all four; their kernels load 16-bit elements, compute in f32 (compute_t) and round once on
// store. Other ops take is_floating dtypes only.
inline bool is_activation_dtype(DType t) { return is_floating(t) || is_low_precision(t); }

// The type a kernel computes in for elements of type T: f32 for the 16-bit formats (they have
// no arithmetic of their own), T itself for f32 and f64.
template <typename T> struct compute_type { using type = T; };
template <> struct compute_type<Half> { using type = float; };
template <> struct compute_type<BFloat16> { using type = float; };
template <typename T> using compute_t = typename compute_type<T>::type;

// Calls fn(TypeTag<T>{}) with T float, double, Half or BFloat16 (is_activation_dtype): the
// dispatch of the kernels that also run on 16-bit activations. Other dtypes are an error.
template <typename Fn>
decltype(auto) dispatch_activation(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(TypeTag<float>{});
    case DType::F64: return fn(TypeTag<double>{});
    case DType::F16: return fn(TypeTag<Half>{});
    case DType::BF16: return fn(TypeTag<BFloat16>{});
    default: break;
  }
  throw Error(std::string(op) + ": expected a floating tensor (f32, f64, f16 or bf16), got " +
              dtype_name(t));
}

// Calls fn(TypeTag<T>{}) with the element type of any dtype: for code that only moves or
// converts elements (fill, copy, dtype conversion), never for arithmetic.
template <typename Fn>
decltype(auto) dispatch_any(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(TypeTag<float>{});
    case DType::F64: return fn(TypeTag<double>{});
    case DType::I32: return fn(TypeTag<int32_t>{});
    case DType::I64: return fn(TypeTag<int64_t>{});
    case DType::U8: return fn(TypeTag<uint8_t>{});
    case DType::F16: return fn(TypeTag<Half>{});
    case DType::BF16: return fn(TypeTag<BFloat16>{});
  }
  throw Error("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

}  // namespace kiln
