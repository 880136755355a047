# data_parallel_tests.cmake: being written
