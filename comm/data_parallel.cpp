// data_parallel.cpp: placeholder, being written
