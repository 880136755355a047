// reduce.cpp: placeholder, being written
