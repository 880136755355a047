// mnist_test.cpp: strict IDX validation (each malformed file is an Input error naming the
// file), loading and normalisation of a tiny synthetic IDX pair, and the real MNIST files
// when datasets/fetch_mnist.sh has installed them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include "data/mnist.h"
#include "engine/error.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

// An IDX images file of `count` images of rows x cols; pixel k of image i is (i*31 + k) % 256.
Bytes images_idx(uint32_t count, uint32_t rows = 28, uint32_t cols = 28, uint32_t magic = 2051) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, count);
  put_be32(b, rows);
  put_be32(b, cols);
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t k = 0; k < rows * cols; ++k) b.push_back(static_cast<uint8_t>((i * 31 + k) % 256));
  }
  return b;
}

Bytes labels_idx(const Bytes& labels, uint32_t magic = 2049) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// A fresh directory per test, removed afterwards.
class MnistFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kiln_mnist_test_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string images_path() const { return path("train-images-idx3-ubyte"); }
  std::string labels_path() const { return path("train-labels-idx1-ubyte"); }
  void write(const std::string& p, const Bytes& b) const {
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  // A valid pair of 3 examples, labels 7, 0, 9.
  void write_valid() const {
    write(images_path(), images_idx(3));
    write(labels_path(), labels_idx({7, 0, 9}));
  }
  MnistDataset load(int64_t limit = -1) const {
    return MnistDataset::load(dir_.string(), MnistSplit::Train, limit);
  }
  // Loading must throw an Input error whose message names `file` and contains `what`.
  void expect_input_error(const std::string& file, const std::string& what) const {
    try {
      load();
      ADD_FAILURE() << "no error; expected one naming " << file << " with '" << what << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }

  fs::path dir_;
};

TEST_F(MnistFiles, MissingFileSaysHowToFetch) {
  write(labels_path(), labels_idx({1}));
  expect_input_error(images_path(), "not found");
  expect_input_error(images_path(), "datasets/fetch_mnist.sh");
  write(images_path(), images_idx(1));
  fs::remove(labels_path());
  expect_input_error(labels_path(), "not found");
}

// A path that cannot be reached says the system's reason, not "not found". A loop of symbolic
// links (ELOOP) fails for root too; a directory that may not be searched (EACCES) only for
// other users (root ignores permission bits), so that half skips as root.
TEST_F(MnistFiles, UnreachablePathSaysTheSystemsReason) {
  const fs::path loop = dir_ / "loop";
  fs::create_directory_symlink(loop, loop);  // loop -> loop
  try {
    MnistDataset::load(loop.string(), MnistSplit::Train);
    ADD_FAILURE() << "no error for a path through a loop of symbolic links";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    EXPECT_NE(std::string(e.what()).find((loop / "train-images-idx3-ubyte").string()),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Too many levels of symbolic links"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("not found"), std::string::npos) << e.what();
  }
  if (geteuid() == 0) GTEST_SKIP() << "root ignores permission bits: the EACCES half is skipped";
  write_valid();
  fs::permissions(dir_, fs::perms::none);
  std::string message;
  try {
    load();
  } catch (const Error& e) {
    message = e.what();
  }
  fs::permissions(dir_, fs::perms::owner_all);
  EXPECT_NE(message.find(images_path()), std::string::npos) << message;
  EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
}

// A set of 0 images would train on nothing and report a loss of 0 as a result.
TEST_F(MnistFiles, EmptySetIsRefused) {
  write(images_path(), images_idx(0));
  write(labels_path(), labels_idx({}));
  expect_input_error(images_path(), "holds no images");
}

TEST_F(MnistFiles, BadMagic) {
  write_valid();
  write(images_path(), images_idx(3, 28, 28, /*magic=*/2052));
  expect_input_error(images_path(), "bad magic number 2052");
  write_valid();
  write(labels_path(), labels_idx({7, 0, 9}, /*magic=*/0x01000008));  // little-endian written
  expect_input_error(labels_path(), "bad magic");
}

TEST_F(MnistFiles, SwappedFilesAreRecognised) {
  write(images_path(), labels_idx({7, 0, 9}));
  write(labels_path(), images_idx(3));
  expect_input_error(images_path(), "swapped");
}

TEST_F(MnistFiles, GzipFileIsRecognised) {
  write_valid();
  write(images_path(), Bytes{0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00});
  expect_input_error(images_path(), "gzip");
}

TEST_F(MnistFiles, WrongDims) {
  write(images_path(), images_idx(3, 28, 27));
  write(labels_path(), labels_idx({7, 0, 9}));
  expect_input_error(images_path(), "28x27");
}

TEST_F(MnistFiles, TruncatedImages) {
  write_valid();
  Bytes img = images_idx(3);
  img.resize(img.size() - 100);
  write(images_path(), img);
  expect_input_error(images_path(), "truncated");
  // Cut inside the header, and an empty file.
  write(images_path(), Bytes(img.begin(), img.begin() + 10));
  expect_input_error(images_path(), "truncated");
  write(images_path(), Bytes{});
  expect_input_error(images_path(), "too short");
}

TEST_F(MnistFiles, TrailingBytes) {
  write_valid();
  Bytes img = images_idx(3);
  img.push_back(0);
  write(images_path(), img);
  expect_input_error(images_path(), "1 trailing bytes");
  write_valid();
  Bytes lab = labels_idx({7, 0, 9});
  lab.push_back(1);
  lab.push_back(2);
  write(labels_path(), lab);
  expect_input_error(labels_path(), "2 trailing bytes");
}

TEST_F(MnistFiles, CountMismatch) {
  write(images_path(), images_idx(3));
  write(labels_path(), labels_idx({7, 0, 9, 4}));
  expect_input_error(images_path(), "3 images");
  expect_input_error(labels_path(), "4 labels");
}

TEST_F(MnistFiles, LabelOutOfRange) {
  write(images_path(), images_idx(3));
  write(labels_path(), labels_idx({7, 10, 9}));
  expect_input_error(labels_path(), "label 10 at index 1");
}

TEST_F(MnistFiles, ValidPairLoadsAndNormalises) {
  write_valid();
  MnistDataset ds = load();
  EXPECT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.example_shape(), (Shape{1, 28, 28}));
  EXPECT_EQ(ds.num_classes(), 10);
  EXPECT_NE(ds.describe().find(images_path()), std::string::npos);
  std::vector<float> x(784);
  const int64_t expected_labels[] = {7, 0, 9};
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ds.get(i, x.data()), expected_labels[i]);
    for (int64_t k = 0; k < 784; ++k) {
      const uint8_t pixel = static_cast<uint8_t>((i * 31 + k) % 256);
      EXPECT_EQ(ds.image_bytes(i)[k], pixel);
      // torchvision: ToTensor (x / 255) then Normalize((0.1307,), (0.3081,)), in float32.
      const float want = (static_cast<float>(pixel) / 255.0f - 0.1307f) / 0.3081f;
      ASSERT_EQ(x[static_cast<size_t>(k)], want) << "example " << i << " pixel " << k;
    }
  }
  // The two ends of the range, as PyTorch prints them.
  EXPECT_NEAR(MnistDataset::normalize_pixel(0), -0.4242129623889923, 1e-7);
  EXPECT_NEAR(MnistDataset::normalize_pixel(255), 2.821486711502075, 1e-6);
  EXPECT_THROW(ds.get(3, x.data()), Error);
  EXPECT_THROW(ds.get(-1, x.data()), Error);
}

