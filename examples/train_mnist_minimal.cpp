// train_mnist_minimal: the smallest complete Kiln training program, to read first.
//
//   build/examples/train_mnist_minimal [MNIST_DIR] [TRAIN_IMAGES]   (default datasets/mnist, all)
//
// The MNIST CNN, a loader with two worker threads, Adadelta, the zero_grad / forward /
// backward / step loop for one epoch, then the test accuracy. apps/mnist_train is the same
// with every option (devices, data parallelism, checkpoints, schedules, reports).
#include <cstdint>
#include <cstdio>
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

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "datasets/mnist";
  const int64_t limit = argc > 2 ? std::stoll(argv[2]) : -1;
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
  } catch (const Error& e) {
    std::fprintf(stderr, "train_mnist_minimal: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {  // e.g. a TRAIN_IMAGES that is not a number
    std::fprintf(stderr, "train_mnist_minimal: %s\n", e.what());
    return 2;
  }
  return 0;
}
