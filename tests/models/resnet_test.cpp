// resnet_test.cpp: models/resnet.h against torchvision 0.14 (PyTorch 1.13): names, shapes and
// parameter counts; one train step (forward, loss, backward, running statistics) and an eval
// forward of ResNet-18 and of a narrow Bottleneck ResNet compared with torchvision's, under
// both kernel implementations (Impl::Hand and Impl::Vendor); load_torchvision_weights() and
// its errors; pieces(); fold_batch_norms(). The fixtures come from
// tests/reference/make_resnet_fixtures.py (formats and the weight formula in its docstring).
//
// Tolerances (where they come from). Tensors are compared with testing::close(): element i
// passes when |actual_i - expected_i| <= rtol * (|expected_i| + max_j |expected_j|), i.e.
// relative to the element and to the tensor's scale (tests/support/fixture.h). A network is a
// chain of f32 sums (convolutions of up to 4608 terms, BN statistics over up to 1152 values)
// that Kiln adds in another order than PyTorch or oneDNN: each layer adds a few ulps
// (u = 6e-8) of error, amplified by the conditioning of what follows. The fixture script only
// accepts cases where that amplification is small: the same step in f64 agrees with PyTorch's
// f32 one to 3e-6 (forward) and 3e-5 (gradients); measured 1.7e-6 and 8.4e-6 for ResNet-18,
// 1.4e-6 and 5.9e-6 for the narrow net. It also keeps every ReLU input and max-pool decision
// 2e-5 away from its kink, where rounding could flip it (and a flipped ReLU moves a gradient
// by far more than rounding). Values:
//  - forward (logits in train and eval mode), loss, running statistics: rtol 3e-5;
//  - gradients: rtol 3e-4, per element (all of them for the narrow net; for ResNet-18 a
//    sample of up to 64 per parameter, judged against the largest |element| of the whole
//    gradient, as close() would) and for the L2 norm (|n_k - n_t| <= rtol * n_t); the sum
//    as |s_k - s_t| <= rtol * sqrt(numel) * n_t (the sum of the element errors e is at most
//    sqrt(n) * |e|_2, and |e|_2 is rtol-small against the norm);
//  - fold_batch_norms(): rtol 2e-6 (eval logits before and after; each weight rounded once
//    more to f32 and the sums reordered: a few ulps per layer through 17 layers);
//  - num_batches_tracked, weights loaded from a checkpoint, pieces() against forward(): exact.
// Measured (2 threads, worst of both impls and both nets): forward 2.2e-6, loss 1.9e-7,
// running statistics 2.3e-6, gradient element 8.9e-6, gradient norm 2.4e-6, gradient sum
// 0.7% of its bound, fold 9.7e-8: every tolerance has a margin of >= 10x.
// KILN_PARITY_VERBOSE=1 prints every comparison and the worst error of each kind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/impl.h"
#include "engine/optim/sgd.h"
#include "engine/serialize.h"
#include "layers/batchnorm2d.h"
#include "layers/layout.h"
#include "layers/loss.h"
#include "models/resnet.h"
#include "support/fixture.h"
#include "support/gradcheck.h"