TEST_F(MnistFiles, Limit) {
  write_valid();
  EXPECT_EQ(load(2).size(), 2);
  EXPECT_EQ(load(1).label(0), 7);
  EXPECT_EQ(load(100).size(), 3);  // more than there is: everything
  try {
    load(0);
    FAIL() << "limit 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
  }
  // A limit does not skip validation of the rest of the file.
  write(labels_path(), labels_idx({7, 0, 10}));
  EXPECT_THROW(load(1), Error);
}

// The real data set, when datasets/fetch_mnist.sh has been run.
fs::path real_mnist_dir() {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  return fs::path(src ? src : ".") / "datasets" / "mnist";
}

TEST(MnistReal, SizesLabelsAndPixelStatistics) {
  const fs::path dir = real_mnist_dir();
  if (!fs::exists(dir / "train-images-idx3-ubyte")) {
    GTEST_SKIP() << "real MNIST not found in " << dir << ": run datasets/fetch_mnist.sh";
  }
  MnistDataset train = MnistDataset::load(dir.string(), MnistSplit::Train);
  MnistDataset test = MnistDataset::load(dir.string(), MnistSplit::Test);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.label(0), 5);  // the famous first training digit
  EXPECT_EQ(test.label(0), 7);
  // The normalisation constants are the training set's: mean 0.1307 and std 0.3081 of x/255,
  // so the normalised training pixels have mean ~0 and std ~1.
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < train.size(); ++i) {
    const uint8_t* p = train.image_bytes(i);
    for (int k = 0; k < 784; ++k) {
      const double v = p[k] / 255.0;
      sum += v;
      sum_sq += v * v;
    }
  }
  const double n = 60000.0 * 784.0, mean = sum / n, std = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.1307, 5e-5);
  EXPECT_NEAR(std, 0.3081, 5e-5);
  // Every class is present in both splits.
  std::vector<int> counts(10, 0);
  for (int64_t i = 0; i < test.size(); ++i) counts[static_cast<size_t>(test.label(i))]++;
  for (int c = 0; c < 10; ++c) EXPECT_GT(counts[static_cast<size_t>(c)], 800) << "class " << c;
}

}  // namespace
}  // namespace kiln
