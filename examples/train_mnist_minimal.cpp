// train_mnist_minimal: the smallest complete Kiln training program, to read first.
//
//   build/examples/train_mnist_minimal [MNIST_DIR] [TRAIN_IMAGES]   (default datasets/mnist, all)
//   build/examples/train_mnist_minimal --help
//
// The MNIST CNN, a loader with two worker threads, Adadelta, the zero_grad / forward /
// backward / step loop for one epoch, then the test accuracy. apps/mnist_train is the same
// with every option (devices, data parallelism, checkpoints, schedules, reports).
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/adadelta.h"
#include "engine/philox.h"
#include "layers/loss.h"
#include "models/mnist_cnn.h"

using namespace kiln;

constexpr char kUsage[] =
    "usage: train_mnist_minimal [MNIST_DIR] [TRAIN_IMAGES]\n"
    "  MNIST_DIR     the directory of the four MNIST IDX files (default datasets/mnist;\n"
    "                datasets/fetch_mnist.sh downloads them)\n"
    "  TRAIN_IMAGES  train on the first N training images only (default: all 60,000)\n"
    "Trains the MNIST CNN for one epoch and prints the test accuracy.\n";

// Bad usage: the message, the usage text, exit code 2 (Kiln's apps do the same).
int usage_error(const std::string& message) {
  std::fprintf(stderr, "train_mnist_minimal: error: %s\n%s", message.c_str(), kUsage);
  return 2;
}

int main(int argc, char** argv) {
  // The arguments, checked before any work: at most two, no options but --help.
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a.size() > 1 && a[0] == '-') return usage_error("unknown option " + a);
  }
  if (argc > 3) return usage_error("too many arguments");
  const std::string dir = argc > 1 ? argv[1] : "datasets/mnist";
  int64_t limit = -1;
  if (argc > 2) {
    const char* text = argv[2];
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE || v < 1) {
      return usage_error(std::string("TRAIN_IMAGES must be a whole number of at least 1 (got ") +
                         text + ")");
    }
    limit = v;
  }
  try {
    MnistDataset train = MnistDataset::load(dir, MnistSplit::Train, limit);
    MnistDataset test = MnistDataset::load(dir, MnistSplit::Test);
    manual_seed(1);  // the weights' initialisation and dropout draw from this generator
    std::shared_ptr<Sequential> model = make_mnist_cnn();
    Adadelta optimizer(model->parameters(), /*lr=*/1.0);

    // Batches of 128 in a new random order every epoch, built by 2 worker threads ahead of use.
    LoaderOptions options;
    options.batch_size = 128;
    options.workers = 2;
    Loader loader(train, std::make_shared<RandomSampler>(train.size(), /*seed=*/1), options);

    model->train();
    loader.start_epoch(0);
    Batch batch;
    while (loader.next(batch)) {
      optimizer.zero_grad();
      Tensor loss = cross_entropy(model->forward(batch.inputs), batch.labels);
      loss.backward();  // every parameter's .grad
      optimizer.step();
      if (batch.index % 100 == 0) {
        std::printf("batch %4lld  loss %.4f\n", static_cast<long long>(batch.index), loss.item());
      }
    }

    // Evaluation: no dropout, no graph.
    model->eval();
    NoGradGuard no_grad;
    options.workers = 0;
    options.batch_size = 1000;
    Loader test_loader(test, std::make_shared<SequentialSampler>(test.size()), options);
    test_loader.start_epoch(0);
    int64_t correct = 0;
    while (test_loader.next(batch)) {
      Tensor predicted = argmax(model->forward(batch.inputs), /*dim=*/1);
      const std::vector<int64_t> p = predicted.to_vector<int64_t>();
      const std::vector<int64_t> y = batch.labels.to_vector<int64_t>();
      for (size_t i = 0; i < p.size(); ++i) correct += p[i] == y[i];
    }
    std::printf("test accuracy %.2f%% (%lld of %lld)\n", 100.0 * correct / test.size(),
                static_cast<long long>(correct), static_cast<long long>(test.size()));
  } catch (const Error& e) {  // bad input (a missing MNIST file: exit 2) or a runtime failure
    std::fprintf(stderr, "train_mnist_minimal: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mnist_minimal: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