namespace kiln {

// So gtest prints "hand"/"vendor" for a parameter, not its bytes (found by ADL).
inline void PrintTo(Impl impl, std::ostream* os) { *os << impl_name(impl); }

namespace {

namespace fs = std::filesystem;
using testing::Fixture;
using testing::close;
using testing::equal;
using testing::fixture_dir;
using testing::verbose;

constexpr double kRtolForward = 3e-5;  // logits, loss, running statistics
constexpr double kRtolGrad = 3e-4;     // gradients: elements, norms, sums (see the top)
constexpr double kRtolFold = 2e-6;     // eval logits before and after fold_batch_norms()

// The narrow Bottleneck net of resnet_bottleneck_small.{kiln,kfix}.
ResNetConfig small_bottleneck_config() {
  ResNetConfig c;
  c.block = ResNetBlock::Bottleneck;
  c.layers = {2, 1, 1, 1};
  c.num_classes = 5;
  c.width_per_group = 16;
  c.base_planes = 8;
  return c;
}

std::string small_kiln_path() { return (fixture_dir() / "resnet_bottleneck_small.kiln").string(); }

// The worst measured error of one kind across a test, printed with KILN_PARITY_VERBOSE=1.
struct Worst {
  std::map<std::string, std::pair<double, std::string>> by_kind;
  void note(const std::string& kind, double err, const std::string& what) {
    auto& w = by_kind[kind];
    if (err >= w.first) w = {err, what};
  }
  void print(const std::string& title) const {
    if (!verbose()) return;
    std::printf("%s: worst errors\n", title.c_str());
    for (const auto& [kind, w] : by_kind)
      std::printf("  %-18s %.3e  (%s)\n", kind.c_str(), w.first, w.second.c_str());
  }
};

// max_i |a_i - e_i| / (|e_i| + max_j |e_j|): the quantity close() bounds.
double scaled_error(const Tensor& actual, const Tensor& expected) {
  const auto a = actual.to_vector<double>();
  const auto e = expected.to_vector<double>();
  double scale = 0, worst = 0;
  for (double v : e) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < e.size() && i < a.size(); ++i) {
    const double denom = std::fabs(e[i]) + scale;
    worst = std::max(worst, denom > 0 ? std::fabs(a[i] - e[i]) / denom : std::fabs(a[i] - e[i]));
  }
  return worst;
}

// close(), recording the error in `worst` under `kind`.
::testing::AssertionResult close_noted(Worst& worst, const std::string& kind,
                                       const std::string& what, const Tensor& actual,
                                       const Tensor& expected, double rtol) {
  if (actual.defined() && actual.shape() == expected.shape())
    worst.note(kind, scaled_error(actual, expected), what);
  return close(what, actual, expected, rtol);
}

// |actual - expected| <= bound, recording |actual - expected| / bound * rtol under `kind`
// (so it reads on the same scale as rtol).
::testing::AssertionResult within(Worst& worst, const std::string& kind, const std::string& what,
                                  double actual, double expected, double bound, double rtol) {
  const double err = std::fabs(actual - expected);
  worst.note(kind, bound > 0 ? err / bound * rtol : err, what);
  if (err <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " is " << actual << " but PyTorch says "
                                       << expected << " (|error| " << err << " > " << bound
                                       << ")";
}

std::string error_of(const std::function<void()>& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A fresh directory under the system's temp dir, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("kiln_resnet_test_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// ---- torchvision's names, shapes and parameter counts ----------------------------------------

struct KeyLine {
  std::string name, dtype;
  Shape shape;
};

struct TorchvisionKeys {
  std::map<std::string, std::vector<KeyLine>> params, buffers;  // by model, in order
  std::map<std::string, std::pair<int64_t, int64_t>> counts;   // parameters, state_dict entries
};

// Parses resnet_keys.txt (format: make_resnet_fixtures.py).
TorchvisionKeys read_torchvision_keys() {
  const fs::path path = fixture_dir() / "resnet_keys.txt";
  std::ifstream in(path);
  KILN_CHECK_INPUT(in.good(), "cannot open ", path.string(), ": generate it with "
                   "`/usr/bin/python3 tests/reference/make_resnet_fixtures.py`");
  TorchvisionKeys keys;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    std::string model, kind;
    is >> model >> kind;
    if (kind == "count") {
      int64_t params = -1, entries = -1;
      is >> params >> entries;
      KILN_CHECK_INPUT(!is.fail(), path.string(), ": bad line '", line, "'");
      keys.counts[model] = {params, entries};
      continue;
    }
    KeyLine k;
    is >> k.name >> k.dtype;
    KILN_CHECK_INPUT(!is.fail() && (kind == "param" || kind == "buffer"), path.string(),
                     ": bad line '", line, "'");
    for (int64_t d; is >> d;) k.shape.push_back(d);
    (kind == "param" ? keys.params : keys.buffers)[model].push_back(k);
  }
  return keys;
}

const char* short_dtype(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::I64: return "i64";
    default: return dtype_name(t);
  }
}

// Kiln's tensors against torchvision's, in order: same names, dtypes and shapes, except that a
// 0-d PyTorch tensor (num_batches_tracked) is [1] in Kiln.
void expect_same_keys(const std::string& what, const NamedTensors& kiln,
                      const std::vector<KeyLine>& torchvision) {
  ASSERT_EQ(kiln.size(), torchvision.size()) << what << ": number of tensors";
  for (size_t i = 0; i < kiln.size(); ++i) {
    const auto& [name, t] = kiln[i];
    const KeyLine& k = torchvision[i];
    EXPECT_EQ(name, k.name) << what << " #" << i;
    const Shape expected = k.shape.empty() ? Shape{1} : k.shape;
    EXPECT_EQ(shape_str(t.shape()), shape_str(expected)) << what << " " << name;
    EXPECT_EQ(short_dtype(t.dtype()), k.dtype) << what << " " << name;
  }
}

// Each net is built once (building ResNet-152 draws 60M normal numbers): the counts of all
// five, and for resnet18 and resnet50 every name, dtype and shape in order.
TEST(ResNetNames, KeysShapesAndCountsMatchTorchvision) {
  // torchvision 0.14's parameter counts at 1000 classes (sum of numel over parameters()).
  // The fixture has them too, with the state_dict sizes; both are checked, so a fixture
  // regenerated with a torchvision that disagrees shows here.
  const std::map<std::string, int64_t> known{{"resnet18", 11689512}, {"resnet34", 21797672},
                                             {"resnet50", 25557032}, {"resnet101", 44549160},
                                             {"resnet152", 60192808}};
  const TorchvisionKeys tv = read_torchvision_keys();
  ASSERT_EQ(tv.counts.size(), known.size());
  for (const auto& [name, params] : known) {
    ASSERT_TRUE(tv.counts.count(name)) << name << " not in the fixture";
    EXPECT_EQ(tv.counts.at(name).first, params) << name;
    auto model = make_resnet(name);
    EXPECT_EQ(model->num_parameters(), params) << name;
    EXPECT_EQ(static_cast<int64_t>(model->state_dict().size()), tv.counts.at(name).second)
        << name << ": state_dict entries";
    if (name == "resnet18" || name == "resnet50") {
      ASSERT_TRUE(tv.params.count(name) && tv.buffers.count(name)) << name << " not in fixture";
      expect_same_keys(name + " parameters", model->named_parameters(), tv.params.at(name));
      expect_same_keys(name + " buffers", model->named_buffers(), tv.buffers.at(name));
    }
  }
  EXPECT_EQ(tv.params.size(), 2u);
}

// ---- ResNet-18 with weights from a formula -----------------------------------------------------

// splitmix64's output function (Steele, Lea, Flood, OOPSLA 2014), as in the fixture script.
uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fills every parameter from the formula of make_resnet_fixtures.py: u(p, i) uniform in
// [-1, 1) from the parameter's ordinal p and the element index i; u / sqrt(fan_in) for conv
// and fc (fc.bias with fc.weight's fan_in), 1 + u / 8 and u / 8 for BN weight and bias.
void fill_hashed(ResNet& model) {
  const NamedTensors params = model.named_parameters();
  const std::map<std::string, Tensor> by_name(params.begin(), params.end());
  for (size_t p = 0; p < params.size(); ++p) {
    const std::string& name = params[p].first;
    Tensor t = params[p].second;  // a handle: copy_ below writes the model's parameter
    const std::string owner = name.substr(0, name.rfind('.')) + ".weight";
    const Tensor& scale_from = t.dim() >= 2 ? t : by_name.count(owner) ? by_name.at(owner) : t;
    const bool is_weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    const int64_t n = t.numel();
    std::vector<float> v(static_cast<size_t>(n));
    const double fan_in =
        static_cast<double>(scale_from.numel() / std::max<int64_t>(1, scale_from.size(0)));
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t h = splitmix64((static_cast<uint64_t>(p) << 32) + static_cast<uint64_t>(i));
      const double u = static_cast<double>(h >> 11) * 0x1p-52 - 1.0;
      double value;
      if (scale_from.dim() >= 2)
        value = u / std::sqrt(fan_in);
      else
        value = is_weight ? 1.0 + u / 8.0 : u / 8.0;
      v[static_cast<size_t>(i)] = static_cast<float>(value);
    }
    t.copy_(Tensor::from_vector(v, t.shape()));
  }
}

