// device.cpp: parsing and printing device specs (cpu, cpu:N, cuda, cuda:N).
#include "engine/device.h"

#include <cctype>
#include <ostream>

#include "engine/error.h"

namespace kiln {

Device parse_device(const std::string& spec) {
  auto fail = [&]() -> Device {
    throw Error("invalid device '" + spec + "': use cpu, cpu:N, cuda or cuda:N (N >= 0)",
                ErrorKind::Usage);
  };
  std::string name = spec;
  int index = 0;
  auto colon = spec.find(':');
  if (colon != std::string::npos) {
    name = spec.substr(0, colon);
    std::string num = spec.substr(colon + 1);
    if (num.empty() || num.size() > 6) return fail();
    for (char c : num)
      if (!std::isdigit(static_cast<unsigned char>(c))) return fail();
    index = std::stoi(num);
  }
  if (name == "cpu") return Device(DeviceType::CPU, index);
  if (name == "cuda") return Device(DeviceType::CUDA, index);
  return fail();
}

Device::Device(const char* spec) : Device(parse_device(spec)) {}
Device::Device(const std::string& spec) : Device(parse_device(spec)) {}

std::string Device::str() const {
  return std::string(is_cpu() ? "cpu" : "cuda") + ":" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace kiln
