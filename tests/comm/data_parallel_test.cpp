// data_parallel_test: DataParallel over the local transport (ranks are threads).
//
//   1. THE equivalence that proves data parallelism right: N = 2, 3, 4 ranks with batch B/N
//      each, after k steps of SGD with momentum, hold the same weights as 1 rank with batch B
//      (within 2e-6 relative: only the order of the additions differs; measured < 1e-7; a
//      gradient off by 0.1% already moves the weights by 2.7e-5), for ring, halving-doubling,
//      binary blocks and the parameter server (co-located shards and a dedicated server rank), with buckets
//      of a few hundred bytes (many buckets) and one 25 MiB bucket; an MLP and a small CNN,
//      no dropout. The ranks start from DIFFERENT initialisations: the constructor's broadcast
//      is what makes them agree. Every rank ends bit-identical to rank 0.
//   2. Broadcast of parameters and buffers (an f32 and an i64 buffer).
//   3. no_sync(): two micro-batches accumulated locally, one allreduce, equal the full batch.
//   4. Compression: f16 and bf16 on the wire, each within its precision of the f32 result, half
//      the bytes; a large gradient overflows f16 (and every rank then skips the step under loss
//      scaling) but not bf16.
//   5. Overlap: buckets are submitted from the grad-ready hooks before backward returns, in
//      bucket order; stats: steps, buckets, comm time, and the ring's 2(N-1)K bytes in total.
//   6. The large-minibatch learning rate; GeneratorScope (each local rank its own generator).
//   7. Gradients as bucket views: after backward each .grad lies in its bucket's buffer;
//      bit-identical weights to the copying path over 3 steps with zero_grad() between them;
//      a parameter unused in a step (by one rank, by all) gets the same gradient either way.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/agreement.h"
#include "comm/communicator.h"
#include "comm/data_parallel.h"
#include "comm/local_transport.h"
#include "comm/parameter_server.h"
#include "engine/autograd.h"
#include "engine/init.h"
#include "engine/ops.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/sgd.h"
#include "engine/parallel.h"
#include "engine/philox.h"
#include "layers/activation.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "models/mlp.h"