// The sample indices of make_resnet_fixtures.py: floor(k * numel / n), n = min(64, numel).
std::vector<int64_t> sample_indices(int64_t numel) {
  const int64_t n = std::min<int64_t>(64, numel);
  std::vector<int64_t> out;
  for (int64_t k = 0; k < n; ++k) out.push_back(k * numel / n);
  return out;
}

class ResNet18Parity : public ::testing::TestWithParam<Impl> {};

TEST_P(ResNet18Parity, TrainStepAndEvalMatchTorchvision) {
  const Impl impl = GetParam();
  const std::string tag = std::string("resnet18 [") + impl_name(impl) + "]";
  KernelsGuard kernels(impl);
  Fixture f("resnet18_hashed");
  auto model = make_resnet("resnet18", 10);
  fill_hashed(*model);
  // The same weights as torchvision's, to the bit, before anything is compared.
  for (const auto& [name, t] : model->named_parameters())
    ASSERT_EQ(static_cast<int64_t>(crc32(t.raw_data(), t.nbytes())),
              f.integer("param_crc32." + name))
        << name << ": the weight formula differs from make_resnet_fixtures.py's";

  Worst worst;
  model->train();
  Tensor logits = model->forward(f.tensor("x"));
  Tensor loss = cross_entropy(logits, f.tensor("labels"));
  loss.backward();
  EXPECT_TRUE(close_noted(worst, "forward", tag + " logits_train", logits,
                          f.tensor("logits_train"), kRtolForward));
  EXPECT_TRUE(close_noted(worst, "loss", tag + " loss", loss.reshape({1}), f.tensor("loss"),
                          kRtolForward));

  for (const auto& [name, p] : model->named_parameters()) {
    const Tensor g = p.grad();
    ASSERT_TRUE(g.defined()) << tag << " " << name << " has no gradient";
    const std::vector<double> gv = g.to_vector<double>();
    double norm2 = 0, sum = 0;
    for (double v : gv) {
      norm2 += v * v;
      sum += v;
    }
    const double norm = std::sqrt(norm2), norm_t = f.real("grad_norm." + name);
    EXPECT_TRUE(within(worst, "grad norm", tag + " grad_norm." + name, norm, norm_t,
                       kRtolGrad * norm_t, kRtolGrad));
    EXPECT_TRUE(within(worst, "grad sum", tag + " grad_sum." + name, sum,
                       f.real("grad_sum." + name),
                       kRtolGrad * std::sqrt(static_cast<double>(gv.size())) * norm_t,
                       kRtolGrad));
    // The sample, judged as close() judges the whole gradient: against its largest element,
    // not the sample's (a gradient can be much smaller at the sampled places than elsewhere).
    const std::vector<int64_t> at = sample_indices(g.numel());
    const std::vector<double> expected = f.tensor("grad_sample." + name).to_vector<double>();
    ASSERT_EQ(expected.size(), at.size()) << name;
    const double scale = f.real("grad_absmax." + name);
    size_t bad = at.size();
    double ratio = 0;  // the worst |error| / (|e| + scale)
    for (size_t k = 0; k < at.size(); ++k) {
      const double e = expected[k], a = gv[static_cast<size_t>(at[k])];
      const double r = std::fabs(a - e) / (std::fabs(e) + scale);
      if (!(r <= ratio)) {  // also catches NaN
        ratio = r;
        bad = k;
      }
    }
    worst.note("grad element", ratio, tag + " grad_sample." + name);
    EXPECT_LE(ratio, kRtolGrad) << tag << " grad_sample." << name << ": element " << at[bad]
                                << " is " << gv[static_cast<size_t>(at[bad])]
                                << " but PyTorch says " << expected[bad] << " (largest |grad| "
                                << scale << ")";
  }
  int bns = 0;
  for (const auto& [name, b] : model->named_buffers()) {
    for (const std::string stat : {"running_mean", "running_var"}) {
      const std::string suffix = "." + stat;
      if (name.size() <= suffix.size() ||
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      const std::string key = stat + "." + name.substr(0, name.size() - suffix.size());
      EXPECT_TRUE(close_noted(worst, "running stats", tag + " " + key, b, f.tensor(key),
                              kRtolForward));
      ++bns;
    }
  }
  EXPECT_EQ(bns, 2 * 20) << "resnet18 has 20 BatchNorms";
  for (const auto& [name, b] : model->named_buffers()) {
    if (b.dtype() == DType::I64) {
      EXPECT_EQ(b.item(), 1.0) << name << " after one train step";
    }
  }

  model->eval();
  NoGradGuard no_grad;
  EXPECT_TRUE(close_noted(worst, "forward", tag + " logits_eval", model->forward(f.tensor("x")),
                          f.tensor("logits_eval"), kRtolForward));
  worst.print(tag);
}

INSTANTIATE_TEST_SUITE_P(Torchvision, ResNet18Parity, ::testing::Values(Impl::Hand, Impl::Vendor),
                         [](const auto& info) { return std::string(impl_name(info.param)); });

// ---- The narrow Bottleneck net, weights from torchvision through a checkpoint -----------------

std::shared_ptr<ResNet> load_small_bottleneck() {
  auto model = make_resnet(small_bottleneck_config());
  load_torchvision_weights(*model, small_kiln_path());
  return model;
}

TEST(ResNetCheckpoint, LoadsEveryTensorExactly) {
  auto model = load_small_bottleneck();
  const Checkpoint ckpt = read_checkpoint(small_kiln_path());
  const auto state = model->state_dict();
  ASSERT_EQ(state.size(), ckpt.tensors.size());
  for (const auto& [name, t] : state) {
    ASSERT_TRUE(ckpt.tensors.count(name)) << name;
    EXPECT_TRUE(close(name, t, ckpt.tensors.at(name), 0.0));  // shape, dtype, values: exact
  }
  // num_batches_tracked (3 in the fixture) came through as [1] i64.
  EXPECT_EQ(state.at("layer2.0.downsample.1.num_batches_tracked").item(), 3.0);
}

// tools/export_torchvision.py writes what kiln::write_checkpoint writes, byte for byte.
TEST(ResNetCheckpoint, ExporterWritesWhatKilnWrites) {
  TempDir dir;
  const Checkpoint ckpt = read_checkpoint(small_kiln_path());  // validates CRCs and layout
  EXPECT_EQ(ckpt.meta.at("format"), "torchvision");
  EXPECT_EQ(ckpt.meta.at("num_classes"), "5");
  const std::string again = dir.file("again.kiln");
  write_checkpoint(again, ckpt.tensors, ckpt.meta);
  const std::string a = read_bytes(small_kiln_path()), b = read_bytes(again);
  ASSERT_GT(a.size(), 1000u);
  EXPECT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b) << "the exported file and Kiln's rewrite of it differ";
}

