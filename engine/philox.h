// philox.h: the Philox4x32-10 counter-based random generator (Salmon et al., SC'11).
//
// A counter-based generator maps (key, counter) to random bits with no hidden state, so
// element i of a dropout mask is a pure function of (seed, offset + i): the CPU and every
// CUDA thread compute the same mask bit for bit, in any order, and a resumed run draws the
// same numbers as an uninterrupted one. The Generator only hands out counter ranges.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "engine/host_device.h"  // KILN_HOST_DEVICE, and uniform01 (random bits -> [0, 1))

namespace kiln {

struct PhiloxOut {
  uint32_t v[4];
};

// Ten rounds of Philox4x32 on counter (c0..c3) with key (k0, k1).
KILN_HOST_DEVICE inline PhiloxOut philox4x32_10(uint64_t key, uint64_t counter) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return PhiloxOut{{c0, c1, c2, c3}};
}

// The i-th 32-bit random number of the stream (key, base): 4 numbers per counter value.
KILN_HOST_DEVICE inline uint32_t philox_u32(uint64_t key, uint64_t base, uint64_t i) {
  return philox4x32_10(key, base + i / 4).v[i % 4];
}

// Hands out disjoint counter ranges of one seed. Thread-safe.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x6b696c6eu) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  // Reserves n numbers; returns the base counter to pass to philox_u32 with index 0..n-1.
  uint64_t reserve(uint64_t n) { return reserve_range(n).base; }
  // The same, with the seed read under the same lock (a concurrent set_state cannot pair a
  // base with the wrong seed).
  struct Range {
    uint64_t seed, base;
  };
  Range reserve_range(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    Range r{seed_, offset_};
    offset_ += (n + 3) / 4;
    return r;
  }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    offset_ = offset;
  }

 private:
  std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The generator used by init and dropout unless one is passed: the process-wide one, or on a
// thread inside a GeneratorScope, that scope's generator.
Generator& default_generator();
void manual_seed(uint64_t seed);  // resets the default generator to (seed, offset 0)

// Makes default_generator() (and so manual_seed, init and dropout) use `gen` on the calling
// thread while the scope lives; other threads are unaffected. Scopes nest. Data-parallel ranks
// that are threads of one process (comm::run_local) each open one, so every rank has its own
// dropout stream instead of drawing interleaved numbers from one shared generator, which would
// make a run depend on thread timing. A Dropout or Conv2d built inside the scope keeps a
// reference to `gen`: keep it alive as long as the model.
class GeneratorScope {
 public:
  explicit GeneratorScope(Generator& gen);
  ~GeneratorScope();
  GeneratorScope(const GeneratorScope&) = delete;
  GeneratorScope& operator=(const GeneratorScope&) = delete;

 private:
  Generator* prev_;
};

}  // namespace kiln