namespace kiln::comm {
namespace {

enum class Net { Mlp, Cnn };

constexpr int64_t kClasses = 4;

std::shared_ptr<Module> make_net(Net net) {
  if (net == Net::Mlp) return make_mlp(/*in_features=*/20, {16, 12}, kClasses);
  // 1x8x8 -> conv 4x6x6 -> conv 6x4x4 -> 96 -> 4: six parameter tensors of varied sizes.
  auto s = std::make_shared<Sequential>();
  s->push_back(std::make_shared<Conv2d>(1, 4, 3));
  s->push_back(std::make_shared<ReLU>());
  s->push_back(std::make_shared<Conv2d>(4, 6, 3));
  s->push_back(std::make_shared<ReLU>());
  s->push_back(std::make_shared<Flatten>());
  s->push_back(std::make_shared<Linear>(96, kClasses));
  return s;
}

Shape example_shape(Net net) { return net == Net::Mlp ? Shape{20} : Shape{1, 8, 8}; }

// A fixed synthetic data set of n examples: inputs from their own generator, labels i % 4.
struct Data {
  Tensor x, y;
  Data(Net net, int64_t n) {
    Shape s = example_shape(net);
    s.insert(s.begin(), n);
    x = Tensor::empty(s);
    Generator gen(12345);
    normal_(x, 0.0, 1.0, gen);
    std::vector<int64_t> labels(n);
    for (int64_t i = 0; i < n; ++i) labels[i] = i % kClasses;
    y = Tensor::from_vector<int64_t>(labels, {n});
  }
  // Examples [begin, begin + n) as a batch (copies).
  std::pair<Tensor, Tensor> slice(int64_t begin, int64_t n) const {
    Shape s = x.shape();
    const int64_t per = x.numel() / s[0];
    s[0] = n;
    std::vector<float> xs(x.data<float>() + begin * per, x.data<float>() + (begin + n) * per);
    std::vector<int64_t> ys(y.data<int64_t>() + begin, y.data<int64_t>() + begin + n);
    return {Tensor::from_vector<float>(xs, s), Tensor::from_vector<int64_t>(ys, {n})};
  }
};

constexpr double kLr = 0.05, kMomentum = 0.9;

// The model (and the CNN's input) in `format`: Module::to(MemoryFormat) makes the conv
// weights, and so their gradients in the buckets, channels-last.
void to_format(Module& model, Tensor& x, MemoryFormat format) {
  model.to(format);
  if (x.dim() == 4) x = x.to(format);
}

// One rank, batch B, k steps: the reference.
std::vector<float> train_single(Net net, const Data& data, int64_t batch, int steps,
                                MemoryFormat format = MemoryFormat::Contiguous) {
  Generator gen(7);
  GeneratorScope scope(gen);
  auto model = make_net(net);
  SGD opt(model->parameters(), kLr, kMomentum);
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = data.slice(s * batch, batch);
    to_format(*model, x, format);
    Tensor loss = cross_entropy((*model)(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  return flatten_to_host(model->parameters());
}

struct DistResult {
  std::vector<std::vector<float>> weights;  // per worker rank
  std::vector<DataParallelStats> stats;
  std::vector<int> buckets;
  std::vector<uint64_t> bytes;  // transport bytes of each rank (gradients only)
};

// N worker ranks (plus `servers` dedicated parameter-server ranks), each initialised from its
// own seed, each training on its B/N slice of every global batch.
DistResult train_dist(Net net, const Data& data, int64_t batch, int steps, int n,
                      DataParallelOptions opts, int servers = 0,
                      MemoryFormat format = MemoryFormat::Contiguous) {
  DistResult r;
  r.weights.resize(n);
  r.stats.resize(n);
  r.buckets.resize(n);
  r.bytes.resize(n);
  run_local(n + servers, [&](std::shared_ptr<Transport> t) {
    set_num_threads(1);
    const int rank = t->rank();
    if (rank >= n) {
      PsOptions po;
      po.workers = n;
      po.servers = servers;
      serve(*t, po);
      return;
    }
    // Rank 0 starts where the 1-rank reference does; the others elsewhere (the broadcast fixes it).
    Generator gen(rank == 0 ? 7 : 1000 + 17 * static_cast<uint64_t>(rank));
    GeneratorScope scope(gen);
    auto model = make_net(net);
    model->to(format);
    AlgorithmOptions ao;
    ao.ps_servers = servers;
    auto comm = std::make_shared<Communicator>(t, n, ao);
    {
      DataParallel dp(comm, model->parameters(), {}, opts);
      SGD opt(model->parameters(), kLr, kMomentum);
      const int64_t local = batch / n;
      for (int s = 0; s < steps; ++s) {
        auto [x, y] = data.slice(s * batch + rank * local, local);
        to_format(*model, x, format);
        Tensor loss = cross_entropy((*model)(x), y);
        opt.zero_grad();
        loss.backward();
        dp.synchronize();
        opt.step();
      }
      r.stats[rank] = dp.stats();
      r.buckets[rank] = dp.num_buckets();
      r.bytes[rank] = dp.stats().bytes_sent;
    }
    if (servers > 0) {  // every worker tells the servers it is done
      PsOptions po;
      po.workers = n;
      po.servers = servers;
      ps_shutdown(*t, po);
    }
    r.weights[rank] = flatten_to_host(model->parameters());
  });
  return r;
}

// |a - b| <= tol * (1 + |b|) for every element; reports the worst.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(double(b[i])));
    if (e > worst) worst = e, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": element " << at << " is " << a[at] << ", expected "
                        << b[at];
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

size_t param_bytes(Net net) {
  Generator gen(1);
  GeneratorScope scope(gen);
  size_t bytes = 0;
  for (const Tensor& p : make_net(net)->parameters()) bytes += p.nbytes();
  return bytes;
}

struct Case {
  Net net;
  Algorithm alg;
  size_t bucket_bytes;
  int servers;  // dedicated parameter-server ranks (ps only)
};

std::string describe(const Case& c) {
  return std::string(c.net == Net::Mlp ? "Mlp" : "Cnn") + "_" + algorithm_name(c.alg) +
         (c.bucket_bytes < 4096 ? "_SmallBuckets" : "_OneBucket") +
         (c.servers > 0 ? "_DedicatedServer" : "");
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return describe(info.param); }

void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, NRanksWithBatchBOverNEqualOneRankWithBatchB) {
  const Case c = GetParam();
  constexpr int64_t kBatch = 24;  // divisible by 2, 3 and 4
  constexpr int kSteps = 4;
  const Data data(c.net, kBatch * kSteps);
  const std::vector<float> reference = train_single(c.net, data, kBatch, kSteps);
  for (int n : {2, 3, 4}) {
    if (c.servers > 0 && n == 4) continue;  // keeps the thread count down
    DataParallelOptions opts;
    opts.algorithm = c.alg;
    opts.bucket_bytes = c.bucket_bytes;
    const DistResult r = train_dist(c.net, data, kBatch, kSteps, n, opts, c.servers);
    const std::string what = "N = " + std::to_string(n);
    if (c.bucket_bytes < 4096) {
      EXPECT_GE(r.buckets[0], 3) << what;
    } else {
      EXPECT_EQ(r.buckets[0], 1) << what;
    }
    expect_close(r.weights[0], reference, 2e-6, what + ", rank 0 vs 1 rank");
    for (int k = 1; k < n; ++k) {
      EXPECT_TRUE(bit_equal(r.weights[k], r.weights[0])) << what << ": rank " << k
                                                         << " differs from rank 0";
    }
    // The weights moved: the test would pass for a no-op otherwise.
    const std::vector<float> init = [&] {
      Generator gen(7);
      GeneratorScope scope(gen);
      return flatten_to_host(make_net(c.net)->parameters());
    }();
    EXPECT_FALSE(bit_equal(reference, init));
  }
}

INSTANTIATE_TEST_SUITE_P(
    DataParallel, Equivalence,
    ::testing::Values(Case{Net::Mlp, Algorithm::Ring, 512, 0},
                      Case{Net::Mlp, Algorithm::Ring, size_t{25} << 20, 0},
                      Case{Net::Mlp, Algorithm::HalvingDoubling, 512, 0},
                      Case{Net::Mlp, Algorithm::HalvingDoubling, size_t{25} << 20, 0},
                      Case{Net::Mlp, Algorithm::BinaryBlocks, 512, 0},
                      Case{Net::Mlp, Algorithm::BinaryBlocks, size_t{25} << 20, 0},
                      Case{Net::Mlp, Algorithm::ParameterServer, 512, 0},
                      Case{Net::Mlp, Algorithm::ParameterServer, size_t{25} << 20, 0},
                      Case{Net::Mlp, Algorithm::ParameterServer, 512, 1},
                      Case{Net::Cnn, Algorithm::Ring, 256, 0},
                      Case{Net::Cnn, Algorithm::HalvingDoubling, size_t{25} << 20, 0},
                      Case{Net::Cnn, Algorithm::BinaryBlocks, 256, 0},
                      Case{Net::Cnn, Algorithm::ParameterServer, 256, 0}),
    case_name);

// Channels-last conv weights (Module::to(MemoryFormat)): the broadcast and the buckets carry
// each parameter's bytes as they lie, the same order on every rank, and the gradients come back
// into the parameters' format, as views or copies: the NCHW single-rank weights, every rank
// bit-identical to rank 0.
TEST(DataParallel, ChannelsLastWeightsAverageAsNchwOnes) {
  constexpr int64_t kBatch = 12;
  constexpr int kSteps = 3;
  const Data data(Net::Cnn, kBatch * kSteps);
  const std::vector<float> reference = train_single(Net::Cnn, data, kBatch, kSteps);
  const std::vector<float> single_cl =
      train_single(Net::Cnn, data, kBatch, kSteps, MemoryFormat::ChannelsLast);
  expect_close(single_cl, reference, 2e-6, "1 rank, channels-last");
  for (const bool as_view : {true, false}) {
    DataParallelOptions opts;
    opts.bucket_bytes = 256;  // several buckets
    opts.grad_as_bucket_view = as_view;
    const DistResult r =
        train_dist(Net::Cnn, data, kBatch, kSteps, 2, opts, 0, MemoryFormat::ChannelsLast);
    const std::string what = as_view ? "bucket views" : "copies";
    expect_close(r.weights[0], reference, 2e-6, what + ", rank 0 vs 1 rank NCHW");
    EXPECT_TRUE(bit_equal(r.weights[1], r.weights[0])) << what << ": rank 1 differs from rank 0";
  }
}

TEST(DataParallel, BroadcastMakesDifferentlyInitialisedRanksEqual) {
  constexpr int n = 3;
  std::vector<std::vector<float>> before(n), after(n), bufs(n);
  std::vector<int64_t> steps(n);
  run_local(n, [&](std::shared_ptr<Transport> t) {
    const int rank = t->rank();
    Generator gen(50 + rank);
    GeneratorScope scope(gen);
    auto model = make_net(Net::Cnn);
    Tensor running = Tensor::full({5}, 1.5 * rank);
    Tensor count = Tensor::full({1}, 10.0 * (rank + 1), DType::I64);
    before[rank] = flatten_to_host(model->parameters());
    DataParallel dp(std::make_shared<Communicator>(t), model->parameters(), {running, count});
    after[rank] = flatten_to_host(model->parameters());
    bufs[rank] = running.to_vector<float>();
    steps[rank] = count.to_vector<int64_t>()[0];
  });
  EXPECT_FALSE(bit_equal(before[1], before[0]));  // they did start different
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(bit_equal(after[r], before[0])) << "rank " << r;
    EXPECT_EQ(bufs[r], std::vector<float>(5, 0.0f)) << "rank " << r;
    EXPECT_EQ(steps[r], 10) << "rank " << r;
  }
}

// The gradient of one full batch B on one rank.
std::vector<float> single_grad(const Data& data, int64_t batch) {
  Generator gen(7);
  GeneratorScope scope(gen);
  auto model = make_net(Net::Mlp);
  auto [x, y] = data.slice(0, batch);
  cross_entropy((*model)(x), y).backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : model->parameters()) grads.push_back(p.grad());
  return flatten_to_host(grads);
}

TEST(DataParallel, NoSyncAccumulatesMicroBatchesThenOneAllreduceEqualsTheFullBatch) {
  constexpr int n = 2;
  constexpr int64_t kBatch = 16;
  const Data data(Net::Mlp, kBatch);
  const std::vector<float> reference = single_grad(data, kBatch);
  std::vector<std::vector<float>> grads(n);
  std::vector<int64_t> launched_after_no_sync(n, -1), launched_end(n, -1);
  run_local(n, [&](std::shared_ptr<Transport> t) {
    set_num_threads(1);
    const int rank = t->rank();
    Generator gen(7);
    GeneratorScope scope(gen);
    auto model = make_net(Net::Mlp);
    DataParallelOptions opts;
    opts.bucket_bytes = 1024;
    DataParallel dp(std::make_shared<Communicator>(t), model->parameters(), {}, opts);
    const int64_t local = kBatch / n, micro = local / 2;
    // Each micro-batch's loss is halved: the sum of the two is the mean over `local`.
    {
      auto guard = dp.no_sync();
      auto [x, y] = data.slice(rank * local, micro);
      (cross_entropy((*model)(x), y) * 0.5).backward();
      dp.synchronize();  // a no-op under the guard
    }
    launched_after_no_sync[rank] = dp.stats().buckets_launched;
    auto [x, y] = data.slice(rank * local + micro, micro);
    (cross_entropy((*model)(x), y) * 0.5).backward();
    dp.synchronize();
    launched_end[rank] = dp.stats().buckets_launched;
    std::vector<Tensor> g;
    for (const Tensor& p : model->parameters()) g.push_back(p.grad());
    grads[rank] = flatten_to_host(g);
    EXPECT_EQ(dp.stats().steps, 1);
    EXPECT_EQ(launched_end[rank], dp.num_buckets());
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(launched_after_no_sync[r], 0) << "no_sync() must not communicate";
    expect_close(grads[r], reference, 1e-5, "rank " + std::to_string(r));
  }
}

TEST(DataParallel, SecondBackwardWithoutSynchronizeIsAnError) {
  run_local(1, [&](std::shared_ptr<Transport> t) {
    Generator gen(7);
    GeneratorScope scope(gen);
    auto model = make_net(Net::Mlp);
    DataParallel dp(std::make_shared<Communicator>(t), model->parameters());
    const Data data(Net::Mlp, 4);
    auto [x, y] = data.slice(0, 4);
    cross_entropy((*model)(x), y).backward();
    try {
      cross_entropy((*model)(x), y).backward();
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no_sync"), std::string::npos) << e.what();
    }
    dp.synchronize();
  });
}

TEST(DataParallel, CompressionStaysWithinItsPrecisionAndHalvesTheBytes) {
  constexpr int n = 4;
  constexpr int64_t kBatch = 16;
  const Data data(Net::Mlp, kBatch);
  const std::vector<float> reference = single_grad(data, kBatch);
  float max_ref = 0;
  for (float g : reference) max_ref = std::max(max_ref, std::fabs(g));
  for (WireFormat wire : {WireFormat::Uncompressed, WireFormat::F16, WireFormat::BF16}) {
    SCOPED_TRACE(wire_format_name(wire));
    const bool compressed = wire != WireFormat::Uncompressed;
    std::vector<std::vector<float>> grads(n);
    std::vector<uint64_t> bytes(n);
    run_local(n, [&](std::shared_ptr<Transport> t) {
      set_num_threads(1);
      const int rank = t->rank();
      Generator gen(7);
      GeneratorScope scope(gen);
      auto model = make_net(Net::Mlp);
      DataParallelOptions opts;
      opts.wire = wire;
      opts.bucket_bytes = 4096;
      DataParallel dp(std::make_shared<Communicator>(t), model->parameters(), {}, opts);
      auto [x, y] = data.slice(rank * (kBatch / n), kBatch / n);
      cross_entropy((*model)(x), y).backward();
      dp.synchronize();
      std::vector<Tensor> g;
      for (const Tensor& p : model->parameters()) g.push_back(p.grad());
      grads[rank] = flatten_to_host(g);
      bytes[rank] = dp.stats().bytes_sent;
    });
    uint64_t total = 0;
    for (int r = 0; r < n; ++r) {
      total += bytes[r];
      EXPECT_TRUE(bit_equal(grads[r], grads[0])) << "rank " << r;
    }
    // Ring: every element is sent 2(N-1) times in all, at 4 or 2 bytes.
    EXPECT_EQ(total, 2 * (n - 1) * (reference.size() * (compressed ? 2 : 4)));
    double worst = 0;
    for (size_t i = 0; i < reference.size(); ++i) {
      worst = std::max(worst, std::fabs(double(grads[0][i]) - reference[i]));
    }
    // Each rank's value rounds by half an ulp (2^-11 relative for f16, 2^-8 for bf16), each of
    // the N-1 additions again: with N = 4 at most 8 half-ulps of the largest gradient, 4e-3
    // (f16) and 3.2e-2 (bf16) of it. f32 on the wire is exact to ~1e-7.
    if (compressed) {
      EXPECT_LE(worst, (wire == WireFormat::F16 ? 4e-3 : 3.2e-2) * max_ref);
      EXPECT_GT(worst, 0.0) << "rounding left no trace: was it really compressed?";
    } else {
      EXPECT_LE(worst, 1e-5 * max_ref);
    }
  }
}

// Gradients beyond f16's 65504 (rank r sends 1e5 * (r + 1); the sum is 3e5): on an f16 wire
// they become inf, the average is inf on every rank, and under loss scaling every rank skips the
// step; bf16 keeps f32's range, so the average is right to bf16's precision and the step runs.
TEST(DataParallel, LargeGradientsOverflowF16ButNotBf16) {
  constexpr int n = 2;
  for (WireFormat wire : {WireFormat::F16, WireFormat::BF16}) {
    SCOPED_TRACE(wire_format_name(wire));
    std::vector<std::vector<float>> avg(n);
    std::vector<int> ran(n, -1);
    run_local(n, [&](std::shared_ptr<Transport> t) {
      set_num_threads(1);
      const int rank = t->rank();
      auto comm = std::make_shared<Communicator>(t);
      Tensor p = Tensor::zeros({3}).set_requires_grad(true);
      DataParallelOptions opts;
      opts.wire = wire;
      DataParallel dp(comm, {p}, {}, opts);
      p.set_grad(Tensor::from_vector<float>({1e5f * (rank + 1), 0.5f, -3e4f}, {3}));
      dp.synchronize();
      avg[rank] = p.grad().to_vector<float>();
      GradScalerOptions so;
      so.init_scale = 1;  // the gradients above stand for already scaled ones
      GradScaler scaler(so);
      ran[rank] = scaler.update(any_rank(*comm, scaler.unscale_({p}))) ? 1 : 0;
    });
    for (int r = 0; r < n; ++r) {
      if (wire == WireFormat::F16) {
        EXPECT_TRUE(std::isinf(avg[r][0])) << "rank " << r << ": " << avg[r][0];
        EXPECT_EQ(ran[r], 0) << "rank " << r << " ran a step with an inf gradient";
      } else {
        const std::vector<float> want = {1.5e5f, 0.5f, -3e4f};
        for (size_t i = 0; i < 3; ++i)
          EXPECT_NEAR(avg[r][i], want[i], 0x1p-7 * std::fabs(want[i])) << "rank " << r << " " << i;
        EXPECT_EQ(ran[r], 1) << "rank " << r;
      }
      EXPECT_EQ(avg[r][1], 0.5f) << "rank " << r << ": a small gradient is exact in both";
    }
  }
}

TEST(DataParallel, BucketsAreLaunchedFromHooksWhileBackwardRunsAndStatsAreSane) {
  constexpr int n = 2, kSteps = 3;
  constexpr int64_t kBatch = 16;
  const Data data(Net::Cnn, kBatch * kSteps);
  const size_t bytes_per_step = param_bytes(Net::Cnn);
  std::vector<DataParallelStats> stats(n);
  std::vector<int> buckets(n), during_backward(n), after_backward(n);
  std::vector<std::vector<int>> order(n);
  std::vector<uint64_t> sent(n);
  run_local(n, [&](std::shared_ptr<Transport> t) {
    set_num_threads(1);
    const int rank = t->rank();
    Generator gen(7);
    GeneratorScope scope(gen);
    auto model = make_net(Net::Cnn);
    DataParallelOptions opts;
    opts.bucket_bytes = 256;  // conv1 and conv2's tensors fit; the Linear weight gets its own
    DataParallel dp(std::make_shared<Communicator>(t), model->parameters(), {}, opts);
    SGD opt(model->parameters(), kLr);
    bool in_backward = false;
    dp.set_launch_observer([&](int bucket, bool from_hook) {
      order[rank].push_back(bucket);
      (in_backward && from_hook ? during_backward : after_backward)[rank]++;
    });
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = data.slice(s * kBatch + rank * (kBatch / n), kBatch / n);
      Tensor loss = cross_entropy((*model)(x), y);
      opt.zero_grad();
      in_backward = true;
      loss.backward();
      in_backward = false;
      dp.synchronize();
      opt.step();
    }
    stats[rank] = dp.stats();
    buckets[rank] = dp.num_buckets();
    sent[rank] = dp.stats().bytes_sent;
    // The first bucket holds the LAST registered parameter (reverse registration order).
    EXPECT_EQ(dp.bucket_params(0).front(), model->parameters().size() - 1);
  });
  uint64_t total = 0;
  for (int r = 0; r < n; ++r) {
    const DataParallelStats& st = stats[r];
    ASSERT_GE(buckets[r], 3);
    EXPECT_EQ(during_backward[r], kSteps * buckets[r]) << "every bucket should start inside "
                                                          "backward, from a grad-ready hook";
    EXPECT_EQ(after_backward[r], 0);
    for (size_t i = 0; i < order[r].size(); ++i) {
      EXPECT_EQ(order[r][i], static_cast<int>(i % buckets[r])) << "buckets out of order";
    }
    EXPECT_EQ(st.steps, kSteps);
    EXPECT_EQ(st.buckets_launched, kSteps * buckets[r]);
    EXPECT_EQ(st.buckets_from_hooks, kSteps * buckets[r]);
    EXPECT_GT(st.comm_seconds, 0.0);
    EXPECT_GE(st.exposed_seconds, 0.0);
    EXPECT_GE(st.overlap_fraction(), 0.0);
    EXPECT_LE(st.overlap_fraction(), 1.0);
    total += sent[r];
  }
  EXPECT_EQ(total, static_cast<uint64_t>(kSteps) * 2 * (n - 1) * bytes_per_step);
}

// True when g is a view into `flat`: the same storage, and g's bytes inside flat's.
bool in_bucket(const Tensor& g, const Tensor& flat) {
  if (!g.defined() || g.impl()->storage != flat.impl()->storage) return false;
  const char* begin = static_cast<const char*>(flat.raw_data());
  const char* at = static_cast<const char*>(g.raw_data());
  return at >= begin && at + g.nbytes() <= begin + flat.nbytes();
}

TEST(DataParallel, GradientsAreViewsIntoTheirBucketsFromBackwardOn) {
  constexpr int n = 2, kSteps = 3;
  constexpr int64_t kBatch = 16;
  const Data data(Net::Cnn, kBatch * kSteps);
  for (const bool as_view : {true, false}) {
    SCOPED_TRACE(as_view ? "bucket views" : "copies");
    run_local(n, [&](std::shared_ptr<Transport> t) {
      set_num_threads(1);
      const int rank = t->rank();
      Generator gen(7);
      GeneratorScope scope(gen);
      auto model = make_net(Net::Cnn);
      DataParallelOptions opts;
      opts.bucket_bytes = 256;  // several buckets
      opts.grad_as_bucket_view = as_view;
      DataParallel dp(std::make_shared<Communicator>(t), model->parameters(), {}, opts);
      SGD opt(model->parameters(), kLr);
      std::vector<Tensor> params = model->parameters();
      ASSERT_GE(dp.num_buckets(), 3);
      auto expect_views = [&](const char* when) {
        for (int b = 0; b < dp.num_buckets(); ++b) {
          for (size_t k : dp.bucket_params(b)) {
            const Tensor g = params[k].grad();
            ASSERT_TRUE(g.defined()) << when << ": parameter " << k;
            EXPECT_EQ(in_bucket(g, dp.bucket_buffer(b)), as_view) << when << ": parameter " << k;
          }
        }
      };
      for (int s = 0; s < kSteps; ++s) {
        auto [x, y] = data.slice(s * kBatch + rank * (kBatch / n), kBatch / n);
        Tensor loss = cross_entropy((*model)(x), y);
        opt.zero_grad();
        for (const Tensor& p : params) EXPECT_FALSE(p.grad().defined());
        loss.backward();
        expect_views("after backward");
        dp.synchronize();
        expect_views("after synchronize");
        opt.step();
      }
    });
  }
}

TEST(DataParallel, BucketViewsEqualTheCopyingPathBitForBit) {
  constexpr int kSteps = 3;  // zero_grad() drops the views between steps
  constexpr int64_t kBatch = 12;
  for (const Net net : {Net::Mlp, Net::Cnn}) {
    const Data data(net, kBatch * kSteps);
    const std::vector<float> reference = train_single(net, data, kBatch, kSteps);
    for (const int n : {2, 3}) {
      for (const size_t bucket : {size_t{256}, size_t{25} << 20}) {
        SCOPED_TRACE((net == Net::Mlp ? "mlp, " : "cnn, ") + std::to_string(n) + " ranks, " +
                     std::to_string(bucket) + " byte buckets");
        DataParallelOptions opts;
        opts.bucket_bytes = bucket;
        opts.grad_as_bucket_view = true;
        const DistResult views = train_dist(net, data, kBatch, kSteps, n, opts);
        opts.grad_as_bucket_view = false;
        const DistResult copies = train_dist(net, data, kBatch, kSteps, n, opts);
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(bit_equal(views.weights[r], copies.weights[r])) << "rank " << r;
          expect_close(views.weights[r], reference, 2e-6, "rank " + std::to_string(r));
        }
      }
    }
  }
}

