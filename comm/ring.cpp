// ring.cpp: placeholder, being written
