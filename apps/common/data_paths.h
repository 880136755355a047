// data_paths.h: where an app looks for a dataset when no --data is given.
#pragma once

#include <string>

namespace kiln::apps {

// `relative` (e.g. "datasets/mnist") under the source tree this app was built from, when it
// exists there (where datasets/fetch_mnist.sh puts MNIST), so the app finds its data from any
// working directory; otherwise `relative` itself, resolved from the working directory.
std::string in_source_tree(const std::string& relative);

}  // namespace kiln::apps
