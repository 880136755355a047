# algorithm_tests.cmake: being written
