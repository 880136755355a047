# The residual blocks of models/resnet.h (BasicBlock, Bottleneck): their function against an
# unfused composition of the ops, and gradient checks in double. Included by CMakeLists.txt here.
kiln_test(resnet_block_test SOURCES resnet_block_test.cpp LABELS unit gradcheck LIBS kiln_models)
