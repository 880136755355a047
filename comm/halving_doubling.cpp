// halving_doubling.cpp: placeholder, being written