class BottleneckParity : public ::testing::TestWithParam<Impl> {};

TEST_P(BottleneckParity, TrainStepAndEvalMatchTorchvision) {
  const Impl impl = GetParam();
  const std::string tag = std::string("bottleneck_small [") + impl_name(impl) + "]";
  KernelsGuard kernels(impl);
  Fixture f("resnet_bottleneck_small");
  auto model = load_small_bottleneck();
  Worst worst;
  model->train();
  Tensor logits = model->forward(f.tensor("x"));
  Tensor loss = cross_entropy(logits, f.tensor("labels"));
  loss.backward();
  EXPECT_TRUE(close_noted(worst, "forward", tag + " logits_train", logits,
                          f.tensor("logits_train"), kRtolForward));
  EXPECT_TRUE(close_noted(worst, "loss", tag + " loss", loss.reshape({1}), f.tensor("loss"),
                          kRtolForward));
  for (const auto& [name, p] : model->named_parameters())
    EXPECT_TRUE(close_noted(worst, "grad element", tag + " grad." + name, p.grad(),
                            f.tensor("grad." + name), kRtolGrad));
  for (const auto& [name, b] : model->named_buffers()) {
    if (b.dtype() == DType::I64) {
      EXPECT_TRUE(equal(tag + " " + name, b, f.tensor("state_after." + name)));  // 3 -> 4
    } else {
      EXPECT_TRUE(close_noted(worst, "running stats", tag + " " + name, b,
                              f.tensor("state_after." + name), kRtolForward));
    }
  }
  EXPECT_EQ(model->named_buffers().size(), 3u * 20);  // 20 BatchNorms, 3 buffers each
  model->eval();
  NoGradGuard no_grad;
  EXPECT_TRUE(close_noted(worst, "forward", tag + " logits_eval", model->forward(f.tensor("x")),
                          f.tensor("logits_eval"), kRtolForward));
  worst.print(tag);
}

