// train_swish: trains the Swish MLP of spirals.h and prints the loss falling, the learnt betas
// and the held-out accuracy.
//
//   ./train_swish [DEVICE] [STEPS]      (default: cpu 300; DEVICE cuda or cuda:N with a CUDA
//                                        backend, real or simulated)
#include <cstdio>
#include <string>

#include "engine/error.h"
#include "spirals.h"

int main(int argc, char** argv) {
  try {
    const kiln::Device device(argc > 1 ? argv[1] : "cpu");
    const int steps = argc > 2 ? std::stoi(argv[2]) : 300;
    std::printf("Swish MLP on three spirals, %d full-batch Adam steps on %s\n", steps,
                device.str().c_str());
    const swish_example::TrainResult r = swish_example::train_spirals(device, steps, 50);
    std::printf("loss %.4f -> %.4f, learnt beta %.3f and %.3f\n", r.first_loss, r.final_loss,
                r.beta1, r.beta2);
    std::printf("final test accuracy %.2f%%\n", 100.0 * r.accuracy);
    return 0;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "train_swish: %s\n", e.what());
    return e.exit_code();
  }
}
