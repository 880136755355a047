// mpi_transport.cpp: placeholder, being written
