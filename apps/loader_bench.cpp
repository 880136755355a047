// loader_bench: measures the data loader, alone and inside a training loop (docs/data_loading.md).
//
//   loader_bench --mode throughput --format idx         --csv out/loader/throughput.csv
//   loader_bench --mode throughput --format imagefolder --data datasets/mnist_png --append ...
//   loader_bench --mode train --workers 0,2 --extra-decode-us 0 --csv out/loader/train.csv
//   loader_bench --mode h2d --device cuda                  (pinned vs pageable bandwidth)
//
// Modes:
//   throughput  images/s of the Loader alone (no model, no training): for each --workers count
//               (default 0,1,2,4,8), --warmup-batches untimed batches, then --repeats windows
//               of --batches timed ones (the median window is reported) from a seeded
//               RandomSampler (epochs restart as needed). The consumer only
//               receives each batch, so this is the rate at which the loader can feed a
//               trainer that costs nothing.
//   train       the loader experiment: the MNIST CNN (models/mnist_cnn.h), Adadelta lr 1.0,
//               batch 128, --steps steps after --warmup-steps, with each batch costing real
//               decode work (ImageFolder PNGs, plus --extra-decode-us of busy CPU per image to
//               emulate heavier JPEGs), once per --workers count (default 0,2). Per run:
//                 median step ms     host time from asking for a batch to the optimizer step
//                 images/s           timed images / timed wall time (device drained at the end)
//                 loader_wait_fraction  time spent inside Loader::next() / timed wall time: the
//                                    share of the run in which the trainer had nothing to do
//                 device_idle_fraction (--device cuda) 1 - GPU busy / GPU span, where busy is
//                                    the sum over steps of the cuda::Event time around the
//                                    compute (forward, backward, step) and span is the event
//                                    time from the first step's start to the last step's end
//   h2d         (--device cuda) host-to-device bandwidth, GB/s, of Tensor::to(cuda) from a
//               pageable tensor vs from a pinned one (Tensor::pin_memory, non_blocking), for
//               --h2d-max-mb sizes from 1 MB doubling, median of --reps, timed with events.
//
// CSV (--csv PATH; --append adds rows below an existing file's header):
//   throughput: dataset,workers,prefetch,pin_memory,batch_size,images_per_sec,seconds
//   train:      dataset,workers,prefetch,pin_memory,batch_size,threads,steps,extra_decode_us,
//               device,simulated,median_step_ms,images_per_sec,loader_wait_fraction,
//               device_idle_fraction,seconds,final_loss
//   h2d:        size_mb,pageable_gb_per_s,pinned_gb_per_s,ratio,simulated
// tools/plot.py turns them into charts; tools/loader_experiment.sh runs the whole experiment.
// --json PATH writes the same rows as JSON ({"app", "mode", "rows": [{column: value}]}), once the
// mode has finished; the table goes to stdout either way.
//
// Under the CUDA simulator (-DKILN_CUDA_SIM=ON) a "GPU" is the CPU: every line holding a figure
// that went through the CUDA path (--device cuda, --pin-memory, mode h2d) says SIMULATED, and
// such a figure measures the simulator, never a GPU.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "apps/common/csv_out.h"
#include "apps/common/data_paths.h"
#include "apps/common/flag_checks.h"
#include "apps/common/output_paths.h"
#include "apps/common/progress.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "data/transforms.h"
#include "engine/autograd.h"
#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/optim/adadelta.h"
#include "engine/output_file.h"
#include "engine/parallel.h"
#include "engine/philox.h"
#include "layers/loss.h"
#include "models/mnist_cnn.h"


using namespace kiln;
using apps::Clock;
using apps::seconds_since;