// Three parameters a, b, c; in step 1 only rank 0 uses b and no rank uses c. Returns, per
// rank, the gradients after each synchronize() (flattened, steps concatenated).
std::vector<std::vector<float>> unused_parameter_grads(bool as_view, int n) {
  std::vector<std::vector<float>> out(n);
  run_local(n, [&](std::shared_ptr<Transport> t) {
    set_num_threads(1);
    const int rank = t->rank();
    std::vector<Tensor> params = {Tensor::full({6}, 0.5), Tensor::full({4}, -0.25),
                                  Tensor::full({3}, 2.0)};
    for (Tensor& p : params) p.set_requires_grad(true);
    DataParallelOptions opts;
    opts.bucket_bytes = 28;  // c and b share a bucket (12 + 16 bytes), a has its own
    opts.grad_as_bucket_view = as_view;
    DataParallel dp(std::make_shared<Communicator>(t), params, {}, opts);
    SGD opt(params, kLr, kMomentum);
    for (int s = 0; s < 3; ++s) {
      const bool use_b = s != 1 || rank == 0, use_c = s != 1;
      Tensor loss = sum(mul(params[0], Tensor::full({6}, rank + 1.0 + s)));
      if (use_b) loss = add(loss, sum(mul(square(params[1]), Tensor::full({4}, rank + 0.5))));
      if (use_c) loss = add(loss, sum(mul(params[2], params[2])));
      opt.zero_grad();
      loss.backward();
      dp.synchronize();
      for (size_t k = 0; k < params.size(); ++k) {
        const Tensor g = params[k].grad();
        EXPECT_TRUE(g.defined()) << "step " << s << ", parameter " << k;
        if (!g.defined()) continue;
        if (as_view) {
          const int b = [&] {
            for (int i = 0; i < dp.num_buckets(); ++i)
              for (size_t j : dp.bucket_params(i))
                if (j == k) return i;
            return -1;
          }();
          EXPECT_TRUE(in_bucket(g, dp.bucket_buffer(b))) << "step " << s << ", parameter " << k;
        }
        const std::vector<float> v = g.to_vector<float>();
        if (s == 1 && k == 2) {
          EXPECT_EQ(v, std::vector<float>(3, 0.0f)) << "unused everywhere";
        }
        out[rank].insert(out[rank].end(), v.begin(), v.end());
      }
      opt.step();
    }
  });
  return out;
}