INSTANTIATE_TEST_SUITE_P(Torchvision, BottleneckParity,
                         ::testing::Values(Impl::Hand, Impl::Vendor),
                         [](const auto& info) { return std::string(impl_name(info.param)); });

// ---- load_torchvision_weights(): every mismatch is an input error naming file and key ---------

// Loads `path` into `model` expecting an Input error whose message names the file and `key`;
// the model must be left as it was.
void expect_load_error(ResNet& model, const std::string& path, const std::string& key,
                       const std::string& what) {
  const auto before = model.state_dict();
  std::map<std::string, std::vector<double>> values;
  for (const auto& [name, t] : before) values[name] = t.to_vector<double>();
  ErrorKind kind = ErrorKind::Runtime;
  const std::string msg = error_of([&] { load_torchvision_weights(model, path); }, &kind);
  EXPECT_EQ(kind, ErrorKind::Input) << what << ": " << msg;
  EXPECT_TRUE(contains(msg, path)) << what << ": the message does not name the file: " << msg;
  EXPECT_TRUE(contains(msg, "'" + key + "'"))
      << what << ": the message does not name '" << key << "': " << msg;
  for (const auto& [name, t] : model.state_dict())
    EXPECT_EQ(t.to_vector<double>(), values.at(name))
        << what << ": a failed load changed " << name;
}

