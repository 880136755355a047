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
//
// Under CUDA graph capture (engine/step_graph.h) a kernel's arguments are recorded once
// and replayed unchanged, so a base counter passed by value would give every replay the same
// dropout mask. During a capture the generator therefore hands out bases relative to the
// capture's start, with `device_offset`: a device scalar the kernel adds to the base when it
// runs. Before each replay the graph's owner sets that scalar to offset() and advances the
// generator by the counters one replay consumes (advance()), so replay k draws exactly the
// numbers an eager step k would. PyTorch's CUDA generator does the same ("philox_cuda_state":
// a seed, an offset pointer and an intra-graph offset).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x6b696c6eu) : seed_(seed) {}

  uint64_t seed() const { return seed_; }

  // Reserves n numbers; returns the base counter to pass to philox_u32 with index 0..n-1.
  uint64_t reserve(uint64_t n) { return reserve_range(n).base; }

  // The same, with the seed read under the same lock (a concurrent set_state cannot pair a
  // base with the wrong seed). While a graph captures, base is relative and device_offset is
  // the device scalar to add to it (null otherwise): only device kernels can honour it.
  struct Range {
    uint64_t seed, base;
    const uint64_t* device_offset = nullptr;
  };
  Range reserve_range(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    Range r{seed_, offset_, capture_offset_};
    offset_ += (n + 3) / 4;
    return r;
  }

  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    offset_ = offset;
  }

  // Graph capture: ranges reserved until end_capture() count from 0 and carry device_offset.
  // end_capture() restores the offset held before the capture and returns the counters the
  // captured work consumes (what advance() must add per replay).
  void begin_capture(const uint64_t* device_offset) {
    std::lock_guard<std::mutex> lock(mu_);
    saved_offset_ = offset_;
    offset_ = 0;
    capture_offset_ = device_offset;
  }
  uint64_t end_capture() {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t consumed = offset_;
    offset_ = saved_offset_;
    capture_offset_ = nullptr;
    return consumed;
  }
  bool capturing() const { return capture_offset_ != nullptr; }
  void advance(uint64_t counters) {
    std::lock_guard<std::mutex> lock(mu_);
    offset_ += counters;
  }

 private:
  std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
  uint64_t saved_offset_ = 0;
  const uint64_t* capture_offset_ = nullptr;
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
