# Parity of whole models (models/) on CUDA against the CPU: ResNet-18, and narrow nets of the
# depth of ResNet-50/101/152, training step and eval forward. Included by CMakeLists.txt here.
kiln_test(resnet_cuda_test SOURCES resnet_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_models)
# A narrow ResNet-18 with 16-bit activations between its layers (bf16, f16; NCHW and
# channels-last) against its f32 step, on cuda:0 with cuDNN.
kiln_test(autocast_activations_cuda_test SOURCES autocast_activations_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_models)
# A training step (CNN and narrow ResNet, f32 and f16 with device-side loss scaling) queues
# its work without one wait for the device (sync debug mode: error), and a fixed number of
# launches (cuda::launch_count()).
kiln_test(train_step_sync_cuda_test SOURCES train_step_sync_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_models)
# The same step captured once into a CUDA graph and replayed equals the eager steps, bit for bit.
kiln_test(train_step_graph_cuda_test SOURCES train_step_graph_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_models)
# Under the simulator, ResNet-18 once more through the simulated cuBLAS and cuDNN
# (engine/cuda/sim): the vendor paths' descriptors, algorithm choice and workspaces, end to end.
if(KILN_CUDA_SIM)
  kiln_test_run(resnet_cuda_test_vendor COMMAND resnet_cuda_test --gtest_filter=ResNetCuda.ResNet18*
    LABELS sim ENVIRONMENT KILN_KERNELS=vendor)
endif()
# Pipelines over cuda:0 / cuda:1 (and one GPU, and mixed CPU/GPU stages) against one CPU device.
# Label pipeline too: its stage threads run in the ThreadSanitizer tree.
kiln_test(pipeline_cuda_test SOURCES pipeline_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} pipeline LIBS kiln_pipeline)
# The same with a random delay before every stream operation: a missing wait between a stage's
# copy and its neighbour's use of the tensor shows as wrong values, not by luck of timing.
if(KILN_CUDA_SIM)
  kiln_test_run(pipeline_cuda_test_delayed COMMAND pipeline_cuda_test --gtest_repeat=3
    LABELS sim ENVIRONMENT KILN_SIM_DELAY_US=300)
endif()
# A training step replayed from a CUDA graph (engine/step_graph.h) equals the eager step bit for
# bit: the MNIST CNN and a narrow ResNet, hand and vendor kernels, f32, bf16, fp16.
kiln_test(step_graph_cuda_test SOURCES step_graph_cuda_test.cpp
          LABELS ${KILN_CUDA_TEST_LABEL} LIBS kiln_models)
