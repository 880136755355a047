// parallel.h: the CPU thread budget.
//
// Kiln uses one thread pool: OpenMP. BLAS and oneDNN calls made inside our OpenMP regions run
// single-threaded (OpenBLAS-openmp checks omp_in_parallel), and calls made outside use the
// calling thread's OpenMP budget. Nested pools that oversubscribe the cores are the trap that
// costs PyTorch speed on small machines. omp_set_num_threads is per calling thread, so a
// pipeline stage or a local data-parallel rank sets its own budget on its own thread.
#pragma once

namespace kiln {

void set_num_threads(int n);  // this thread's budget for OpenMP and BLAS; n >= 1
int num_threads();            // this thread's budget
int hardware_threads();       // cores the OS lets this process use

}  // namespace kiln
