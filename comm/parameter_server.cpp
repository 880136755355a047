// parameter_server.cpp: placeholder, being written
