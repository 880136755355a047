// stb_instrumented.cpp: stb_image's, stb_image_resize's and stb_image_write's (for
// data/idx_export.cpp) implementations, compiled into kiln_data in the fuzz build only
// (KILN_FUZZ, data/CMakeLists.txt) so that libFuzzer sees their branches and AddressSanitizer
// their memory accesses. Every other build links Debian's
// libstb.so, built from the same headers. Thread-local failure reasons, as in libstb:
// stb_image.h defines STBI_THREAD_LOCAL itself for C++11.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include "stb_image.h"
#include "stb_image_resize.h"
#include "stb_image_write.h"