TEST(ResNetCheckpoint, LoadErrorsNameTheFileAndTheKey) {
  TempDir dir;
  auto small = make_resnet(small_bottleneck_config());
  const std::map<std::string, Tensor> state = load_small_bottleneck()->state_dict();

  // Another architecture, each way round: the small net's file into ResNet-18 (its stem
  // already differs), and a BasicBlock net of the same widths into the small net (stem equal,
  // layer1.0.conv1 is 3x3 8 -> 8 instead of 1x1 8 -> 2).
  auto r18 = make_resnet("resnet18", 5);
  expect_load_error(*r18, small_kiln_path(), "conv1.weight", "small net into resnet18");
  ResNetConfig basic = small_bottleneck_config();
  basic.block = ResNetBlock::Basic;
  const std::string basic_path = dir.file("basic.kiln");
  write_checkpoint(basic_path, make_resnet(basic)->state_dict());
  expect_load_error(*small, basic_path, "layer1.0.conv1.weight", "basic net into bottleneck");

  auto missing = state;
  missing.erase("layer2.0.bn2.running_var");
  const std::string missing_path = dir.file("missing.kiln");
  write_checkpoint(missing_path, missing);
  expect_load_error(*small, missing_path, "layer2.0.bn2.running_var", "missing key");

  auto extra = state;
  extra.emplace("layer5.0.conv1.weight", Tensor::zeros({4, 4, 1, 1}));
  const std::string extra_path = dir.file("extra.kiln");
  write_checkpoint(extra_path, extra);
  expect_load_error(*small, extra_path, "layer5.0.conv1.weight", "extra key");

  auto reshaped = state;
  reshaped["fc.bias"] = Tensor::zeros({6});
  const std::string shape_path = dir.file("shape.kiln");
  write_checkpoint(shape_path, reshaped);
  expect_load_error(*small, shape_path, "fc.bias", "wrong shape");

  // A file that is not there is an input error naming it too.
  ErrorKind kind = ErrorKind::Runtime;
  const std::string absent = dir.file("absent.kiln");
  const std::string msg = error_of([&] { load_torchvision_weights(*small, absent); }, &kind);
  EXPECT_EQ(kind, ErrorKind::Input) << msg;
  EXPECT_TRUE(contains(msg, absent)) << msg;
}

// ---- pieces() ------------------------------------------------------------------------------------