namespace {

struct Options {
  std::string mode = "throughput";
  std::string dataset = "idx";  // --format
  std::string data;  // default: per dataset (see default_data_dir)
  std::vector<int> workers;
  int prefetch = 2;
  bool pin_memory = false;
  int64_t batch_size = 128;
  int batches = 200, warmup_batches = 10, repeats = 3;
  int steps = 100, warmup_steps = 5;
  int64_t extra_decode_us = 0;
  std::string device = "cpu";
  int threads = 1;
  uint64_t seed = 1;
  std::string shape = "1,28,28";  // synthetic examples
  int64_t synthetic_size = 60000;
  int h2d_max_mb = 256, reps = 10;
  std::string csv;
  bool append = false;
  std::string json;
};

Shape parse_shape(const std::string& s) {
  Shape shape;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      shape.push_back(std::stoll(item));
    } catch (const std::exception&) {
      shape.clear();
      break;
    }
    if (shape.back() < 1) break;
  }
  if (shape.size() != 3 || shape[0] < 1 || shape[1] < 1 || shape[2] < 1) {
    throw Error("--shape " + s + ": expected three positive sizes C,H,W, e.g. 3,32,32",
                ErrorKind::Usage);
  }
  return shape;
}

// Burns `us` microseconds of CPU on the calling thread: the cost of a heavier decode (a JPEG of
// a real photo takes milliseconds), without touching memory or sleeping (a sleep would free the
// core, which a real decoder does not).
void spin_for_us(int64_t us) {
  if (us <= 0) return;
  const auto until = Clock::now() + std::chrono::microseconds(us);
  while (Clock::now() < until) {
  }
}

// A dataset whose get() costs --extra-decode-us more than the one it wraps.
class ExtraDecodeDataset : public Dataset {
 public:
  ExtraDecodeDataset(std::unique_ptr<Dataset> inner, int64_t extra_us)
      : inner_(std::move(inner)), extra_us_(extra_us) {}
  int64_t size() const override { return inner_->size(); }
  Shape example_shape() const override { return inner_->example_shape(); }
  int64_t num_classes() const override { return inner_->num_classes(); }
  int64_t get(int64_t index, float* out) const override {
    const int64_t label = inner_->get(index, out);
    spin_for_us(extra_us_);
    return label;
  }
  std::string describe() const override {
    return inner_->describe() + " + " + std::to_string(extra_us_) + " us of extra decode per image";
  }

 private:
  std::unique_ptr<Dataset> inner_;
  int64_t extra_us_;
};

// The data set of --format, and the transform that makes its examples look like the IDX path's
// (ImageFolder decodes to [0,1]; mnist_train normalises both formats the same way).
struct Data {
  std::unique_ptr<Dataset> dataset;
  std::shared_ptr<const Compose> transform;  // null: none
};

std::shared_ptr<const Compose> mnist_normalize(const Shape& example_shape) {
  std::vector<std::shared_ptr<const Transform>> steps;
  steps.push_back(std::make_shared<Normalize>(std::vector<float>{MnistDataset::kMean},
                                              std::vector<float>{MnistDataset::kStd}));
  return std::make_shared<Compose>(example_shape, std::move(steps));
}

Data open_data(const Options& o) {
  Data d;
  if (o.dataset == "idx") {
    const std::string dir = o.data.empty() ? apps::in_source_tree("datasets/mnist") : o.data;
    d.dataset = std::make_unique<MnistDataset>(MnistDataset::load(dir, MnistSplit::Train));
  } else if (o.dataset == "imagefolder") {
    // DIR/train/<class>/*.png as apps/idx_to_imagefolder writes it, or DIR/<class>/*.png.
    std::string dir = o.data.empty() ? apps::in_source_tree("datasets/mnist_png") : o.data;
    std::error_code ec;
    if (std::filesystem::is_directory(std::filesystem::path(dir) / "train", ec)) dir += "/train";
    d.dataset = std::make_unique<ImageFolderDataset>(ImageFolderDataset::open(dir));
    d.transform = mnist_normalize(d.dataset->example_shape());
  } else {
    d.dataset = std::make_unique<SyntheticDataset>(o.synthetic_size, parse_shape(o.shape),
                                                   /*classes=*/10, o.seed);
  }
  if (o.extra_decode_us > 0) {
    d.dataset = std::make_unique<ExtraDecodeDataset>(std::move(d.dataset), o.extra_decode_us);
  }
  return d;
}

