// parallel.cpp: the per-thread CPU thread budget (OpenMP and BLAS).
#include "engine/parallel.h"

#include <omp.h>
#include <sched.h>

#include <thread>

#include "engine/error.h"

extern "C" void openblas_set_num_threads(int);

namespace kiln {

void set_num_threads(int n) {
  KILN_CHECK_INPUT(n >= 1, "thread count must be >= 1, got ", n);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

}  // namespace kiln