TEST(ResNetPieces, InOrderTheyAreForwardAndShareTheParameters) {
  auto model = load_small_bottleneck();
  const std::vector<ResNetPiece> pieces = model->pieces();
  std::vector<std::string> names;
  for (const auto& piece : pieces) names.push_back(piece.name);
  EXPECT_EQ(names, (std::vector<std::string>{"stem", "layer1.0", "layer1.1", "layer2.0",
                                             "layer3.0", "layer4.0", "head"}));

  // Every parameter and buffer of a piece is the model's tensor (the same TensorImpl) under
  // the piece's prefix, and together the pieces hold each of the model's tensors once.
  const NamedTensors model_params = model->named_parameters();
  const NamedTensors model_buffers = model->named_buffers();
  const std::map<std::string, Tensor> params(model_params.begin(), model_params.end());
  const std::map<std::string, Tensor> buffers(model_buffers.begin(), model_buffers.end());
  size_t n_params = 0, n_buffers = 0;
  for (const auto& piece : pieces) {
    const std::string prefix = piece.name == "stem" || piece.name == "head" ? "" : piece.name + ".";
    for (const auto& [name, t] : piece.module->named_parameters()) {
      ++n_params;
      ASSERT_TRUE(params.count(prefix + name)) << piece.name << ": " << name;
      EXPECT_TRUE(t.same(params.at(prefix + name))) << piece.name << ": " << name;
    }
    for (const auto& [name, t] : piece.module->named_buffers()) {
      ++n_buffers;
      ASSERT_TRUE(buffers.count(prefix + name)) << piece.name << ": " << name;
      EXPECT_TRUE(t.same(buffers.at(prefix + name))) << piece.name << ": " << name;
    }
  }
  EXPECT_EQ(n_params, model_params.size());
  EXPECT_EQ(n_buffers, model_buffers.size());

  // Running the pieces in order is forward(), bit for bit, in both modes. (In training the
  // output does not depend on the running statistics that each pass updates.)
  Fixture f("resnet_bottleneck_small");
  const Tensor x = f.tensor("x");
  NoGradGuard no_grad;
  for (const bool training : {true, false}) {
    model->train(training);
    Tensor y = x;
    for (const auto& piece : pieces) y = piece.module->forward(y);
    const std::string mode = training ? "train" : "eval";
    EXPECT_TRUE(close("pieces vs forward (" + mode + ")", y, model->forward(x), 0.0));
  }
}

// ---- fold_batch_norms() --------------------------------------------------------------------------

class ResNetFold : public ::testing::TestWithParam<Impl> {};

TEST_P(ResNetFold, FoldedEvalLogitsMatchAndTheBatchNormsAreGone) {
  const std::string tag = std::string("fold [") + impl_name(GetParam()) + "]";
  KernelsGuard kernels(GetParam());
  Fixture f("resnet_bottleneck_small");
  const Tensor x = f.tensor("x"), labels = f.tensor("labels");
  auto model = load_small_bottleneck();
  // A few steps, so weights and running statistics are far from their initial values.
  SGD opt(model->parameters(), 0.05, 0.9);
  model->train();
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    cross_entropy(model->forward(x), labels).backward();
    opt.step();
  }
  const int64_t params_before = model->num_parameters();
  int64_t bn_channels = 0;
  for (const auto& [name, b] : model->named_buffers())
    if (contains(name, "running_mean")) bn_channels += b.numel();
  model->eval();
  NoGradGuard no_grad;
  const Tensor before = model->forward(x);
  model->fold_batch_norms();
  EXPECT_TRUE(model->folded());
  const Tensor after = model->forward(x);
  EXPECT_TRUE(close(tag + " eval logits", after, before, kRtolFold));

  // No BatchNorm is left; every convolution has a bias (its BN's shift).
  const auto state = model->state_dict();
  int convs = 0;
  for (const auto& [name, t] : state) {
    EXPECT_FALSE(contains(name, "bn") || contains(name, "downsample.1.") ||
                 contains(name, "running_") || contains(name, "num_batches_tracked"))
        << name << " survived folding";
    if (t.dim() == 4) {
      ++convs;
      const std::string bias = name.substr(0, name.size() - 6) + "bias";  // "weight" -> "bias"
      ASSERT_TRUE(state.count(bias)) << name << " has no bias after folding";
      EXPECT_EQ(state.at(bias).shape(), (Shape{t.size(0)})) << bias;
    }
  }
  EXPECT_EQ(convs, 1 + 3 * 5 + 4);  // stem, 3 per block, 4 downsamples
  // Each BN's weight and bias (2 C) became its convolution's bias (C).
  EXPECT_EQ(model->num_parameters(), params_before - bn_channels);
  EXPECT_TRUE(model->named_buffers().empty());

  // The pieces run the folded convolutions too.
  Tensor y = x;
  for (const auto& piece : model->pieces()) y = piece.module->forward(y);
  EXPECT_TRUE(close(tag + " folded pieces vs forward", y, after, 0.0));

  // A folded model cannot train, nor be folded again.
  model->train();
  EXPECT_THROW(model->forward(x), Error);
  model->eval();
  EXPECT_THROW(model->fold_batch_norms(), Error);
}

INSTANTIATE_TEST_SUITE_P(BothImpls, ResNetFold, ::testing::Values(Impl::Hand, Impl::Vendor),
                         [](const auto& info) { return std::string(impl_name(info.param)); });