TEST(DataParallel, AnUnusedParameterBehavesTheSameWithBucketViewsAndCopies) {
  constexpr int n = 3;
  const auto views = unused_parameter_grads(true, n);
  const auto copies = unused_parameter_grads(false, n);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(views[r].size(), size_t{3 * 13});
    EXPECT_TRUE(bit_equal(views[r], copies[r])) << "rank " << r;
    EXPECT_TRUE(bit_equal(views[r], views[0])) << "rank " << r;
  }
  // Step 1, parameter b: rank 0's gradient 2 * 0.5 * b over 3 ranks.
  EXPECT_NE(views[0][13 + 6], 0.0f);
}

TEST(DataParallel, OverlapFractionIsTheHiddenShareOfCommunication) {
  DataParallelStats s;
  EXPECT_EQ(s.overlap_fraction(), 0.0);  // nothing communicated, nothing hidden
  s.comm_seconds = 2.0;
  s.exposed_seconds = 0.5;
  EXPECT_DOUBLE_EQ(s.overlap_fraction(), 0.75);
  s.exposed_seconds = 3.0;  // waited longer than the allreduces ran (queueing): clamp
  EXPECT_EQ(s.overlap_fraction(), 0.0);
}

TEST(DataParallel, LargeMinibatchScheduleWarmsUpLinearlyToWorldSizeTimesTheRate) {
  auto s = large_minibatch_schedule(0.1, 4, /*warmup_steps=*/10, /*decay_every=*/100, 0.5);
  EXPECT_NEAR(s->lr_at(0), 0.1, 1e-12);  // the single-rank rate
  EXPECT_NEAR(s->lr_at(5), 0.1 * (0.25 + 0.75 * 0.5) * 4, 1e-12);
  EXPECT_NEAR(s->lr_at(10), 0.4, 1e-12);
  EXPECT_NEAR(s->lr_at(99), 0.4, 1e-12);
  EXPECT_NEAR(s->lr_at(100), 0.2, 1e-12);
  auto one = large_minibatch_schedule(0.1, 1, 10, 0, 1.0);
  EXPECT_NEAR(one->lr_at(0), 0.1, 1e-12);
  EXPECT_NEAR(one->lr_at(1000), 0.1, 1e-12);
}

TEST(GeneratorScope, EachThreadDrawsFromItsOwnGeneratorAndTheDefaultIsUntouched) {
  manual_seed(99);
  const uint64_t before = default_generator().offset();
  std::vector<std::vector<float>> draws(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      Generator gen;
      GeneratorScope scope(gen);
      manual_seed(5);  // seeds this thread's generator only
      EXPECT_EQ(&default_generator(), &gen);
      Tensor t = Tensor::empty({64});
      uniform_(t, 0, 1);
      draws[i] = t.to_vector<float>();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(draws[0], draws[1]);  // same seed, own streams: same numbers
  EXPECT_EQ(default_generator().offset(), before);
  EXPECT_EQ(default_generator().seed(), 99u);
  Generator outer(1), inner(2);
  {
    GeneratorScope a(outer);
    {
      GeneratorScope b(inner);
      EXPECT_EQ(&default_generator(), &inner);
    }
    EXPECT_EQ(&default_generator(), &outer);  // scopes nest
  }
  EXPECT_NE(&default_generator(), &outer);
}

}  // namespace
}  // namespace kiln::comm
