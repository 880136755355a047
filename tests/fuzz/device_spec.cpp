// device_spec.cpp: fuzz target for the device spec parser (engine/device.h: "cpu", "cpu:N",
// "cuda", "cuda:N"). The input is the spec string. A Usage error is the expected answer to a
// bad spec; a spec that parses must name a device with index >= 0 whose printed form parses
// back to the same device.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine/device.h"
#include "engine/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  kiln::Device d;
  try {
    d = kiln::parse_device(spec);
  } catch (const kiln::Error& e) {
    if (e.kind() != kiln::ErrorKind::Usage) std::abort();
    return 0;
  }
  if (d.index < 0 || kiln::parse_device(d.str()) != d) std::abort();
  return 0;
}
