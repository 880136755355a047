// message.cpp: see message.h.
#include "apps/comm_bench/message.h"

#include <cmath>

#include "apps/comm_bench/report.h"

namespace kiln::apps::comm_bench {

using comm::ElemType;

uint16_t half_from_int(int v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned a = static_cast<unsigned>(v < 0 ? -v : v);
  int e = 0;
  while ((a >> e) > 1) ++e;                          // a = 1.f * 2^e
  const unsigned mant = (a << (10 - e)) & 0x3ff;     // exact for e <= 10
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | mant);
}

float half_to_float(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0) v = std::ldexp(static_cast<float>(m), -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(m | 0x400), e - 25);
  return (h & 0x8000) ? -v : v;
}

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
  if (m.buf.type == ElemType::F32) {
    float* p = static_cast<float*>(host.raw_data());
    for (int64_t i = 0; i < count; ++i) p[i] = static_cast<float>(pattern(i, rank));
  } else {
    uint16_t* p = static_cast<uint16_t*>(host.raw_data());
    for (int64_t i = 0; i < count; ++i) p[i] = half_from_int(pattern(i, rank));
  }
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
    const float got = m.buf.type == ElemType::F32
                          ? static_cast<const float*>(host.raw_data())[i]
                          : half_to_float(static_cast<const uint16_t*>(host.raw_data())[i]);
    if (got != static_cast<float>(expected[i % 11])) {
      *what = "element " + std::to_string(i) + " of " + std::to_string(count) + " is " +
              fmt("%g", got) + ", expected " + std::to_string(expected[i % 11]);
      return false;
    }
  }
  return true;
}

}  // namespace kiln::apps::comm_bench
