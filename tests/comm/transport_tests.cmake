# transport_tests.cmake: being written