TEST(ResNetFoldMode, NeedsEvalMode) {
  auto model = make_resnet(small_bottleneck_config());
  model->train();
  EXPECT_THROW(model->fold_batch_norms(), Error);
  EXPECT_FALSE(model->folded());
  EXPECT_EQ(model->named_buffers().size(), 3u * 20);  // nothing was folded
}

// Every standard depth trains and evaluates on the CPU: three SGD steps on one batch (32x32,
// the smallest input) give finite losses and change every parameter and every running
// statistic, and eval mode gives finite logits of the right shape. (The loss of a deep net on
// four images need not fall step by step: torchvision's nets do the same in PyTorch; the
// values themselves are checked against torchvision by the parity tests above.) The vendor kernels (the
// channel-blocked layout) for every depth; the hand kernels, much slower, for one net of each
// block kind.
TEST(ResNetDepths, EveryDepthTrainsAndEvaluates) {
  for (const char* name : {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}) {
    const bool with_hand = std::string(name) == "resnet18" || std::string(name) == "resnet50";
    for (Impl impl : {Impl::Vendor, Impl::Hand}) {
      if (impl == Impl::Hand && !with_hand) continue;
      SCOPED_TRACE(::testing::Message() << name << " " << impl_name(impl));
      KernelsGuard kernels(impl);
      auto model = make_resnet(name, 7);
      // Four images: layer4 is 1x1 at 32x32, so its BNs normalise 4 values per channel.
      Tensor x = testing::random_tensor({4, 3, 32, 32}, 90, -1, 1, DType::F32);
      Tensor y = Tensor::from_vector(std::vector<int64_t>{3, 5, 0, 6}, {4});
      std::map<std::string, Tensor> before;
      for (auto& [key, t] : model->state_dict()) before[key] = t.clone();
      SGD opt(model->parameters(), 0.01);
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        Tensor loss = cross_entropy(model->forward(x), y);
        loss.backward();
        opt.step();
        EXPECT_TRUE(std::isfinite(loss.item()) && loss.item() < 50) << "step " << step << ": "
                                                                    << loss.item();
      }
      for (auto& [key, t] : model->state_dict()) {
        if (key.find("num_batches_tracked") != std::string::npos) continue;
        EXPECT_GT(testing::max_abs_diff(t, before.at(key)), 0.0) << key << " did not change";
      }
      model->eval();
      NoGradGuard no_grad;
      Tensor logits = model->forward(x);
      ASSERT_EQ(logits.shape(), Shape({4, 7}));
      for (double v : logits.to_vector<double>()) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

// MNIST's ResNet-18 (mnist_train --model resnet18): a 1-channel stem and 28x28 images, which
// every stride-2 layer rounds up: 14 after the stem's convolution, then 7, 4, 2, 1. The stem's
// weight is (64, 1, 7, 7), so the net has torchvision's count less 2 x 64 x 49 stem weights and
// the 990 x 513 of the 990 classes it lacks; a 3-channel batch is refused.
TEST(ResNetInChannels, OneChannel28x28ReachesLayer4At1x1) {
  ResNetConfig config = resnet_config("resnet18", 10);
  config.in_channels = 1;
  auto model = make_resnet(config);
  EXPECT_EQ(model->num_parameters(), 11689512 - 2 * 64 * 49 - 990 * 513);
  model->eval();
  NoGradGuard no_grad;
  Tensor y = testing::random_tensor({2, 1, 28, 28}, 91, -1, 1, DType::F32);
  std::vector<int64_t> sides;
  for (const ResNetPiece& piece : model->pieces()) {
    y = piece.module->forward(y);
    // Between pieces the CPU's vendor kernels keep activations channel-blocked (5-D).
    const Tensor plain = is_channel_blocked(y) ? from_channel_blocks(y) : y;
    if (plain.dim() == 4) sides.push_back(plain.size(2));
  }
  // The stem (after its max-pool), then the eight blocks of layer1..layer4.
  EXPECT_EQ(sides, (std::vector<int64_t>{7, 7, 7, 4, 4, 2, 2, 1, 1}));
  ASSERT_EQ(y.shape(), Shape({2, 10}));
  for (double v : y.to_vector<double>()) ASSERT_TRUE(std::isfinite(v));
  EXPECT_THROW(model->forward(testing::random_tensor({2, 3, 28, 28}, 92, -1, 1, DType::F32)),
               Error);
}

}  // namespace
}  // namespace kiln
