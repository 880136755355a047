// reduce_cuda.cu: placeholder, being written