// One batch of --format's examples in f32 (the loader keeps --prefetch of them and one per
// worker): refused before the loader allocates them when it cannot fit in memory.
void check_batch_fits(const Options& o, const Data& d) {
  double example_numel = 1;
  for (const int64_t n : d.dataset->example_shape()) example_numel *= static_cast<double>(n);
  apps::check_fits_in_memory("--batch-size", std::to_string(o.batch_size),
                             static_cast<double>(o.batch_size) * example_numel * sizeof(float),
                             "one batch of f32 examples");
  // Whole batches only (drop_last): a batch larger than the set would leave every epoch empty.
  check_batch_fits_dataset(o.batch_size, d.dataset->size(), "--batch-size", "training set");
}

Device resolve_device(const std::string& spec) {
  const Device d = parse_device(spec);
  if (d.is_cuda()) {
    if (!cuda::is_available()) {
      throw Error("--device " + spec + ": " + cuda::unavailable_reason(), ErrorKind::Usage);
    }
    cuda::check_device(d.index);
  }
  return d;
}

using apps::CsvOut;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

LoaderOptions loader_options(const Options& o, int workers, const Data& d, Device device) {
  LoaderOptions lo;
  lo.batch_size = o.batch_size;
  lo.workers = workers;
  lo.prefetch = o.prefetch;
  lo.pin_memory = o.pin_memory;
  lo.device = device;
  lo.drop_last = true;  // every timed batch has batch_size images
  lo.seed = o.seed;
  lo.transform = d.transform;
  return lo;
}

// A mode's rows: to --csv as they are measured, and into `json` for --json (the same fields,
// named by the CSV header; numbers as numbers, "" as null).
class Rows {
 public:
  Rows(const Options& o, const std::string& header, nlohmann::json& json)
      : csv_(o.csv, o.append, header), json_(json) {
    std::stringstream names(header);
    for (std::string name; std::getline(names, name, ',');) names_.push_back(name);
  }
  void row(const std::string& line) {
    csv_.row(line);
    nlohmann::json r = nlohmann::json::object();
    std::stringstream fields(line);
    std::string field;
    for (size_t i = 0; i < names_.size(); ++i) {
      if (!std::getline(fields, field, ',')) field.clear();
      char* end = nullptr;
      const double v = std::strtod(field.c_str(), &end);
      if (field.empty()) r[names_[i]] = nullptr;
      else if (*end == '\0') r[names_[i]] = v;
      else r[names_[i]] = field;
    }
    json_.push_back(r);
  }

 private:
  CsvOut csv_;
  std::vector<std::string> names_;
  nlohmann::json& json_;
};

// ---- mode throughput ----------------------------------------------------------------------

int run_throughput(const Options& o, nlohmann::json& rows) {
  const Data d = open_data(o);
  check_batch_fits(o, d);
  const std::vector<int> counts = o.workers.empty() ? std::vector<int>{0, 1, 2, 4, 8} : o.workers;
  const bool simulated = cuda::kSimulated && o.pin_memory;  // pinned staging is the CUDA path
  const char* tag = simulated ? "  SIMULATED" : "";
  Rows csv(o, "dataset,workers,prefetch,pin_memory,batch_size,images_per_sec,seconds", rows);
  std::printf("loader_bench throughput: %s\n", d.dataset->describe().c_str());
  std::printf("batch %lld, prefetch %d, pin_memory %s, %d warm-up batches, median of %d windows "
              "of %d batches, %d cores%s\n",
              static_cast<long long>(o.batch_size), o.prefetch, o.pin_memory ? "on" : "off",
              o.warmup_batches, o.repeats, o.batches, hardware_threads(), tag);
  std::printf("%-12s %7s %14s %9s %9s%s\n", "dataset", "workers", "images/s", "seconds",
              "vs w=0", tag);
  double base = 0;
  for (const int workers : counts) {
    Loader loader(*d.dataset, std::make_shared<RandomSampler>(d.dataset->size(), o.seed),
                  loader_options(o, workers, d, Device()));
    int64_t epoch = 0;
    loader.start_epoch(epoch);
    Batch b;
    auto next = [&]() -> int64_t {
      while (!loader.next(b)) loader.start_epoch(++epoch);
      return b.inputs.size(0);
    };
    for (int i = 0; i < o.warmup_batches; ++i) next();
    // --repeats windows of --batches batches, back to back: the median window is reported
    // (one short window is at the mercy of whatever else the machine runs).
    std::vector<double> rates, windows;
    for (int rep = 0; rep < o.repeats; ++rep) {
      int64_t images = 0;
      const auto start = Clock::now();
      for (int i = 0; i < o.batches; ++i) images += next();
      windows.push_back(seconds_since(start));
      rates.push_back(static_cast<double>(images) / windows.back());
    }
    const double ips = apps::median(rates);
    const double secs = apps::median(windows);
    if (workers == counts.front()) base = ips;
    std::printf("%-12s %7d %14.0f %9.3f %8.2fx%s\n", o.dataset.c_str(), workers, ips, secs,
                ips / base, tag);
    std::fflush(stdout);
    csv.row(o.dataset + "," + std::to_string(workers) + "," + std::to_string(o.prefetch) + "," +
            (o.pin_memory ? "1" : "0") + "," + std::to_string(o.batch_size) + "," +
            fmt("%.1f", ips) + "," + fmt("%.4f", secs));
  }
  return 0;
}

