// message.cpp: see message.h.
#include "apps/comm_bench/message.h"

#include <cmath>
#include <cstddef>

#include "apps/comm_bench/report.h"
#include "engine/host_device.h"

namespace kiln::apps::comm_bench {

using comm::ElemType;

namespace {

// Element i of a host buffer of `type`, as a float (the 16-bit formats widen exactly).
float element(const void* data, ElemType type, int64_t i) {
  const uint16_t* bits = static_cast<const uint16_t*>(data);
  switch (type) {
    case ElemType::F32: return static_cast<const float*>(data)[i];
    case ElemType::F16: return f16_to_f32(bits[i]);
    case ElemType::BF16: return bf16_to_f32(bits[i]);
    default: break;
  }
  throw Error(std::string("comm_bench: no check for ") + comm::elem_name(type));
}

// Stores v (a small integer: exact in every type) as element i.
void set_element(void* data, ElemType type, int64_t i, int v) {
  uint16_t* bits = static_cast<uint16_t*>(data);
  switch (type) {
    case ElemType::F32: static_cast<float*>(data)[i] = static_cast<float>(v); return;
    case ElemType::F16: bits[i] = f32_to_f16(static_cast<float>(v)); return;
    case ElemType::BF16: bits[i] = f32_to_bf16(static_cast<float>(v)); return;
    default: break;
  }
  throw Error(std::string("comm_bench: no check for ") + comm::elem_name(type));
}

}  // namespace

Message make_message(const comm::Transport& t, size_t bytes, ElemType type) {
  Message m;
  m.data = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, t.device());
  m.buf.data = m.data.raw_data();
  m.buf.count = static_cast<int64_t>(bytes / comm::elem_size(type));
  m.buf.type = type;
  m.buf.device = t.device();
  return m;
}

void fill_pattern(const comm::Transport& t, Message& m, int rank) {
  const bool on_host = !t.device().is_cuda();
  Tensor host = on_host ? m.data : Tensor::empty({m.data.numel()}, DType::U8);
  const int64_t count = m.buf.count;
  for (int64_t i = 0; i < count; ++i) set_element(host.raw_data(), m.buf.type, i, pattern(i, rank));
  if (!on_host) m.data.copy_(host);
}

bool check_sum(const comm::Transport& t, const Message& m, int n, std::string* what) {
  int expected[11];
  for (int k = 0; k < 11; ++k) {
    expected[k] = 0;
    for (int r = 0; r < n; ++r) expected[k] += pattern(k, r);
  }
  const Tensor host = t.device().is_cuda() ? m.data.to(Device()) : m.data;
  const int64_t count = m.buf.count;
  for (int64_t i = 0; i < count; ++i) {
    const float got = element(host.raw_data(), m.buf.type, i);
    if (got != static_cast<float>(expected[i % 11])) {
      *what = "element " + std::to_string(i) + " of " + std::to_string(count) + " is " +
              fmt("%g", got) + ", expected " + std::to_string(expected[i % 11]);
      return false;
    }
  }
  return true;
}

}  // namespace kiln::apps::comm_bench
