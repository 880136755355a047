// collectives.cpp: placeholder, being written