// ---- mode train ---------------------------------------------------------------------------

struct TrainResult {
  double median_step_ms = 0, images_per_sec = 0, wait_fraction = 0, seconds = 0;
  double idle_fraction = -1;  // -1: not measured (CPU)
  double first_loss = 0, final_loss = 0;
};

#if KILN_WITH_CUDA
// GPU busy and span from the per-step event pairs (all recorded on the compute stream).
double device_idle_fraction(const std::vector<cuda::Event>& starts,
                            const std::vector<cuda::Event>& ends) {
  if (starts.empty()) return -1;
  ends.back().synchronize();
  double busy = 0;
  for (size_t i = 0; i < starts.size(); ++i) busy += starts[i].elapsed_ms(ends[i]);
  const double span = starts.front().elapsed_ms(ends.back());
  return span > 0 ? std::max(0.0, 1.0 - busy / span) : 0.0;
}
#endif

TrainResult train_run(const Options& o, const Data& d, int workers, Device device) {
  manual_seed(o.seed);  // the same initial model for every worker count
  std::shared_ptr<Sequential> model = make_mnist_cnn();
  model->to(device);
  model->train();
  Adadelta opt(model->parameters(), /*lr=*/1.0);
  // On a GPU the loader stages batches in pinned memory and copies them on its copy stream.
  Loader loader(*d.dataset, std::make_shared<RandomSampler>(d.dataset->size(), o.seed),
                loader_options(o, workers, d, device.is_cuda() ? device : Device()));
  int64_t epoch = 0;
  loader.start_epoch(epoch);

#if KILN_WITH_CUDA
  const bool cuda_events = device.is_cuda();
  std::vector<cuda::Event> starts, ends;
  if (cuda_events) {
    starts.reserve(o.steps);
    ends.reserve(o.steps);
  }
#endif
  // Reading a loss waits for the device: on a GPU only every 32 steps (as mnist_train does).
  const int read_every = device.is_cuda() ? 32 : 1;
  std::vector<Tensor> pending;
  std::vector<double> losses, step_seconds;
  double wait = 0;
  Clock::time_point start;
  Batch b;
  for (int step = 0; step < o.warmup_steps + o.steps; ++step) {
    const bool timed = step >= o.warmup_steps;
    if (step == o.warmup_steps) {
#if KILN_WITH_CUDA
      if (cuda_events) {
        cuda::DeviceGuard guard(device.index);
        cuda::synchronize();
      }
#endif
      start = Clock::now();
    }
    const auto t0 = Clock::now();
    while (!loader.next(b)) loader.start_epoch(++epoch);
    const auto t1 = Clock::now();
    Tensor x = b.inputs.device() == device ? b.inputs : b.inputs.to(device);
    Tensor y = b.labels.device() == device ? b.labels : b.labels.to(device);
#if KILN_WITH_CUDA
    if (cuda_events && timed) {
      cuda::DeviceGuard guard(device.index);
      starts.emplace_back(cuda::EventTiming::On);
      starts.back().record();
    }
#endif
    Tensor loss = cross_entropy((*model)(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
#if KILN_WITH_CUDA
    if (cuda_events && timed) {
      cuda::DeviceGuard guard(device.index);
      ends.emplace_back(cuda::EventTiming::On);
      ends.back().record();
    }
#endif
    pending.push_back(loss.detach());
    if (static_cast<int>(pending.size()) >= read_every || step + 1 == o.warmup_steps + o.steps) {
      for (const Tensor& l : pending) losses.push_back(l.item());
      pending.clear();
    }
    if (timed) {
      wait += std::chrono::duration<double>(t1 - t0).count();
      step_seconds.push_back(seconds_since(t0));
    }
  }
  TrainResult r;
  r.seconds = seconds_since(start);  // the last loss was read: the device has finished
  r.median_step_ms = 1e3 * apps::median(step_seconds);
  r.images_per_sec = static_cast<double>(o.steps * o.batch_size) / r.seconds;
  r.wait_fraction = wait / r.seconds;
  r.first_loss = losses.front();
  r.final_loss = losses.back();
  KILN_CHECK(std::isfinite(r.final_loss), "training diverged: the loss is ", r.final_loss);
#if KILN_WITH_CUDA
  if (cuda_events) {
    cuda::DeviceGuard guard(device.index);
    r.idle_fraction = device_idle_fraction(starts, ends);
  }
#endif
  return r;
}

int run_train(const Options& o, nlohmann::json& rows) {
  const Device device = resolve_device(o.device);
  set_num_threads(o.threads);
  const Data d = open_data(o);
  check_batch_fits(o, d);
  const std::vector<int> counts = o.workers.empty() ? std::vector<int>{0, 2} : o.workers;
  const bool pinned = o.pin_memory || device.is_cuda();  // the Loader pins for a CUDA target
  const bool simulated = cuda::kSimulated && pinned;
  const char* tag = simulated ? "  SIMULATED" : "";
  Rows csv(o,
           "dataset,workers,prefetch,pin_memory,batch_size,threads,steps,extra_decode_us,device,"
           "simulated,median_step_ms,images_per_sec,loader_wait_fraction,device_idle_fraction,"
           "seconds,final_loss",
           rows);
  std::printf("loader_bench train: MNIST CNN, Adadelta lr 1.0, batch %lld, %d warm-up + %d timed "
              "steps, %d compute threads, %s, pin_memory %s%s\n",
              static_cast<long long>(o.batch_size), o.warmup_steps, o.steps, o.threads,
              device.str().c_str(), pinned ? "on" : "off", tag);
  std::printf("data: %s\n", d.dataset->describe().c_str());
  std::printf("%7s %8s %13s %10s %12s %12s %15s%s\n", "workers", "prefetch", "median step ms",
              "images/s", "loader wait", "device idle", "loss first/last", tag);
  for (const int workers : counts) {
    const TrainResult r = train_run(o, d, workers, device);
    const std::string idle = r.idle_fraction < 0 ? "-" : fmt("%.1f%%", 100 * r.idle_fraction);
    std::printf("%7d %8d %13.1f %10.0f %11.1f%% %12s %7.3f/%.3f%s\n", workers, o.prefetch,
                r.median_step_ms, r.images_per_sec, 100 * r.wait_fraction, idle.c_str(),
                r.first_loss, r.final_loss, tag);
    std::fflush(stdout);
    csv.row(o.dataset + "," + std::to_string(workers) + "," + std::to_string(o.prefetch) + "," +
            (pinned ? "1" : "0") + "," + std::to_string(o.batch_size) + "," +
            std::to_string(o.threads) + "," + std::to_string(o.steps) + "," +
            std::to_string(o.extra_decode_us) + "," + device.str() + "," + (simulated ? "1" : "0") +
            "," + fmt("%.3f", r.median_step_ms) + "," + fmt("%.1f", r.images_per_sec) + "," +
            fmt("%.5f", r.wait_fraction) + "," +
            (r.idle_fraction < 0 ? std::string() : fmt("%.5f", r.idle_fraction)) + "," +
            fmt("%.4f", r.seconds) + "," + fmt("%.5f", r.final_loss));
  }
  return 0;
}

// ---- mode h2d -----------------------------------------------------------------------------

int run_h2d(const Options& o, nlohmann::json& rows) {
  apps::check_fits_in_memory("--h2d-max-mb", std::to_string(o.h2d_max_mb),
                             2.0 * o.h2d_max_mb * (1 << 20), "a pageable and a pinned copy");
  const Device device = resolve_device(o.device);
  if (!device.is_cuda()) {
    throw Error("--mode h2d measures host-to-device copies: pass --device cuda[:N]",
                ErrorKind::Usage);
  }
#if KILN_WITH_CUDA
  const char* tag = cuda::kSimulated ? "  SIMULATED" : "";
  Rows csv(o, "size_mb,pageable_gb_per_s,pinned_gb_per_s,ratio,simulated", rows);
  cuda::DeviceGuard guard(device.index);
  std::printf("loader_bench h2d: Tensor::to(%s) from pageable vs pinned host memory, median of "
              "%d, GPU time (events)%s\n",
              device.str().c_str(), o.reps, tag);
  std::printf("%8s %14s %14s %8s%s\n", "MB", "pageable GB/s", "pinned GB/s", "ratio", tag);
  for (int mb = 1; mb <= o.h2d_max_mb; mb *= 2) {
    const int64_t bytes = static_cast<int64_t>(mb) << 20;
    Tensor pageable = Tensor::empty({bytes / 4});
    pageable.fill_(1.0);
    const Tensor pinned = pageable.pin_memory();
    double gbs[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const Tensor& src = k == 0 ? pageable : pinned;
      const bool non_blocking = k == 1;
      std::vector<double> ms;
      for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms the caching allocator up
        cuda::Event begin(cuda::EventTiming::On), end(cuda::EventTiming::On);
        begin.record();
        Tensor dst = src.to(device, non_blocking);
        end.record();
        end.synchronize();
        if (rep > 0) ms.push_back(begin.elapsed_ms(end));
      }
      gbs[k] = static_cast<double>(bytes) / (apps::median(ms) * 1e6);
    }
    std::printf("%8d %14.2f %14.2f %7.2fx%s\n", mb, gbs[0], gbs[1], gbs[1] / gbs[0], tag);
    std::fflush(stdout);
    csv.row(std::to_string(mb) + "," + fmt("%.3f", gbs[0]) + "," + fmt("%.3f", gbs[1]) + "," +
            fmt("%.3f", gbs[1] / gbs[0]) + "," + (cuda::kSimulated ? "1" : "0"));
  }
  return 0;
#else
  (void)o;
  (void)rows;
  return 0;  // unreachable: resolve_device has thrown (no CUDA backend)
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loader benchmarks: throughput of the loader alone, the training "
               "experiment (workers 0 vs N), host-to-device bandwidth"};
  Options o;
  o.threads = hardware_threads();
  app.add_option("--mode", o.mode, "throughput | train | h2d")
      ->check(apps::one_of({"throughput", "train", "h2d"}))->capture_default_str();
  app.add_option("--format", o.dataset, "idx (the four MNIST files) | imagefolder | synthetic "
                 "(default: idx; train: imagefolder)")
      ->check(apps::one_of({"idx", "imagefolder", "synthetic"}));
  app.add_option("--data", o.data, "data directory (default: datasets/mnist for idx, "
                 "datasets/mnist_png for imagefolder; DIR/train is used when it exists)");
  app.add_option("--workers", o.workers, "worker counts, comma-separated (default: throughput "
                 "0,1,2,4,8; train 0,2)")->delimiter(',')->check(apps::at_least(0));
  app.add_option("--prefetch", o.prefetch, "loader queue depth (batches ready ahead)")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_flag("--pin-memory", o.pin_memory, "stage batches in pinned host memory (CUDA builds)");
  app.add_option("--batch-size", o.batch_size, "images per batch")
      ->check(apps::at_least(int64_t{1}))->capture_default_str();
  app.add_option("--batches", o.batches, "throughput: timed batches per worker count")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_option("--warmup-batches", o.warmup_batches, "throughput: untimed batches first")
      ->check(apps::at_least(0))->capture_default_str();
  app.add_option("--repeats", o.repeats, "throughput: timed windows of --batches per worker "
                 "count; the median is reported")->check(apps::at_least(1))->capture_default_str();
  app.add_option("--steps", o.steps, "train: timed training steps per worker count")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "train: untimed steps first")
      ->check(apps::at_least(0))->capture_default_str();
  app.add_option("--extra-decode-us", o.extra_decode_us, "busy CPU microseconds added to each "
                 "image's decode (emulates heavier JPEGs)")
      ->check(apps::at_least(int64_t{0}))->capture_default_str();
  app.add_option("--device", o.device, "train/h2d: cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--threads", o.threads, "train: compute threads (OpenMP/BLAS)")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_option("--seed", o.seed, "sampler, transforms and model initialisation")
      ->check(apps::any_unsigned<uint64_t>())->capture_default_str();
  app.add_option("--shape", o.shape, "synthetic: example shape C,H,W")->capture_default_str();
  app.add_option("--synthetic-size", o.synthetic_size, "synthetic: number of examples")
      ->check(apps::at_least(int64_t{1}))->capture_default_str();
  app.add_option("--h2d-max-mb", o.h2d_max_mb, "h2d: largest size in MB (1, 2, 4, ... up to it)")
      ->check(apps::in_range(1, 1 << 20))->capture_default_str();
  app.add_option("--reps", o.reps, "h2d: timed copies per size and kind")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_option("--csv", o.csv, "write the results as CSV here");
  app.add_flag("--append", o.append, "append rows to --csv instead of overwriting it");
  app.add_option("--json", o.json, "also write the rows as JSON here (when the mode has finished)");
  // --format is mnist_train's name; --dataset mnist-idx was this app's (apps/common/flag_names.h).
  if (const std::optional<int> rc =
          apps::parse_flags(app, argc, argv, "loader_bench",
                            {apps::renamed_flag("--dataset", "--format"),
                             apps::renamed_value("--format", "mnist-idx", "idx")})) {
    return *rc;
  }
  if (app.count("--format") == 0 && o.mode == "train") o.dataset = "imagefolder";

  try {
    KILN_CHECK_INPUT(!o.append || !o.csv.empty(), "--append adds rows to the --csv file: give "
                     "--csv FILE, or drop --append");
    // The CSV must not replace a device, a directory or the data it measures.
    std::vector<apps::InputPath> inputs;
    const std::string idx_dir = o.data.empty() ? apps::in_source_tree("datasets/mnist") : o.data;
    for (MnistSplit split : {MnistSplit::Train, MnistSplit::Test}) {
      for (const std::string& name :
           {MnistDataset::images_file_name(split), MnistDataset::labels_file_name(split)}) {
        inputs.push_back({"--data", (std::filesystem::path(idx_dir) / name).string()});
      }
    }
    apps::check_output_paths({{"--csv", o.csv}, {"--json", o.json}}, inputs);
    nlohmann::json rows = nlohmann::json::array();
    const int rc = o.mode == "throughput" ? run_throughput(o, rows)
                   : o.mode == "train"    ? run_train(o, rows)
                                          : run_h2d(o, rows);
    if (!o.json.empty()) {
      const nlohmann::json j = {{"app", "loader_bench"}, {"mode", o.mode}, {"rows", rows}};
      write_output_file("--json", o.json, j.dump(2) + "\n");
    }
    return rc;
  } catch (const OutOfMemory& e) {
    // The loader's batches (and in h2d mode the copied buffers) are sized by the flags.
    const Error sized = apps::size_error(
        e, o.mode == "h2d" ? "--h2d-max-mb " + std::to_string(o.h2d_max_mb)
                           : "--batch-size " + std::to_string(o.batch_size) + " and --prefetch " +
                                 std::to_string(o.prefetch));
    std::fprintf(stderr, "loader_bench: error: %s\n", sized.what());
    return sized.exit_code();
  } catch (const Error& e) {
    std::fprintf(stderr, "loader_bench: error: %s\n", e.what());
    return e.exit_code();
  }
}
