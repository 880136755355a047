// device.h: where a tensor lives. "cpu", "cpu:1", "cuda", "cuda:0".
//
// Different indices are different places, for CPUs too: t.to("cpu:1") copies exactly as a GPU
// transfer would, so model and pipeline parallelism can be taught and tested on a CPU machine.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(i) {}
  // Parses "cpu", "cpu:N", "cuda", "cuda:N"; anything else throws kiln::Error (Usage).
  Device(const char* spec);         // NOLINT: implicit on purpose, t.to("cuda:1")
  Device(const std::string& spec);  // NOLINT

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

Device parse_device(const std::string& spec);
std::ostream& operator<<(std::ostream& os, const Device& d);

}  // namespace kiln
